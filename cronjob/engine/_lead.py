"""How far ahead of an instant a replica sends its claim, so that rounds start on it.

A claim is a round trip to the database, and at scale thousands of rows: sent at the
instant, every round it wins starts that long after the instant. The dispatcher sends
the claim of a scheduled instant `ClaimLead.seconds` ahead of it instead (the time
its recent claims took, from the wake that sent them to their answer, with a margin) and
holds the rounds it won until the instant comes. No round starts before its instant;
only the lease is taken that much earlier.

Measured on the scheduler's clock: a fake clock does not move while a claim runs (its
``advance`` waits for the claim), so there the lead stays 0 unless a test makes claims
take fake time.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DECAY", "LEAD_MAX", "MARGIN", "ClaimLead"]

#: The lead is this many times what recent claims took (timer and thread wake-ups vary).
MARGIN: Final = 1.25
#: The most a claim goes out ahead of its instant, in seconds: far below the database's
#: own bound on claims ahead (``lease.CLAIM_AHEAD_LIMIT``, 5 s).
LEAD_MAX: Final = 0.5
#: What a slow claim still counts for at each later one: a spike fades over ~20 claims.
DECAY: Final = 0.9


class ClaimLead:
    """The recent claims' duration, as a decaying maximum: one slow claim raises the lead
    at once; it then falls back by `DECAY` per claim while claims are fast again.

    Not thread-safe: the dispatcher thread owns it.
    """

    def __init__(self) -> None:
        self._recent = 0.0

    @property
    def seconds(self) -> float:
        """How many seconds ahead of an instant to send its claim (0 to `LEAD_MAX`)."""
        return min(LEAD_MAX, self._recent * MARGIN)

    def took(self, seconds: float) -> None:
        """A claim of a scheduled instant answered ``seconds`` after the wake that sent it.

        A claim slower than the lead could ever cover (the database stalled) counts as
        just that slow: it must not keep the lead at its bound for long after.
        """
        if seconds < 0:
            raise ValueError(f"a claim takes 0 seconds or more, not {seconds!r}")
        self._recent = max(min(seconds, LEAD_MAX / MARGIN), self._recent * DECAY)
