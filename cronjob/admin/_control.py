"""What an operator writes: the pause (requests for a round now are in `_trigger`).

Re-exported by [cronjob.admin][], whose readers show what these write. The pause is
stored on the lease row, which the replicas already read, so every replica obeys without
a redeploy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import sqlalchemy as sa

import lease

from .._exceptions import ScheduleError
from .._schedule import Schedule
from . import _scheduled
from ._base import REPLICA_LIVE_SECONDS, UnknownJob, at_ms, aware, operator, store_on, to_ms

__all__ = [
    "REASON_LENGTH",
    "PauseChange",
    "pause",
    "pause_all",
    "resume",
    "resume_all",
]

#: How far back ``resume(catch_up=True)`` catches up an instant skipped while paused:
#: the catch-up rule's day.
CATCH_UP_HORIZON: Final = timedelta(days=1)


# -- pause and resume ----------------------------------------------------------------------


#: The longest pause reason, in characters: a longer one is refused, never cut.
REASON_LENGTH: Final = lease.REASON_LENGTH


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseChange:
    """What [pause][cronjob.admin.pause] or [resume][cronjob.admin.resume] did to one job."""

    job: str
    #: ``False`` when the job was already in the state asked for: nothing was written.
    changed: bool
    #: Whether the job is paused now, and since when, by whom, why.
    paused: bool
    paused_since: datetime | None
    paused_by: str | None
    pause_reason: str | None
    #: A round running now (on this replica): pausing does not cancel it, it runs to
    #: its end; ``None`` when idle.
    running_on: str | None
    #: ``resume(catch_up=True)``: the instant skipped while paused that is asked for
    #: (a replica claims it within a sweep, as any catch-up); ``None`` if none is owed.
    catch_up: datetime | None = None


def pause(
    database: str | sa.Engine,
    name: str,
    *,
    reason: str | None = None,
    by: str | None = None,
    now: datetime | None = None,
) -> PauseChange:
    """Pause job ``name`` on every replica: from its next instant, no replica claims it
    (the claim statement refuses a paused row), nor re-runs or catches it up. A round
    running now runs to its end. Noted in the history (`Why.PAUSE`).

    Args:
        database: a URL, or an engine (not disposed).
        reason: why, at most `REASON_LENGTH` characters.
        by: who; ``user@host`` of this process by default.
        now: when, on the lease clock; the database's clock by default.

    Returns:
        The change; ``changed`` is ``False`` (nothing written) if it was paused already.

    Raises:
        UnknownJob: no job ``name`` is on record, or ``name`` is a removed schedule's id;
            nothing was written. A live schedule's id is taken as a job's name.
        ValueError: ``reason`` is longer than `REASON_LENGTH`; nothing was written.
        TablesMissing, SchemaOutdated, SchemaNewer: as [status][cronjob.admin.status].
    """
    return _set_paused(database, name, paused=True, reason=reason, by=by, now=now)[0]


def pause_all(
    database: str | sa.Engine,
    *,
    reason: str | None = None,
    by: str | None = None,
    now: datetime | None = None,
) -> tuple[PauseChange, ...]:
    """Pause every leased job on record (a maintenance window), as
    [pause][cronjob.admin.pause] each, in one transaction. A job a later release registers
    (no row yet) is not paused. Returns one change per job on record, sorted by name."""
    return _set_paused(database, None, paused=True, reason=reason, by=by, now=now)


def resume(
    database: str | sa.Engine,
    name: str,
    *,
    catch_up: bool = False,
    by: str | None = None,
    now: datetime | None = None,
) -> PauseChange:
    """Resume job ``name``: its next instant runs as usual. The instants skipped while
    it was paused are never run — not caught up at start-up, not re-run by the sweep —
    except, with ``catch_up``, the latest of them within the last day, which a replica
    claims within a sweep (15 s) as any catch-up: once, and not if a later instant
    started first. Noted in the history (`Why.RESUME`); ``changed`` is ``False``
    (nothing written) if it was not paused. Raises as [pause][cronjob.admin.pause]."""
    changes = _set_paused(
        database, name, paused=False, reason=None, by=by, now=now, catch_up=catch_up
    )
    return changes[0]


def resume_all(
    database: str | sa.Engine,
    *,
    catch_up: bool = False,
    by: str | None = None,
    now: datetime | None = None,
) -> tuple[PauseChange, ...]:
    """Resume every paused job, as [resume][cronjob.admin.resume] each, in one transaction."""
    return _set_paused(database, None, paused=False, reason=None, by=by, now=now, catch_up=catch_up)


def _set_paused(
    database: str | sa.Engine,
    name: str | None,
    *,
    paused: bool,
    reason: str | None,
    by: str | None,
    now: datetime | None,
    catch_up: bool = False,
) -> tuple[PauseChange, ...]:
    who = operator() if by is None else by
    if not isinstance(who, str) or not 0 < len(who) <= lease.HOLDER_LENGTH:
        raise ValueError(f"by must be 1 to {lease.HOLDER_LENGTH} characters, not {who!r}")
    if reason is not None and len(reason) > REASON_LENGTH:
        raise ValueError(
            f"the reason is {len(reason)} characters, more than the {REASON_LENGTH} kept; "
            "nothing was changed"
        )
    now_ms = None if now is None else to_ms(aware(now, "now"))
    with store_on(database) as store:
        clock_ms = store.now_ms() if now_ms is None else now_ms
        # A per-instance job has no lease row until it is first paused: its pause lives
        # in one, which the replicas running it read with each sweep.
        local = _per_instance(store, clock_ms)
        if name is not None:
            _scheduled.refuse_removed(store, name)  # a schedule's id is taken as a job's name
            rows = store.read([name])
            if name not in rows and name not in local:
                raise UnknownJob(f"no job named {name!r} is on record")
            local &= {name}
        if paused and local:
            store.ensure(sorted(local))
        names = None if name is None else [name]
        before = store.read_all() if name is None else store.read([name])
        changed = set(store.set_paused(names, paused=paused, by=who, reason=reason, now_ms=now_ms))
        rows = store.read_all() if name is None else store.read([name])
        for job in changed:
            # Schedulers on a fake clock in this process sweep now: a per-instance job's
            # replicas read its pause, a round cut short while paused is re-run.
            store._requested(job)
        owed: dict[str, datetime] = {}
        if catch_up and changed:
            # A schedule's timing is its row's (its spec within its bounds, or its one
            # instant), not the spec text on its lease row.
            plans = {plan.id: plan for plan in _scheduled.read(store, ids=changed)}
            for job in sorted(changed):
                plan = plans.get(job)
                timing = None if plan is None else _scheduled.timing_of(plan)
                instant = _skipped(before.get(job), clock_ms, timing)
                if instant is not None:
                    lease.Triggers(store).request(job, by=who, instant=instant, now_ms=now_ms)
                    owed[job] = instant
    return tuple(
        PauseChange(
            job=row.name,
            changed=row.name in changed,
            paused=row.paused is not None,
            paused_since=row.paused,
            paused_by=row.paused_by,
            pause_reason=row.pause_reason,
            running_on=(
                row.holder if row.expires_ms is not None and row.expires_ms > clock_ms else None
            ),
            catch_up=owed.get(row.name),
        )
        for row in sorted(rows.values(), key=lambda row: row.name)
    )


def _per_instance(store: lease.LeaseStore, now_ms: int) -> set[str]:
    """The jobs the live replicas register without a lease (per instance)."""
    live = store.replicas(seen_since_ms=now_ms - round(REPLICA_LIVE_SECONDS * 1000))
    return {name for r in live for name, (_spec, leased) in r.jobs.items() if not leased}


def _registered(store: lease.LeaseStore, name: str, now_ms: int) -> tuple[bool, bool]:
    """Whether a live replica registers ``name`` per instance, and whether one registers
    it leased."""
    live = store.replicas(seen_since_ms=now_ms - round(REPLICA_LIVE_SECONDS * 1000))
    kinds = {r.jobs[name][1] for r in live if name in r.jobs}
    return False in kinds, True in kinds


def _skipped(
    row: lease.LeaseRow | None, now_ms: int, schedule: Schedule | None = None
) -> datetime | None:
    """The latest instant of ``row``'s spec (or ``schedule``, a schedule made of data's)
    skipped while it was paused, within the catch-up day and not claimed; ``None`` if
    there is none (or no spec on record)."""
    if row is None or row.paused is None:
        return None
    if schedule is None:
        if row.spec is None:
            return None
        try:
            schedule = Schedule(row.spec)
        except ScheduleError:
            return None
    now = at_ms(now_ms)
    instant: datetime | None = schedule.prev(now.replace(microsecond=0) + timedelta(seconds=1))
    if instant is None or instant < row.paused or now - instant > CATCH_UP_HORIZON:
        return None
    if row.instant is not None and row.instant >= instant:
        return None
    return instant
