"""The write of checked schedules, in the caller's transaction: the rows, their lease
rows, and the moment each one's timing was committed.

The moment is the writer's ``now`` (a test's fake clock) when it gives one, else the
database's clock: the schedule row's ``created``/``updated`` and its lease row's
``committed_ms`` (revision 0017) carry it. The catch-up owes a schedule its instants
after its commit — also those that passed while no replica ran (see
``cronjob.engine._committed``): a new schedule from its add, one added again from the
re-add, one whose spec, instant or window changed from the change. One replaced with the
same timing (an upsert at each start) keeps its commit.
"""

from __future__ import annotations

import builtins
import collections
from datetime import UTC, datetime, timedelta
from typing import Final

from sqlalchemy import Connection

import lease

from .._bounds import at_spec
from .._exceptions import RegistrationError, ScheduleError
from .._registry import Registry, default_registry
from ._conflict import refusing_overtaken

__all__ = ["IF_EXISTS", "PAUSED_BY", "now_ms_of", "shown", "write"]

#: The values ``if_exists`` takes.
IF_EXISTS: Final = ("error", "replace", "keep")
#: Who a schedule added paused is paused by, on its lease row.
PAUSED_BY: Final = "schedules.add"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def now_ms_of(now: datetime | None) -> int | None:
    """A writer's ``now`` in epoch milliseconds; ``None`` (the database's clock) stays so.

    Raises:
        TypeError: ``now`` is not a datetime.
        ScheduleError: ``now`` is naive.
    """
    if now is None:
        return None
    if not isinstance(now, datetime):
        raise TypeError(f"now must be a datetime, not {type(now).__name__}")
    if now.utcoffset() is None:
        raise ScheduleError(
            f"now {now.isoformat()} is naive; give it a zone (datetime(..., tzinfo=UTC))"
        )
    return (now - _EPOCH) // timedelta(milliseconds=1)


def shown(row: lease.ScheduleRow) -> str:
    """The spec text of ``row`` on its lease row: its spec, or ``@at`` its instant."""
    return at_spec(row.at) if row.at is not None else row.spec or ""


def write(
    conn: Connection,
    rows: builtins.list[lease.ScheduleRow],
    paused: set[str],
    if_exists: str,
    registry: Registry | None = None,
    *,
    now_ms: int | None = None,
) -> int:
    """Write checked ``rows`` in ``conn``'s transaction, committed at ``now_ms`` (the
    database's clock when ``None``); the count written."""
    if if_exists not in IF_EXISTS:
        raise ValueError(f"if_exists must be one of {', '.join(IF_EXISTS)}, got {if_exists!r}")
    ids = [row.id for row in rows]
    if len(set(ids)) != len(ids):
        twice = sorted(id_ for id_, n in collections.Counter(ids).items() if n > 1)
        raise RegistrationError(f"schedule {twice[0]!r} is given more than once")
    jobs = {job.name for job in default_registry.jobs}
    if registry is not None:
        jobs.update(job.name for job in registry.jobs)
    clash = [id_ for id_ in ids if id_ in jobs]
    if clash:
        raise RegistrationError(f"schedule {clash[0]!r}: the id is a registered job's name")
    if not rows:
        return 0
    with refusing_overtaken(ids[0]):
        return _write_checked(conn, rows, paused, if_exists, now_ms)


def _write_checked(
    conn: Connection,
    rows: builtins.list[lease.ScheduleRow],
    paused: set[str],
    if_exists: str,
    now_ms: int | None,
) -> int:
    """`write` once the ids are known to be free of jobs' names and given once each."""
    ids = [row.id for row in rows]
    # The counter's row locked first: changes of schedules commit in the counter's order,
    # and what is checked below stays so until this transaction ends. Raised only once
    # nothing is refused, so a refusal leaves the counter as it was.
    lease.bump_schedule_rev(conn, by=0)
    taken = lease.taken_schedule_ids(conn, ids, lock=True)
    jobs_rows = lease.leased_names(conn, [id_ for id_ in ids if id_ not in taken])
    if jobs_rows:
        first = sorted(jobs_rows)[0]
        raise RegistrationError(
            f"schedule {first!r}: the id is the name of a job on record (a lease row that "
            "is no schedule's); choose another id, or `cronjob forget` a retired job"
        )
    live = [row for row in rows if taken.get(row.id) is False]
    if live and if_exists == "error":
        raise RegistrationError(
            f"schedule {live[0].id!r} already exists; pass if_exists='replace' or 'keep'"
        )
    kept = {row.id for row in live} if if_exists == "keep" else set()
    new = [row for row in rows if row.id not in taken]
    again = [row for row in rows if row.id in taken and row.id not in kept]
    if not new and not again:
        return 0
    # A replaced schedule whose spec or instant changes owes nothing of its old timing:
    # redeployed, committed now. One replaced with the same timing (an upsert at each
    # start) is not, and keeps its commit.
    revived = {row.id for row in again if taken[row.id]}
    ids = [row.id for row in again]
    # A locking read: the rows as last committed, as ``taken`` saw them (a snapshot taken
    # before another writer added one of them would not have it).
    found = lease.read_schedules(conn, ids=ids, removed=True, lock=True) if ids else []
    before = {row.id: row for row in found}
    moved = [
        row
        for row in again
        if row.id in revived or (before[row.id].spec, before[row.id].at) != (row.spec, row.at)
    ]
    rev = lease.bump_schedule_rev(conn)
    lease.insert_schedules(conn, new, rev, now_ms=now_ms)
    lease.replace_schedules(conn, again, rev, now_ms=now_ms)
    written = new + again
    specs = {row.id: shown(row) for row in written}
    lease.redeploy_schedule_leases(
        conn, {row.id: specs[row.id] for row in moved}, unpause=revived, now_ms=now_ms
    )
    lease.forgo_former_rounds(conn, revived)  # added again: no second run of its former life
    # A window moved, the timing kept: missed instants count from now, and so does what
    # the catch-up owes a schedule no replica ran yet.
    moved_ids = {row.id for row in moved}
    windows = {row.id: (before[row.id].start, before[row.id].end) for row in again}
    lease.retime_schedule_leases(
        conn,
        [r.id for r in again if r.id not in moved_ids and windows[r.id] != (r.start, r.end)],
        now_ms=now_ms,
    )
    lease.schedule_lease_rows(conn, {i: specs[i] for i in specs if i not in paused}, now_ms=now_ms)
    lease.schedule_lease_rows(
        conn, {i: specs[i] for i in specs if i in paused}, paused_by=PAUSED_BY, now_ms=now_ms
    )
    lease.tell_on_commit(conn)
    return len(written)
