"""The summary line: how many rounds started and ended, logged at INFO once a period.

A round's own start and success lines are at DEBUG (at 10,000 jobs they were thousands
of lines a second, and the largest cost of a round); its failure, cut and second-run
lines keep their levels. The summary says at INFO what the DEBUG lines would have, in
one line a period. It is counted and logged by the dispatcher thread only.
"""

from __future__ import annotations

import logging

from .._round import Outcome

__all__ = ["SUMMARY_PERIOD", "RoundSummary"]

log = logging.getLogger("cronjob")

#: Seconds (monotonic) between two summary lines, at most one per period with rounds.
SUMMARY_PERIOD = 60.0


class RoundSummary:
    """Counts the rounds started and ended; logs them once `SUMMARY_PERIOD` passed.

    Args:
        since: The monotonic time the count starts from.
    """

    __slots__ = ("_cut", "_ended", "_failed", "_since", "_started")

    def __init__(self, since: float) -> None:
        self._since = since
        self._started = self._ended = self._failed = self._cut = 0

    def started(self) -> None:
        """Count a round that started."""
        self._started += 1

    def ended(self, outcome: Outcome | None, mono: float) -> None:
        """Count a round that ended (``outcome`` ``None``: it never ran); log the summary
        if the period is over."""
        self._ended += 1
        if outcome is Outcome.FAILED:
            self._failed += 1
        elif outcome is Outcome.CUT_SHORT:
            self._cut += 1
        if mono - self._since >= SUMMARY_PERIOD:
            self.flush(mono)

    def flush(self, mono: float) -> None:
        """Log what was counted since the last line (if anything), and start again."""
        if self._started or self._ended:
            log.info(
                "rounds in the last %.0f s: %d started, %d ended (%d failed, %d cut short)",
                mono - self._since,
                self._started,
                self._ended,
                self._failed,
                self._cut,
            )
        self._since = mono
        self._started = self._ended = self._failed = self._cut = 0
