"""Schedules made of data: the ``cronjob_schedule`` and ``cronjob_schedule_rev`` tables
(revision 0008) and every statement on them.

A schedule is a row: an id (the name of its lease row), a task, a spec or a one-off
instant, JSON arguments, and optional bounds. The package stores and reads them; it
parses nothing (the caller checks specs and arguments before it writes).

**Changes and the counter.** Every write raises the one row of ``cronjob_schedule_rev``
by one in the writer's own transaction, and stamps the rows it writes with the new value
(``rev``). The counter's row lock is held until that transaction ends, so the writers'
commits come in the counter's order: once a reader sees the counter at *n*, every row
stamped *n* or less is committed. A reader that last saw *m* reads the rows stamped above
*m* (one range on an index), whatever the number of schedules. A removal leaves a
tombstone (``removed = 1``) so that readers learn of it from the same range. The price:
two transactions that change schedules wait for each other's commit.

Each function takes the caller's `Connection` and runs in its transaction: nothing is
seen by a reader before it commits, nothing at all if it rolls back. The writes stamp
their times (``created_ms``, ``updated_ms``) with the writer's ``now_ms`` when given,
else with the database's clock. The schedules' lease rows, written beside, are
``lease._schedule_leases``'s.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import RowMapping

from ._core import _tell_url
from ._dialect import _db_now_ms, _now_ms_or
from ._exceptions import translate_errors
from ._rows import LeaseWrite, WriteKind
from ._schema import lease_table, schedule_rev_table, schedule_table

if TYPE_CHECKING:
    from ._store import LeaseStore

__all__ = [
    "POLICIES_FORMAT",
    "SCHEDULE_FORMAT",
    "ScheduleRow",
    "schedule_values",
    "bump_schedule_rev",
    "insert_schedules",
    "prune_schedules",
    "read_schedule_rev",
    "read_schedules",
    "remove_schedule",
    "replace_schedules",
    "schedule_changes",
    "taken_schedule_ids",
    "tell_on_commit",
    "tell_schedules_changed",
    "update_schedule",
]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
#: The highest format of schedule rows this release runs: a row of a higher format (a
#: later release's, with something this one does not know) is left alone by this
#: release's replicas, never run without what it asks for.
SCHEDULE_FORMAT: Final = 2
#: A row with policies of its own (revision 0011); 1: one that takes its task's.
POLICIES_FORMAT: Final = 2
#: Rows per INSERT/UPDATE batch (one statement run with many parameter sets).
_BATCH: Final = 1000

_s = schedule_table
_r = schedule_rev_table
_t = lease_table


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """One schedule as stored."""

    id: str
    task: str
    #: Its spec; ``None`` for a one-off schedule.
    spec: str | None
    #: A one-off schedule's instant; ``None`` for a spec.
    at: datetime | None
    #: The JSON text of its arguments.
    args: str
    start: datetime | None
    end: datetime | None
    #: The change counter's value when it last changed.
    rev: int
    #: A tombstone: the schedule was removed.
    removed: bool
    #: On the database's clock.
    created: datetime
    updated: datetime
    #: What a replica must understand to run it (see `SCHEDULE_FORMAT`).
    format: int = 1
    #: The JSON of the policies it sets for itself; ``None``: its task's (revision 0011).
    policies: str | None = None


def _seconds(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp())


def _when(seconds: int | None) -> datetime | None:
    return None if seconds is None else _EPOCH + timedelta(seconds=int(seconds))


def _among(column: sa.ColumnElement[str], values: Sequence[str], dialect: str) -> Any:
    """``column IN values``; on PostgreSQL ``IN (SELECT unnest(:array))``, a hashed
    semi-join: a prepared statement's generic plan compares a list or ``= ANY`` element
    by element against each row (0.25 s over 30,000 rows, measured in ``add_many``)."""
    if dialect == "postgresql":
        array = sa.bindparam(
            "among", list(values), type_=postgresql.ARRAY(sa.String()), unique=True
        )
        return column.in_(sa.select(sa.func.unnest(array)))
    return column.in_(list(values))


def schedule_values(row: ScheduleRow) -> dict[str, Any]:
    """The columns of ``row`` but its id, rev and times, as written."""
    return {
        "task": row.task,
        "spec": row.spec,
        "at_s": _seconds(row.at),
        "args": row.args,
        "start_s": _seconds(row.start),
        "end_s": _seconds(row.end),
        "format": row.format,
        "policies": row.policies,
    }


def _row(row: RowMapping) -> ScheduleRow:
    at, start, end = _when(row["at_s"]), _when(row["start_s"]), _when(row["end_s"])
    return ScheduleRow(
        id=row["id"],
        task=row["task"],
        spec=row["spec"],
        at=at,
        args=row.get("args", ""),
        start=start,
        end=end,
        rev=int(row["rev"]),
        removed=bool(row["removed"]),
        created=_EPOCH + int(row["created_ms"]) * _MS,
        updated=_EPOCH + int(row["updated_ms"]) * _MS,
        format=int(row.get("format", 1)),
        policies=row.get("policies"),
    )


def bump_schedule_rev(conn: Connection, *, by: int = 1) -> int:
    """Raise the change counter by ``by`` in ``conn``'s transaction and return its new
    value.

    Its row stays locked until the transaction ends (see the module docstring). With
    ``by=0``, a write that changes nothing: the lock alone, taken before a writer checks
    what it is about to change (on SQLite, the database's write lock: a read first would
    let two writers deadlock)."""
    with translate_errors("change schedules"):
        conn.execute(_r.update().where(_r.c.id == 1).values(rev=_r.c.rev + by))
        return int(conn.execute(sa.select(_r.c.rev).where(_r.c.id == 1)).scalar_one())


def read_schedule_rev(conn: Connection, *, wait: bool = False) -> int:
    """The change counter: one row read by its key. With ``wait``, a locking read: it
    waits for a transaction that raised it and has not committed yet (on SQLite, a write
    transaction waits as well)."""
    stmt = sa.select(_r.c.rev).where(_r.c.id == 1)
    if wait and conn.dialect.name != "sqlite":
        stmt = stmt.with_for_update()
    with translate_errors("read the schedules' counter"):
        return int(conn.execute(stmt).scalar_one())


#: Connections with a commit listener not fired yet (see `tell_on_commit`): one each.
_PENDING: weakref.WeakSet[Connection] = weakref.WeakSet()


def tell_on_commit(conn: Connection) -> None:
    """Tell this process's watchers of ``conn``'s database (`LeaseStore.watch`) that
    schedules changed, as ``conn``'s transaction commits (once; one listener per
    connection however many calls it makes): schedulers on a fake clock, which do not
    poll the counter, read it then."""
    if conn in _PENDING:
        return
    _PENDING.add(conn)
    url = conn.engine.url

    def tell(_conn: Connection) -> None:
        _PENDING.discard(conn)
        tell_schedules_changed(url)

    sa.event.listen(conn, "commit", tell, once=True)


def tell_schedules_changed(url: str | sa.URL) -> None:
    """Tell this process's watchers of the database at ``url`` (`LeaseStore.watch`) that
    schedules changed: for a writer whose commit SQLAlchemy does not see (a framework's
    own transaction), once it committed."""
    _tell_url(url, LeaseWrite(kind=WriteKind.SCHEDULES, leases=()))


def _locking(stmt: sa.Select[Any], conn: Connection, lock: bool) -> sa.Select[Any]:
    # A locking read reads the latest committed rows, whatever the caller's snapshot (a
    # REPEATABLE READ transaction on MariaDB/MySQL that read before would see old ones).
    return stmt.with_for_update() if lock and conn.dialect.name != "sqlite" else stmt


def taken_schedule_ids(
    conn: Connection, ids: Collection[str], *, lock: bool = False
) -> dict[str, bool]:
    """Of ``ids``, those with a row: id -> whether it is a tombstone (removed). With
    ``lock``, a locking read (the rows as last committed, locked until the transaction
    ends). Ids are compared exactly (MariaDB/MySQL would match ``"a "`` to ``"a"``)."""
    found: dict[str, bool] = {}
    listed = sorted(ids)
    wanted = set(listed)
    with translate_errors("read schedules"):
        for start in range(0, len(listed), _BATCH):
            stmt = sa.select(_s.c.id, _s.c.removed).where(
                _among(_s.c.id, listed[start : start + _BATCH], conn.dialect.name)
            )
            for id_, removed in conn.execute(_locking(stmt, conn, lock)):
                if id_ in wanted:
                    found[id_] = bool(removed)
    return found


def insert_schedules(
    conn: Connection, rows: Sequence[ScheduleRow], rev: int, *, now_ms: int | None = None
) -> None:
    """Insert ``rows`` (ids with no row) stamped ``rev``, in batches, created at
    ``now_ms`` (the database's clock when ``None``)."""
    now = _now_ms_or(now_ms)
    stmt = _s.insert().values(rev=rev, removed=0, created_ms=now, updated_ms=now)
    params = [{"id": row.id, **schedule_values(row)} for row in rows]
    with translate_errors("add schedules"):
        for start in range(0, len(params), _BATCH):
            conn.execute(stmt, params[start : start + _BATCH])


def replace_schedules(
    conn: Connection, rows: Sequence[ScheduleRow], rev: int, *, now_ms: int | None = None
) -> None:
    """Overwrite the rows of ``rows``' ids (tombstones come back to life), stamped ``rev``
    and updated at ``now_ms`` (the database's clock when ``None``); a replaced tombstone
    counts as created then."""
    now = _now_ms_or(now_ms)
    # In this order: MariaDB/MySQL's SET reads the columns already assigned, so
    # ``created_ms`` reads ``removed`` before it is cleared (the table's column order,
    # SQLAlchemy's own, would clear it first and keep a re-added schedule's old birth).
    stmt = (
        _s.update()
        .where(_s.c.id == sa.bindparam("b_id"))
        .ordered_values(
            (_s.c.created_ms, sa.case((_s.c.removed == 1, now), else_=_s.c.created_ms)),
            (_s.c.removed, 0),
            (_s.c.task, sa.bindparam("task")),
            (_s.c.spec, sa.bindparam("spec")),
            (_s.c.at_s, sa.bindparam("at_s")),
            (_s.c.args, sa.bindparam("args")),
            (_s.c.start_s, sa.bindparam("start_s")),
            (_s.c.end_s, sa.bindparam("end_s")),
            (_s.c.format, sa.bindparam("format")),
            (_s.c.policies, sa.bindparam("policies")),
            (_s.c.rev, rev),
            (_s.c.updated_ms, now),
        )
    )
    params = [{"b_id": row.id, **schedule_values(row)} for row in rows]
    with translate_errors("replace schedules"):
        for start in range(0, len(params), _BATCH):
            conn.execute(stmt, params[start : start + _BATCH])


def update_schedule(
    conn: Connection,
    id_: str,
    values: Mapping[str, Any],
    rev: int,
    *,
    now_ms: int | None = None,
) -> bool:
    """Set ``values`` (columns of `schedule_values`) on the live schedule ``id_``,
    stamped ``rev``, updated at ``now_ms`` (the database's clock when ``None``). Returns
    whether there was one."""
    stmt = (
        _s.update()
        .where(_s.c.id == id_, _s.c.removed == 0)
        .values({**values, "rev": rev, "updated_ms": _now_ms_or(now_ms)})
    )
    with translate_errors("update a schedule"):
        return conn.execute(stmt).rowcount == 1


def remove_schedule(conn: Connection, id_: str, rev: int, *, now_ms: int | None = None) -> bool:
    """Make the live schedule ``id_`` a tombstone stamped ``rev`` at ``now_ms`` (the
    database's clock when ``None``: the prune's age counts from it); its lease row and
    history stay (a round in flight ends on record). Returns whether there was one."""
    stmt = (
        _s.update()
        .where(_s.c.id == id_, _s.c.removed == 0)
        .values(removed=1, rev=rev, updated_ms=_now_ms_or(now_ms))
    )
    with translate_errors("remove a schedule"):
        return conn.execute(stmt).rowcount == 1


def read_schedules(
    conn: Connection,
    *,
    since: int | None = None,
    ids: Iterable[str] | None = None,
    task: str | None = None,
    prefix: str | None = None,
    removed: bool = False,
    lock: bool = False,
    args: bool = True,
) -> list[ScheduleRow]:
    """The schedules, by id (by counter value with ``since``); without ``args`` their
    arguments are not read (``ScheduleRow.args`` is ``""``: a reader that shows no
    arguments need not fetch up to 64 KiB a row).

    Ids, tasks and prefixes are compared exactly, case and trailing spaces included
    (SQLite's ``LIKE`` ignores case; MariaDB/MySQL's ``=`` ignores trailing spaces).

    Args:
        since: Only the rows changed after this counter value, tombstones included.
        ids: Only these ids.
        task: Only this task's.
        prefix: Only ids that start with it.
        removed: Include tombstones (always with ``since``).
        lock: A locking read (see `taken_schedule_ids`).
    """
    stmt = sa.select(_s) if args else sa.select(*(c for c in _s.c if c.name != "args"))
    if since is not None:
        stmt = stmt.where(_s.c.rev > since).order_by(_s.c.rev, _s.c.id)
    else:
        stmt = stmt.order_by(_s.c.id)
        if not removed:
            stmt = stmt.where(_s.c.removed == 0)
    wanted = None if ids is None else set(ids)
    if wanted is not None:
        stmt = stmt.where(_among(_s.c.id, sorted(wanted), conn.dialect.name))
    if task is not None:
        stmt = stmt.where(_s.c.task == task)
    if prefix is not None:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        stmt = stmt.where(_s.c.id.like(escaped + "%", escape="\\"))
    with translate_errors("read schedules"):
        rows = [_row(row) for row in conn.execute(_locking(stmt, conn, lock)).mappings()]
    return [
        row
        for row in rows
        if (wanted is None or row.id in wanted)
        and (task is None or row.task == task)
        and (prefix is None or row.id.startswith(prefix))
    ]


def schedule_changes(
    store: LeaseStore, since: int | None, *, wait: bool = False, tasks: Collection[str] | None = ()
) -> tuple[int, list[ScheduleRow]]:
    """What a replica reads to follow the schedules, in one transaction on ``store``'s
    engine: the counter, and the rows changed since ``since`` (tombstones included), or
    with ``since`` ``None`` every live row of ``tasks`` (of every task with ``tasks``
    ``None``: the reader counts those it does not run). Rows changed since are read only
    when the counter moved: the usual poll is one row read by its key.

    Each read is one statement, so it sees the commits up to some moment whole; and a
    commit stamped *n* is preceded by every commit stamped below *n* (the counter's
    lock), so the rows read are complete up to their highest stamp, and up to the counter
    read before them.

    Returns:
        The counter value the rows are complete up to (rows stamped higher that committed
        meanwhile may be among them: reading them again is harmless), and the rows.
    """
    wanted = None if tasks is None else set(tasks)
    with store._transaction() as conn:
        rev = read_schedule_rev(conn, wait=wait)
        if since is None:  # every live row, in one statement; other tasks' left out here
            rows = [row for row in read_schedules(conn) if wanted is None or row.task in wanted]
        elif rev == since:
            return rev, []
        else:
            rows = read_schedules(conn, since=since)
    return max([rev, *(row.rev for row in rows)]), rows


def prune_schedules(store: LeaseStore, *, days: float) -> int:
    """Retire and delete the schedules that are over, on ``store``'s engine, in one
    transaction; returns how many were deleted.

    - A schedule *done* more than ``days`` ago (a one-off whose instant, or a bounded
      schedule whose ``end``, lies that far back) becomes a tombstone, stamped like any
      change, so that the replicas that hold it let it go.
    - A tombstone older than ``days`` is deleted, with its lease row unless a round holds
      that lease (the next prune takes it then); its history goes with the history's.
    """
    now_ms = store.now_ms()
    cutoff_ms = now_ms - round(days * 86_400_000)
    last_s = sa.func.coalesce(_s.c.at_s, _s.c.end_s)
    done = sa.and_(_s.c.removed == 0, last_s.is_not(None), last_s < cutoff_ms // 1000)
    old = sa.and_(_s.c.removed == 1, _s.c.updated_ms < cutoff_ms)
    free = sa.or_(_t.c.expires_ms.is_(None), _t.c.expires_ms <= now_ms)
    with translate_errors("prune schedules"), store._transaction() as conn:
        # The counter's lock first, as every writer of schedules takes it: no add can
        # bring a tombstone read below back to life before this transaction ends.
        bump_schedule_rev(conn, by=0)
        if conn.execute(sa.select(_s.c.id).where(done).limit(1)).first() is not None:
            rev = bump_schedule_rev(conn)
            conn.execute(
                _s.update().where(done).values(removed=1, rev=rev, updated_ms=_db_now_ms())
            )
        gone = list(conn.execute(sa.select(_s.c.id).where(old)).scalars())
        if not gone:
            return 0
        deleted = 0
        for start in range(0, len(gone), _BATCH):
            chunk = gone[start : start + _BATCH]
            held = set(
                conn.execute(
                    sa.select(_t.c.name).where(
                        _among(_t.c.name, chunk, conn.dialect.name), sa.not_(free)
                    )
                ).scalars()
            )
            chunk = [id_ for id_ in chunk if id_ not in held]
            if not chunk:
                continue
            deleted += conn.execute(
                _s.delete().where(_among(_s.c.id, chunk, conn.dialect.name), old)
            ).rowcount
            conn.execute(_t.delete().where(_among(_t.c.name, chunk, conn.dialect.name), free))
    return deleted
