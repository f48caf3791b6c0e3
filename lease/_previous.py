"""What a claim tells of the round before it on the row it took: the unfinished round it
gave up (`previous_round`), or the ended round and how long it held the lease
(`ended_round`). A part of [LeaseStore.claim_batch][lease.LeaseStore.claim_batch]."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from ._core import logger
from ._rows import _UNFINISHED, _from_seconds, _is_int, _ms_or_none

__all__ = ["ended_round", "gave_up", "previous_round"]


def previous_round(
    name: str, prev_instant: object, prev_attempt: object
) -> tuple[datetime, int] | None:
    """The unfinished round a claim of ``name`` gave up, as ``(instant, attempt)``;
    ``None`` (logged) when the row held a malformed one."""
    if (
        _is_int(prev_instant)
        and prev_instant >= 0
        and _is_int(prev_attempt)
        and prev_attempt in (1, 2)
    ):
        return _from_seconds(prev_instant), prev_attempt
    logger.warning(
        "lease row %r held a malformed previous round (%r, %r); not reported",
        name,
        prev_instant,
        prev_attempt,
    )
    return None


def gave_up(rows: Iterable[Sequence[object]], epoch: int) -> dict[str, tuple[datetime, int]]:
    """The unfinished rounds the claim of ``epoch`` gave up, by name, from its rows (name,
    prev_instant, prev_state, prev_attempt, …); none where the previous round is ``epoch``
    (an older release's second run wrote it)."""
    found: dict[str, tuple[datetime, int]] = {}
    for row in rows:
        name, prev_instant, prev_state, prev_attempt = row[0], row[1], row[2], row[3]
        if prev_state in _UNFINISHED and prev_instant != epoch:
            previous = previous_round(str(name), prev_instant, prev_attempt)
            if previous is not None:
                found[str(name)] = previous
    return found


def ended_round(
    prev_instant: object, prev_start: object, last_end: object
) -> tuple[datetime, datetime] | None:
    """The round before a claim, when it had ended: from when it held the lease (its
    instant, or when its claim took the lease if later: a second run or a catch-up
    claimed late; ``prev_start_ms``, copied by the claim) to its end, as ``(held_from,
    ended)``; ``None`` when the row does not say (not copied: an older release's claim
    or row; or malformed)."""
    started, ended = _ms_or_none(prev_start), _ms_or_none(last_end)
    if not (_is_int(prev_instant) and prev_instant >= 0) or started is None or ended is None:
        return None
    return max(_from_seconds(prev_instant), started), ended
