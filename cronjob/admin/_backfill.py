"""``cronjob backfill``: the instants of a range of the past run again, on the replicas.

Re-exported by [cronjob.admin][]. A backfill is written as requests in
``cronjob_trigger``, one per instant owed ([lease.Backfills][]), which the replicas that
register the job take one at a time, oldest first, under the job's lease: it runs where
the job's code is, and outlives the command that asked for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import sqlalchemy as sa

import lease

from .._exceptions import CronjobError
from .._schedule import Schedule
from . import _scheduled
from ._base import UnknownJob, at_ms, aware, operator, store_on, to_ms
from ._control import _registered
from ._spec import schedule_of

__all__ = [
    "BACKFILL_LIMIT",
    "Backfill",
    "BackfillCancelled",
    "BackfillTooLarge",
    "backfill",
    "cancel_backfill",
]

#: The most instants a backfill covers unless told otherwise (``--max``).
BACKFILL_LIMIT: Final = 10_000

_TICK: Final = timedelta(microseconds=1)


class BackfillTooLarge(CronjobError, ValueError):
    """Raised when a backfill's range holds more instants than its limit; nothing was
    written."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Backfill:
    """What [backfill][cronjob.admin.backfill] asked for."""

    job: str
    #: The range asked for, ``[start, end)``; instants at or after the moment of the
    #: request are the schedule's and left out.
    start: datetime
    end: datetime
    requested: datetime
    requested_by: str
    #: The instants of the range, before the moment of the request.
    instants: int
    #: The instants queued now (no round on record, none queued already), oldest first.
    queued: tuple[datetime, ...]
    #: Their requests' ids, in the same order.
    ids: tuple[int, ...]

    @property
    def on_record(self) -> int:
        """The instants of the range left out: a round of theirs is on record, or a
        backfill asked earlier has them queued."""
        return self.instants - len(self.queued)


def backfill(
    database: str | sa.Engine,
    name: str,
    *,
    start: datetime,
    end: datetime,
    now: datetime | None = None,
    by: str | None = None,
    limit: int = BACKFILL_LIMIT,
) -> Backfill:
    """Run each instant of job ``name`` in ``[start, end)`` that has no round on record,
    oldest first, one at a time, under the job's lease, on a replica that registers it.

    The instants are queued as requests the replicas' sweeps take (within 15 s, then
    one after another as each round ends): it runs without this process. Each round sees
    ``ctx.instant`` the instant and ``ctx.trigger == Trigger.BACKFILL``; the history
    records it with ``why`` ``'backfill'`` and who asked. An instant is skipped as it
    comes up if a round of it is on record by then (the schedule's own round of an
    instant that comes due meanwhile, say): an instant never runs twice, nor while
    another round of the job runs. An instant not yet passed by the schedule waits for
    it (the schedule runs its own instants). Asking again queues nothing already on
    record or queued: a backfill is idempotent. `status` shows the instants queued.
    [cancel_backfill][cronjob.admin.cancel_backfill] stops it after the round in
    flight. A replica that drains or dies leaves the rest queued: another replica, or
    the next start, goes on (the round it cut short runs once more).

    Args:
        database: a URL, or an engine (not disposed).
        start: the range's first moment, aware (an instant at it is included).
        end: the range's end, aware (excluded); instants at or after "now" are left to
            the schedule.
        now: the moment of the request on the lease clock; the database's by default.
        by: who asks; ``user@host`` of this process by default.
        limit: the most instants the range may hold (`BACKFILL_LIMIT`).

    Raises:
        UnknownJob: no leased job ``name`` is on record (a removed schedule's id too).
        BackfillTooLarge: the range holds more than ``limit`` instants; nothing written.
        ValueError: ``start`` or ``end`` naive, ``start`` not before ``end``, ``limit``
            below 1, the job runs per instance (no lease to run under), or its spec on
            record cannot be read by this release; nothing was written.
    """
    first, last = aware(start, "start"), aware(end, "end")
    if first >= last:
        raise ValueError(f"start ({first.isoformat()}) must come before end ({last.isoformat()})")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a whole number of at least 1, not {limit!r}")
    who = operator() if by is None else by
    lease.check_holder(who)
    with store_on(database) as store:
        now_ms = store.now_ms() if now is None else to_ms(aware(now, "now"))
        plan = _scheduled.refuse_removed(store, name)
        row = store.read([name]).get(name)
        local, leased = _registered(store, name, now_ms)
        if local and not leased:
            raise ValueError(
                f"job {name!r} runs on every replica, without a lease: it has no one round "
                "of an instant to backfill; nothing was written"
            )
        if row is None:
            raise UnknownJob(f"no job named {name!r} is on record")
        schedule = _scheduled.timing_of(plan) if plan is not None else schedule_of(row.spec)
        if schedule is None:
            raise ValueError(f"job {name!r}: its spec on record ({row.spec!r}) cannot be read")
        instants = _instants(schedule, first, min(last, at_ms(now_ms)), limit, name)
        backfills = lease.Backfills(store)
        owed = backfills.owed(name, instants)
        ids = backfills.queue(name, owed, by=who, now_ms=now_ms)
    return Backfill(
        job=name,
        start=first,
        end=last,
        requested=at_ms(now_ms),
        requested_by=who,
        instants=len(instants),
        queued=tuple(owed),
        ids=tuple(ids),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillCancelled:
    """What [cancel_backfill][cronjob.admin.cancel_backfill] did."""

    job: str
    #: When, on the lease clock, and who asked.
    at: datetime
    by: str
    #: The instants closed, oldest first: none of them runs.
    cancelled: tuple[datetime, ...]
    #: The instant whose round is in flight, left to end (``None``: none).
    running: datetime | None


def cancel_backfill(
    database: str | sa.Engine,
    name: str,
    *,
    now: datetime | None = None,
    by: str | None = None,
) -> BackfillCancelled:
    """Stop the backfill of job ``name`` after the round in flight.

    Each instant still queued is closed, on record (``cronjob_trigger``: state
    ``refused``, outcome ``cancelled``, ``cancelled by WHO``): no replica takes it. The
    instant whose round runs (one at a time: at most one) is not interrupted: it ends as
    any backfill round does, and if a drain cuts it short its one second run still
    comes. `status` shows the cancellation for a day (`JobStatus.backfill_cancelled`).
    Cancelling when nothing is queued closes nothing. A later
    [backfill][cronjob.admin.backfill] queues the instants again (they have no round on
    record).

    Args:
        database: a URL, or an engine (not disposed).
        now: the moment of the cancellation on the lease clock; the database's by default.
        by: who asks; ``user@host`` of this process by default.

    Raises:
        UnknownJob: nothing named ``name`` is on record.
        ValueError: ``now`` naive, ``by`` empty or too long.
    """
    who = operator() if by is None else by
    lease.check_holder(who)
    with store_on(database) as store:
        now_ms = store.now_ms() if now is None else to_ms(aware(now, "now"))
        if not store.known(name):
            raise UnknownJob(f"no job named {name!r} is on record")
        cancelled = lease.Backfills(store).cancel(name, by=who, now_ms=now_ms)
        open_rows = lease.Triggers(store).read(name=name)
    # In flight: taken once (running, cut short, or queued again for its second run).
    running = [
        r.instant for r in open_rows if r.backfill and (r.state.value != "queued" or r.attempt)
    ]
    return BackfillCancelled(
        job=name,
        at=at_ms(now_ms),
        by=who,
        cancelled=tuple(cancelled),
        running=running[0] if running else None,
    )


def _instants(
    schedule: Schedule, start: datetime, end: datetime, limit: int, name: str
) -> list[datetime]:
    """The instants of ``schedule`` in ``[start, end)``, at most ``limit`` of them."""
    found: list[datetime] = []
    at = schedule.next(start - _TICK)
    while at is not None and at < end:
        if len(found) == limit:
            raise BackfillTooLarge(
                f"the range holds more than {limit:,} instants of job {name!r}: narrow it, "
                f"or raise the limit (--max); nothing was written"
            )
        found.append(at)
        at = schedule.next(at)
    return found
