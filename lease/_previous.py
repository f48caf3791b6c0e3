"""What a claim tells of the round before it on the row it took: the unfinished round it
gave up (`previous_round`), and how long the lease was held before it (`ended_round`).
A part of [LeaseStore.claim_batch][lease.LeaseStore.claim_batch] and
[LeaseStore.claim_reruns][lease.LeaseStore.claim_reruns]."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ._core import _t, logger
from ._rows import _UNFINISHED, _from_seconds, _is_int, _ms_or_none

__all__ = ["ended_round", "gave_up", "held_before", "prev_start", "previous_round"]


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
    prev_instant: object, prev_state: object, prev_start: object, last_end: object
) -> tuple[datetime, datetime] | None:
    """How long the lease was held before a claim, as ``(held_from, ended)``: ``None``
    when the row does not say (a start or an end not copied: an older release's claim or
    row; or malformed).

    - The round before it had ended: from when it held the lease (its instant, or when
      its claim took the lease if later: a second run or a catch-up claimed late;
      ``prev_start_ms``, copied by the claim) to its end.
    - It never ran to its end (``running``: its replica died; ``cut``: cut short, or
      handed back unrun): such a round is on record as having recorded nothing, and the
      instants its own claim owed are on no record but the row's. The claims that
      replace such rounds keep ``prev_start_ms`` as it was (see `prev_start`), so
      it still says when the round before all of them took the lease; the hold is
      counted from then, to the row's last end (that round's end, or the give-back of
      the latest round handed back since)."""
    started, ended = _ms_or_none(prev_start), _ms_or_none(last_end)
    if not (_is_int(prev_instant) and prev_instant >= 0) or started is None or ended is None:
        return None
    if prev_state in _UNFINISHED:
        return started, ended
    return max(_from_seconds(prev_instant), started), ended


def prev_start() -> sa.ColumnElement[Any]:
    """What a first run's claim writes in ``prev_start_ms``: when the round it replaces
    took the lease (``last_start_ms``); but when that round never ran to its end (state
    ``running``: its replica died; ``cut``: cut short, or handed back unrun), the value
    the row had, if any: when the round before it took the lease.

    The rule: such a round is on record as having recorded nothing, so what its own
    claim owed (the instants a round before it kept from every claim: a round it gave
    up, or one that ran past them) is on no record but the row's; the row keeps where
    the lease's unbroken hold began, through every round that never ran to its end, and
    the claim after them reads it back (`ended_round`): a hand-off's round owes the
    instants from there (``cronjob.engine._owed``)."""
    return sa.case(
        (_t.c.state.in_(_UNFINISHED), sa.func.coalesce(_t.c.prev_start_ms, _t.c.last_start_ms)),
        else_=_t.c.last_start_ms,
    )


def held_before(
    rows: Iterable[Sequence[Any]], rerun: datetime | None = None
) -> dict[str, tuple[datetime, datetime]]:
    """How long the lease was held before the claim, by name, from its rows (name,
    prev_instant, prev_state, prev_attempt, prev_start_ms, last_end_ms), where the row
    says (see `ended_round`). For the second runs of ``rerun``, where it says nothing of
    the rounds before: from that instant to the row's last end (the first run's
    give-back; older than the instant if that run died, and then nothing is kept)."""
    found: dict[str, tuple[datetime, datetime]] = {}
    for row in rows:
        held = ended_round(row[1], row[2], row[4], row[5])
        end = _ms_or_none(row[5])
        if held is None and rerun is not None and end is not None:
            held = rerun, end
        if held is not None:
            found[row[0]] = held
    return found
