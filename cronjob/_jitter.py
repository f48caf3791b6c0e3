"""A job's jitter: the delay of each round, drawn from a hash of (name, instant).

The delay must be the same on every replica and after every restart, so that replicas
claim the instant together and a replica started between the instant and its delayed
start keeps the same start. Python's ``hash()`` of a string is salted per process
(``PYTHONHASHSEED``), so the draw hashes the job's name and the instant (microseconds
since the epoch, UTC) with BLAKE2b instead, and scales its 64 bits to the span in
integers: ``(h * span) >> 64`` is below ``span`` for every ``h < 2**64`` (a float
``h / 2**64`` could round to 1.0 and reach it). The delay is whole milliseconds, as the
lease table and the history keep times: a round's recorded start is its delayed start.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Final

__all__ = ["jitter_delay"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO: Final = timedelta(microseconds=1)
_MILLI: Final = timedelta(milliseconds=1)


def jitter_delay(
    name: str, instant: datetime, jitter: timedelta, next_instant: datetime | None
) -> timedelta:
    """The delay after ``instant`` at which job ``name``'s round starts.

    Args:
        name: The job's name.
        instant: The round's nominal instant (aware).
        jitter: The job's ``jitter``: the delay is below it.
        next_instant: The job's next instant after ``instant`` (``None``: none); the
            delay is below the gap to it too, so the round starts before it.

    Returns:
        A whole number of milliseconds, at least 0, strictly below both bounds (0 when
        either is a millisecond or less).
    """
    span = -(-jitter // _MILLI)  # whole milliseconds, rounded up: the delays stay below
    if next_instant is not None:
        span = min(span, -(-(next_instant - instant) // _MILLI))
    if span <= 0:
        return timedelta(0)
    key = f"{name}\x00{(instant - _EPOCH) // _MICRO}".encode()
    drawn = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    return (drawn * span >> 64) * _MILLI
