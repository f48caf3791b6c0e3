"""A backfill: instants of the past run again under a name's lease, one at a time, oldest
first, as requests in ``cronjob_trigger`` that the replicas take (see `lease.Triggers`).

Each instant is one row, ``forced`` `BACKFILL_MARK`, state ``queued`` until a holder takes
it: a release without backfills reads only its open states (pending, running, cut) and
never sees one. A queued instant never expires; the history's prune removes it with the
requests of its age.

The rule a holder takes an instant by ([Backfills.take][lease.Backfills.take]), in one
transaction, so that an instant never runs twice, nor while another round of the name
runs:

- it is **on record** (closed, outcome ``'on record'``, not run) when the history has a
  round of that instant that ran (any outcome but ``'cut short'`` and ``'retrying'``,
  an attempt that is not its round's end), or the lease row's latest claim is that very
  instant (the schedule claimed it: its round ran, runs, or is re-run by the sweep);
- it **waits** (stays queued) while the lease is held, the name is paused, or the
  schedule may still claim it: the lease row's latest claim is earlier than it and the
  caller does not say it ``passed`` (a later instant came, a grace ago: no claim takes
  an instant once a later one is due — the catch-up takes the latest only). Claims only
  move forward, so once the row's claim is past an instant nothing but a backfill runs
  it;
- else the lease is claimed as a manual round claims it (a fresh token, the row's
  ``instant``, ``attempt``, ``state`` and ``prev_*`` left as they were: the schedule never
  moves for it) and the request runs, ``why`` ``'backfill'`` in the history.

A **cancelled** backfill ([Backfills.cancel][lease.Backfills.cancel]) has its queued
instants closed (state ``refused``, outcome `CANCELLED`): no replica takes them; the round
in flight ends as ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import sqlalchemy as sa

from ._exceptions import translate_errors
from ._schema import lease_table, round_table, trigger_table
from ._store import LeaseStore, _new_token
from ._tally import NOT_SCHEDULED
from ._text import check_holder
from ._trigger import BACKFILL_MARK, TriggerRow, TriggerState

__all__ = ["CANCELLED", "NOT_RUN_OUTCOMES", "BackfillCancellation", "Backfills"]

_t = lease_table
_q = trigger_table
_h = round_table

#: The outcomes of a history row that is not its instant's end: the instant is still
#: owed a round (a round cut short runs again; an attempt retrying is followed by another).
NOT_RUN_OUTCOMES: Final = ("cut short", "retrying")


#: The outcome of a backfill's instant closed by a cancellation (state ``refused``).
CANCELLED: Final = "cancelled"

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillCancellation:
    """A backfill's cancellation, as on record."""

    #: When, on the lease clock.
    at: datetime
    #: Who asked.
    by: str
    #: How many instants it closed.
    instants: int


def _epoch(at: datetime) -> int:
    return int(at.timestamp())


class Backfills:
    """The statements of a backfill, on ``store``'s engine and lease clock."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def owed(self, name: str, instants: Sequence[datetime]) -> list[datetime]:
        """Of ``instants`` (ascending), those with no round on record and no backfill of
        theirs open (queued or running): what a backfill asked now would run. Two
        statements, over the range's history only."""
        if not instants:
            return []
        low, high = _epoch(instants[0]), _epoch(instants[-1])
        ran = (
            sa.select(_h.c.instant)
            .where(
                _h.c.name == name,
                _h.c.instant >= low,
                _h.c.instant <= high,
                _h.c.why.not_in(NOT_SCHEDULED),
                _h.c.outcome.not_in(NOT_RUN_OUTCOMES),
            )
            .distinct()
        )
        queued = sa.select(_q.c.instant).where(
            _q.c.name == name,
            _q.c.forced == BACKFILL_MARK,
            _q.c.state.in_((TriggerState.QUEUED.value, TriggerState.RUNNING.value)),
            _q.c.instant >= low,
            _q.c.instant <= high,
        )
        with (
            translate_errors("read a backfill's range"),
            self._store._transaction(read=True) as conn,
        ):
            taken = {int(i) for i in conn.execute(ran).scalars()}
            taken |= {int(i) for i in conn.execute(queued).scalars()}
        return [at for at in instants if _epoch(at) not in taken]

    def queue(
        self, name: str, instants: Sequence[datetime], *, by: str, now_ms: int | None = None
    ) -> list[int]:
        """Queue ``instants`` of ``name`` for backfill, one request each, in one
        transaction. Returns the requests' ids, in order. Tells this process's watchers."""
        check_holder(by)
        if not instants:
            return []
        store = self._store
        now = store.now_ms() if now_ms is None else now_ms
        rows = [
            {
                "name": name,
                "requested_ms": now,
                "requested_by": by,
                "forced": BACKFILL_MARK,
                "instant": _epoch(at),
                "state": TriggerState.QUEUED.value,
                "attempt": 0,
            }
            for at in instants
        ]
        with translate_errors("queue a backfill"), store._transaction() as conn:
            conn.execute(_q.insert(), rows)
            found = conn.execute(
                sa.select(_q.c.id)
                .where(
                    _q.c.name == name,
                    _q.c.forced == BACKFILL_MARK,
                    _q.c.requested_ms == now,
                    _q.c.instant.in_([row["instant"] for row in rows]),
                )
                .order_by(_q.c.instant)
            )
            ids = [int(i) for i in found.scalars()]
        store._requested(name)
        return ids

    def take(self, request: TriggerRow, holder: str, *, passed: bool = False) -> int | None:
        """Take the backfill instant ``request`` to run it on ``holder`` (see the module
        docstring; ``passed``: the name's next instant after it is due, a grace ago): its
        round's token, or ``None`` when it is not run now (it waits, or it was on record
        and is closed, or another holder took it)."""
        check_holder(holder)
        assert request.instant is not None and request.backfill
        store = self._store
        instant = _epoch(request.instant)
        token = _new_token()
        now_ms = store._clock_ms()
        now = store._now(now_ms)
        ran = sa.exists().where(
            _h.c.name == request.name,
            _h.c.instant == instant,
            _h.c.why.not_in(NOT_SCHEDULED),
            _h.c.outcome.not_in(NOT_RUN_OUTCOMES),
        )
        with translate_errors("take a backfill's instant"), store._transaction() as conn:
            mine = conn.execute(
                _q.update()
                .where(
                    _q.c.id == request.id,
                    _q.c.state == TriggerState.QUEUED.value,
                    _q.c.attempt == request.attempt,
                )
                .values(
                    state=TriggerState.RUNNING.value,
                    attempt=request.attempt + 1,
                    holder=holder,
                    token=token,
                    started_ms=now,
                    ended_ms=None,
                )
            )
            if mine.rowcount != 1:
                return None  # another holder took it, or it changed meanwhile
            row = conn.execute(sa.select(_t.c.instant).where(_t.c.name == request.name)).first()
            on_record = conn.execute(sa.select(ran)).scalar() or (
                row is not None and int(row[0]) == instant
            )
            if on_record:
                conn.execute(
                    _q.update()
                    .where(_q.c.id == request.id)
                    .values(state=TriggerState.DONE.value, outcome="on record", ended_ms=now)
                )
                return None
            free = sa.or_(_t.c.expires_ms.is_(None), _t.c.expires_ms <= now)
            allowed = [_t.c.name == request.name, free, _t.c.paused_ms.is_(None)]
            if not passed:
                allowed.append(_t.c.instant > instant)  # past it: the schedule never claims it
            claim = (
                _t.update()
                .where(*allowed)
                .values(
                    token=token,
                    holder=holder,
                    expires_ms=now + store._ttl_ms,
                    last_start_ms=now,
                )
            )
            if conn.execute(claim).rowcount != 1:
                # It waits: back in the queue as it was.
                conn.execute(
                    _q.update()
                    .where(_q.c.id == request.id)
                    .values(
                        state=TriggerState.QUEUED.value,
                        attempt=request.attempt,
                        holder=request.holder,
                        token=request.token,
                        started_ms=None,
                    )
                )
                return None
        store._held([(request.name, token)], now_ms)
        return token

    def cancel(self, name: str, *, by: str, now_ms: int | None = None) -> list[datetime]:
        """Cancel the backfill of ``name``: close each of its instants still queued, state
        ``refused``, outcome `CANCELLED`, the error saying who (``cancelled by BY``), in
        one transaction. The instant whose round is in flight (running, or cut short and
        owed its second run, queued again for it or not) is left to end under the usual
        rules: one at a time, it is the only one. A take racing it either took its instant
        first (then it is that round) or finds it closed. Returns the instants cancelled,
        oldest first."""
        check_holder(by)
        store = self._store
        now = store.now_ms() if now_ms is None else now_ms
        queued = sa.and_(
            _q.c.name == name,
            _q.c.forced == BACKFILL_MARK,
            _q.c.state == TriggerState.QUEUED.value,
            _q.c.attempt == 0,  # never taken: one queued again after a cut is owed its run
        )
        with translate_errors("cancel a backfill"), store._transaction() as conn:
            found = conn.execute(sa.select(_q.c.id, _q.c.instant).where(queued)).all()
            ids = [int(row.id) for row in found]
            if ids:
                conn.execute(
                    _q.update()
                    .where(queued, _q.c.id.in_(ids))
                    .values(
                        state=TriggerState.REFUSED.value,
                        outcome=CANCELLED,
                        error=f"cancelled by {by}",
                        ended_ms=now,
                    )
                )
        return sorted(_EPOCH + timedelta(seconds=int(row.instant)) for row in found)

    def cancelled(self, *, since_ms: int) -> dict[str, BackfillCancellation]:
        """Per name, the latest backfill cancellation at or after ``since_ms``: when, by
        whom, how many instants it closed. One statement (on the index of ``state``)."""
        stmt = (
            sa.select(_q.c.name, _q.c.ended_ms, _q.c.error, sa.func.count())
            .where(
                _q.c.state == TriggerState.REFUSED.value,
                _q.c.forced == BACKFILL_MARK,
                _q.c.outcome == CANCELLED,
                _q.c.ended_ms >= since_ms,
            )
            .group_by(_q.c.name, _q.c.ended_ms, _q.c.error)
        )
        found: dict[str, BackfillCancellation] = {}
        with (
            translate_errors("read the backfills cancelled"),
            self._store._transaction(read=True) as conn,
        ):
            for name, ended_ms, error, count in conn.execute(stmt):
                at = _EPOCH + int(ended_ms) * _MS
                if name in found and found[name].at >= at:
                    continue
                by = (error or "").removeprefix("cancelled by ")
                found[name] = BackfillCancellation(at=at, by=by, instants=int(count))
        return found

    def requeue(self, request: TriggerRow) -> bool:
        """Put back in the queue a backfill instant whose first round was cut short, or
        died with its holder (running, its lease free): taken again as attempt 2.
        Returns whether it was."""
        stmt = (
            _q.update()
            .where(
                _q.c.id == request.id,
                _q.c.state.in_((TriggerState.RUNNING.value, TriggerState.CUT.value)),
                _q.c.token == request.token,
            )
            .values(state=TriggerState.QUEUED.value, outcome="cut short")
        )
        with translate_errors("requeue a backfill's instant"), self._store._transaction() as conn:
            return bool(conn.execute(stmt).rowcount)
