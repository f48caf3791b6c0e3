"""Requests for a round now (run-now), and for the catch-up of an instant skipped while
paused: the ``cronjob_trigger`` table (revision 0004) and every statement on it.

A **manual** request asks for one round of a name now. The holder that takes it claims
the name's lease as any round does — a fresh token, ``expires_ms = now + ttl`` — but
leaves the row's ``instant``, ``attempt``, ``state`` and ``prev_*`` as they were: the
schedule, the catch-up rule and the second runs decide exactly as without it. While it
runs, its lease keeps every scheduled claim of the name out (as any round that overruns
an instant). Its end frees the lease and puts its outcome on the lease row and in the
history (``why`` ``'manual'``, ``requested_by``). A manual round cut short is taken again
as attempt 2 unless another round claimed the lease since; cut short again, it is given
up. A request that finds the lease held when it is taken is **refused** (outcome
``'busy'``): a request never queues behind a round, so a request racing a scheduled
instant makes one round, never two.

A **per-instance** request names the replica to run it (``replica``); no lease.

A **catch-up** request (``instant`` set) asks for a scheduled instant skipped while the
name was paused: it is claimed with [LeaseStore.claim][lease.LeaseStore.claim] like any
instant, so it runs at most once and never after a later instant started.

A request not taken within `REQUEST_TTL` seconds expires: it never fires weeks
later when a replica that registers the name finally starts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import RowMapping

from ._exceptions import translate_errors
from ._records import RoundRow, bounded_error, round_values
from ._schema import lease_table, round_table, trigger_table
from ._store import LeaseStore, _new_token
from ._text import check_holder

__all__ = [
    "BACKFILL_MARK",
    "OPEN",
    "REQUEST_TTL",
    "TRIGGER_CHANNEL",
    "TriggerRow",
    "TriggerState",
    "Triggers",
]

#: Seconds a request may wait to be taken before it expires (documented in the README).
REQUEST_TTL: Final = 600.0
#: On PostgreSQL, the channel a request is announced on (``NOTIFY``, with the name as the
#: payload) when its transaction commits, so listening replicas take it at once.
TRIGGER_CHANNEL: Final = "cronjob_trigger"

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)

_t = lease_table
_q = trigger_table
_h = round_table


class TriggerState(enum.StrEnum):
    """Where a request stands."""

    #: Waiting for a replica to take it.
    PENDING = "pending"
    #: Taken: its round runs (or its replica died with it: see the lease).
    RUNNING = "running"
    #: Its first round was cut short: it is taken again as attempt 2.
    CUT = "cut"
    #: Its round ended; ``outcome`` says how.
    DONE = "done"
    #: Not run: the lease was held, or the job paused (``outcome`` says which).
    REFUSED = "refused"
    #: Not taken within `REQUEST_TTL`.
    EXPIRED = "expired"
    #: An instant of a backfill waiting its turn (see `lease.Backfills`): it never
    #: expires, and a release without backfills never reads it (its open states are the
    #: three above).
    QUEUED = "queued"


#: The states of a request that may still run.
OPEN: Final = (
    TriggerState.PENDING.value,
    TriggerState.RUNNING.value,
    TriggerState.CUT.value,
    TriggerState.QUEUED.value,
)
#: The ``forced`` column of a backfill's instant (a request's is 0 or 1).
BACKFILL_MARK: Final = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class TriggerRow:
    """One request, as read."""

    id: int
    name: str
    #: On the lease clock.
    requested: datetime
    requested_by: str
    #: Run even while the name is paused.
    force: bool
    #: The replica asked to run it (a per-instance job); ``None`` for a leased name.
    replica: str | None
    #: The scheduled instant to catch up; ``None`` for a manual round.
    instant: datetime | None
    state: TriggerState
    #: 0 until taken; then the attempt of its latest round.
    attempt: int
    holder: str | None
    token: int | None
    started: datetime | None
    ended: datetime | None
    outcome: str | None
    error: str | None
    #: The name's lease token, whether it is free now, and when it expires (epoch ms on
    #: the lease clock): leased names, read with the request.
    lease_token: int | None = None
    lease_free: bool = False
    lease_expires_ms: int | None = None
    #: An instant of a backfill (`lease.Backfills`): ``instant`` is the instant to run,
    #: under the lease, without moving the schedule.
    backfill: bool = False

    @property
    def open(self) -> bool:
        """It may still run: pending, running or cut."""
        return self.state.value in OPEN


class Triggers:
    """The statements on ``cronjob_trigger``, on ``store``'s engine and lease clock."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def request(
        self,
        name: str,
        *,
        by: str,
        force: bool = False,
        replicas: tuple[str | None, ...] = (None,),
        instant: datetime | None = None,
        now_ms: int | None = None,
    ) -> list[int]:
        """Ask for a round of ``name`` now: one request per entry of ``replicas``
        (``None``: any holder of the lease). Returns the requests' ids, in that order.

        Tells this process's watchers ([LeaseStore.watch][lease.LeaseStore.watch]) after the
        commit, so a scheduler on a fake clock takes it at its next sweep; on PostgreSQL,
        notifies `TRIGGER_CHANNEL` too, so listening replicas take it at once.
        """
        check_holder(by)
        for replica in replicas:
            if replica is not None:
                check_holder(replica)
        store = self._store
        now = store.now_ms() if now_ms is None else now_ms
        values = {
            "name": name,
            "requested_ms": now,
            "requested_by": by,
            "forced": int(force),
            "instant": None if instant is None else int(instant.timestamp()),
            "state": TriggerState.PENDING.value,
            "attempt": 0,
        }
        ids: list[int] = []
        with translate_errors("request a round"), store._transaction() as conn:
            for replica in replicas:
                result = conn.execute(_q.insert().values({**values, "replica": replica}))
                key = result.inserted_primary_key
                assert key is not None
                ids.append(int(key[0]))
            if conn.dialect.name == "postgresql":  # delivered at the commit
                conn.execute(sa.select(sa.func.pg_notify(TRIGGER_CHANNEL, name)))
        store._requested(name)
        return ids

    def read(self, ids: list[int] | None = None, *, name: str | None = None) -> list[TriggerRow]:
        """The requests ``ids`` (or every open one, of ``name`` if given), oldest first,
        each with its name's lease token and whether that lease is free now."""
        store = self._store
        now = store._now()
        free = sa.or_(_t.c.expires_ms.is_(None), _t.c.expires_ms <= now)
        stmt = (
            sa.select(
                _q,
                _t.c.token.label("lease_token"),
                free.label("lease_free"),
                _t.c.expires_ms.label("lease_expires_ms"),
            )
            .select_from(_q.outerjoin(_t, _t.c.name == _q.c.name))
            .order_by(_q.c.id)
        )
        stmt = stmt.where(_q.c.id.in_(ids) if ids is not None else _q.c.state.in_(OPEN))
        if name is not None:
            stmt = stmt.where(_q.c.name == name)
        with translate_errors("read requests"), store._transaction(read=True) as conn:
            rows = conn.execute(stmt).mappings().all()
        return [_row(row) for row in rows]

    def close(self, ids: list[int], *, expired: bool) -> None:
        """Close pending requests ``ids``: ``expired`` (not taken within the ttl; none
        ever runs), or done with outcome ``'claimed'`` (a catch-up, claimed as any
        instant: the claim decides whether it runs)."""
        if not ids:
            return
        state = TriggerState.EXPIRED if expired else TriggerState.DONE
        stmt = (
            _q.update()
            .where(_q.c.id.in_(ids), _q.c.state == TriggerState.PENDING.value)
            .values(state=state.value, outcome="expired" if expired else "claimed")
        )
        with translate_errors("close requests"), self._store._transaction() as conn:
            conn.execute(stmt)

    def take(self, request: TriggerRow, holder: str, *, leased: bool) -> int | None:
        """Take ``request`` to run it on ``holder``: its next attempt, under a lease of its
        own for a leased name (see the module docstring). One transaction.

        Returns:
            The round's token (0 for a per-instance request), or ``None`` when it is not
            run here: another holder took it first, or it was refused (then on record:
            ``'busy'`` when the lease is held, ``'paused'`` when the name is paused and
            the request does not force, ``'superseded'`` for a second run whose lease
            another round claimed since).
        """
        check_holder(holder)
        store = self._store
        rerun = request.state is not TriggerState.PENDING
        attempt = request.attempt + 1
        token = _new_token() if leased else 0
        now_ms = store._clock_ms()
        now = store._now(now_ms)
        mine = sa.and_(
            _q.c.id == request.id,
            _q.c.state == request.state.value,
            _q.c.attempt == request.attempt,
        )
        stmt = (
            _q.update()
            .where(mine)
            .values(
                state=TriggerState.RUNNING.value,
                attempt=attempt,
                holder=holder,
                token=token,
                started_ms=now,
                ended_ms=None,
            )
        )
        with translate_errors("take a request"), store._transaction() as conn:
            if conn.execute(stmt).rowcount != 1:
                return None  # another holder took it, or it changed meanwhile
            if not leased:
                return token
            free = sa.or_(_t.c.expires_ms.is_(None), _t.c.expires_ms <= now)
            allowed = [_t.c.name == request.name, free]
            if not request.force:
                allowed.append(_t.c.paused_ms.is_(None))
            if rerun:
                allowed.append(_t.c.token == request.token)
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
            if conn.execute(claim).rowcount == 1:
                store._held([(request.name, token)], now_ms)
                return token
            why = self._refusal(conn, request, rerun=rerun, now=now)
            conn.execute(
                _q.update()
                .where(_q.c.id == request.id)
                .values(
                    state=TriggerState.DONE.value if rerun else TriggerState.REFUSED.value,
                    outcome=why,
                    ended_ms=now,
                )
            )
        return None

    def _refusal(self, conn: sa.Connection, request: TriggerRow, *, rerun: bool, now: Any) -> str:
        """Why the lease could not be taken for ``request`` (inside its transaction)."""
        if rerun:
            return "superseded"
        row = conn.execute(
            sa.select(_t.c.paused_ms, _t.c.expires_ms <= now, _t.c.expires_ms).where(
                _t.c.name == request.name
            )
        ).first()
        if row is None:
            return "no lease"
        paused_ms, expired, expires_ms = row
        if expires_ms is not None and not expired:
            return "busy"
        return "paused" if paused_ms is not None else "busy"

    def end(
        self,
        request_id: int,
        name: str,
        token: int,
        *,
        leased: bool,
        outcome: str,
        error: str | None = None,
        record: RoundRow | None = None,
    ) -> bool:
        """Record the end of a request's round: ``outcome`` is ``'succeeded'``,
        ``'failed'``, ``'timed_out'``, ``'cut short'`` (it is taken again) or
        ``'given up'``. Frees the lease (leased names) and puts the outcome on the lease
        row, without touching its instant, attempt or state; adds ``record`` to the
        history if the end is on record (the round still held its lease). One
        transaction.

        Returns:
            ``True`` when the round still held its lease (always for a per-instance one):
            its end is on record.
        """
        store = self._store
        now = store._now()
        cut = outcome == "cut short"
        summary = bounded_error(error)
        held = True
        with translate_errors("record a manual round's end"), store._transaction() as conn:
            if leased:
                values: dict[str, Any] = {
                    "expires_ms": None,
                    "last_end_ms": now,
                    "last_outcome": outcome,
                }
                if outcome == "succeeded":
                    values.update(last_success_ms=now, last_error=None, failures=0)
                elif outcome in ("failed", "given up", "timed_out"):
                    values.update(
                        last_error=summary, failures=sa.func.coalesce(_t.c.failures, 0) + 1
                    )
                stmt = _t.update().where(_t.c.name == name, _t.c.token == token).values(values)
                held = conn.execute(stmt).rowcount == 1
            state = TriggerState.CUT if cut and held else TriggerState.DONE
            conn.execute(
                _q.update()
                .where(_q.c.id == request_id, _q.c.token == token)
                .values(state=state.value, outcome=outcome, error=summary, ended_ms=now)
            )
            if record is not None and held:  # on record exactly when its end is
                conn.execute(_h.insert(), [round_values(record)])
        if leased and held:
            store._released(name, token, given_back=cut)
        return held


def _row(row: RowMapping) -> TriggerRow:
    def at(column: str) -> datetime | None:
        value = row[column]
        return None if value is None else _EPOCH + int(value) * _MS

    requested = at("requested_ms")
    assert requested is not None
    instant = row["instant"]
    try:
        state = TriggerState(row["state"])
    except ValueError:  # a hand-edited row: never runs
        state = TriggerState.EXPIRED
    return TriggerRow(
        id=int(row["id"]),
        name=row["name"],
        requested=requested,
        requested_by=row["requested_by"],
        force=row["forced"] == 1,
        replica=row["replica"],
        instant=None if instant is None else _EPOCH + timedelta(seconds=int(instant)),
        state=state,
        attempt=int(row["attempt"]),
        holder=row["holder"],
        token=None if row["token"] is None else int(row["token"]),
        started=at("started_ms"),
        ended=at("ended_ms"),
        outcome=row["outcome"],
        error=row["error"],
        lease_token=None if row["lease_token"] is None else int(row["lease_token"]),
        lease_free=bool(row["lease_free"]),
        lease_expires_ms=None if row["lease_expires_ms"] is None else int(row["lease_expires_ms"]),
        backfill=row["forced"] == BACKFILL_MARK,
    )
