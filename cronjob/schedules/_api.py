"""Add, change, remove and read schedules made of data, in the caller's transaction."""

from __future__ import annotations

import builtins
import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

import lease

from .._bounds import at_spec
from .._exceptions import RegistrationError
from .._policy import CatchUp, Overlap
from .._registry import Registry, _check_name
from ._check import New, checked
from ._conflict import refusing_overtaken
from ._policies import OWN_POLICIES, own_of
from ._tables import require_tables
from ._write import now_ms_of, shown, write

__all__ = [
    "Database",
    "IfExists",
    "ScheduleRecord",
    "add",
    "add_many",
    "get",
    "list",
    "remove",
    "update",
]

#: Where a call writes: a `Connection` (the call joins its transaction), an `Engine` or
#: a URL (a transaction of the call's own).
Database = Connection | Engine | str | sa.URL
#: What [add][cronjob.schedules.add] does with an id already on record.
IfExists = Literal["error", "replace", "keep"]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Final = _Unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRecord:
    """A schedule made of data, as on record.

    Attributes:
        id: Its id: the name of its rounds, its lease and its history.
        task: The task that runs it.
        spec: Its spec, or ``None`` for a one-off schedule.
        at: A one-off schedule's instant (UTC), or ``None``.
        args: Its arguments (decoded anew for each record).
        start: No instant before it (UTC), or ``None``.
        end: No instant after it (UTC), or ``None``.
        created: When it was added (the writer's ``now``, else the database's clock).
        updated: When it last changed (the same).
        overlap: Its own ``overlap``; ``None``: its task's. So for the four below.
        catch_up: Its own ``catch_up``.
        catch_up_window: Its own ``catch_up_window``.
        jitter: Its own ``jitter``.
        heartbeat: Its own ``heartbeat`` URL, whole.
        paused: Whether it is paused: added with ``paused=True``, or by ``cronjob pause``
            (`cronjob.admin.pause`), and not resumed since (as ``cronjob schedules``
            shows it).
    """

    id: str
    task: str
    spec: str | None
    at: datetime | None
    args: dict[str, Any]
    start: datetime | None
    end: datetime | None
    created: datetime
    updated: datetime
    overlap: Overlap | None = None
    catch_up: CatchUp | None = None
    catch_up_window: timedelta | None = None
    jitter: timedelta | None = None
    heartbeat: str | None = None
    paused: bool = False

    @property
    def shown_spec(self) -> str:
        """The spec as tools show it: the spec, or ``@at <instant>`` for a one-off."""
        if self.at is not None:
            return at_spec(self.at)
        return self.spec or ""


def record_of(row: lease.ScheduleRow, *, paused: bool = False) -> ScheduleRecord:
    """``row`` as the public record."""
    return ScheduleRecord(
        id=row.id,
        task=row.task,
        spec=row.spec,
        at=row.at,
        args=json.loads(row.args),
        start=row.start,
        end=row.end,
        created=row.created,
        updated=row.updated,
        paused=paused,
        **own_of(row.id, row.policies),
    )


@contextlib.contextmanager
def _begin(db: Database) -> Iterator[Connection]:
    """``db`` as a connection in a transaction: the caller's, or one of the call's own
    (committed when the call returns); the schedule tables checked there first
    (`lease.MigrationRequired` when they are missing)."""
    if isinstance(db, Connection):
        require_tables(db)
        yield db
        return
    if isinstance(db, Engine):
        with db.begin() as conn:
            require_tables(conn)
            yield conn
        return
    if isinstance(db, str | sa.URL):
        engine = lease.create_engine(db)
        try:
            with engine.begin() as conn:
                require_tables(conn)
                yield conn
        finally:
            engine.dispose()
        return
    raise TypeError(f"expected a SQLAlchemy Connection, Engine or URL, got {type(db).__name__}")


def _storable(id_: object) -> bool:
    """Whether ``id_`` could be a schedule's id: one that is not is on record nowhere (and
    is never sent to the database, which might fail on it or, on MariaDB/MySQL, match
    ``"a "`` to ``"a"``)."""
    try:
        _check_name(id_)
    except RegistrationError:
        return False
    return True


def add(
    db: Database,
    id: str,
    *,
    task: str,
    spec: str | None = None,
    at: datetime | None = None,
    args: dict[str, Any] | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    paused: bool = False,
    if_exists: IfExists = "error",
    registry: Registry | None = None,
    overlap: Overlap | str | None = None,
    catch_up: CatchUp | str | None = None,
    catch_up_window: float | timedelta | None = None,
    jitter: float | timedelta | None = None,
    heartbeat: str | None = None,
    now: datetime | None = None,
) -> bool:
    """Add the schedule ``id``: ``task`` runs on ``spec`` (or once, ``at``) with ``args``.

    Every replica that registers ``task`` sees it within 2 s of the commit, without a
    restart. A changed spec governs from the first instant after a replica sees it.
    Committed while no replica runs, it is owed its instants from ``now`` by its catch-up
    policy (the latest, by default) once a replica starts: added at 09:30, replicas back
    at 11:30, an hourly schedule runs its 11:00 instant; it is owed none from before.

    Args:
        db: A `Connection` (the call joins its transaction: nothing is seen by any replica
            before it commits, nothing at all if it rolls back), an `Engine` or a URL (a
            transaction of the call's own).
        id: The schedule's id, checked as a job's name: the name of its rounds, lease
            and history.
        task: A task's name (see [cronjob.task][]).
        spec: A spec as for [register][cronjob.register]; or ``at``: one run at that
            aware instant (whole seconds).
        args: JSON-serialisable, at most 64 KiB encoded: ``ctx.args`` of every round.
        start: No instant before it (aware).
        end: No instant after it (aware).
        paused: Add it paused (its lease row paused, as ``cronjob pause`` would).
        if_exists: An id already on record: ``"error"`` refuses, ``"replace"`` overwrites,
            ``"keep"`` leaves it as it is.
        registry: When given, a task it does not hold is refused.
        overlap: Its own ``overlap`` (as for [register][cronjob.register]); ``None``:
            its task's. So for the four below.
        catch_up: Its own ``catch_up``.
        catch_up_window: Its own ``catch_up_window`` (seconds or a ``timedelta``).
        jitter: Its own ``jitter``: the delay is drawn from a hash of the schedule's id
            and the instant.
        heartbeat: Its own heartbeat URL, pinged as its rounds start, succeed or fail.
        now: When it is committed, on the lease clock (an aware datetime: a test's fake
            clock); the database's clock by default. The row's ``created`` and
            ``updated`` are stamped with it, and the catch-up owes the schedule its
            instants after it. Replaced with another spec or instant (or window), the
            schedule is owed from this replacement; with the same, it keeps its commit.

    Returns:
        Whether it was written (``False``: kept by ``if_exists="keep"``).

    Raises:
        RegistrationError: a bad id or args, an id taken by a job or (``"error"``) a
            schedule, a task ``registry`` does not hold, a policy registration would
            refuse (its message, naming the schedule).
        ScheduleError: a bad or never-firing spec, a naive datetime (``now`` too),
            ``end`` before ``start``, neither or both of ``spec`` and ``at``.
        TypeError: ``now`` is not a datetime.
        lease.MigrationRequired: the lease tables are missing (no replica has started on
            this database): start one, or run ``lease.migrate``.
        lease.LeaseError: the database failed.

    Both refusals are `ValueError`s (and `cronjob.CronjobError`s): catch `ValueError`
    to refuse a form's input whatever the field.
    """
    new = New(
        id,
        task,
        spec,
        at,
        {} if args is None else args,
        start,
        end,
        paused,
        overlap=overlap,
        catch_up=catch_up,
        catch_up_window=catch_up_window,
        jitter=jitter,
        heartbeat=heartbeat,
    )
    return add_many(db, [new], if_exists=if_exists, registry=registry, now=now) == 1


def add_many(
    db: Database,
    schedules: Iterable[New],
    *,
    if_exists: IfExists = "error",
    registry: Registry | None = None,
    now: datetime | None = None,
) -> int:
    """Add every schedule of ``schedules`` in one transaction: all, or none if one is
    refused (each checked as [add][cronjob.schedules.add] checks it, before anything is
    written), each committed at ``now`` (as for `add`). Returns how many were written.

    Raises:
        RegistrationError: as for `add`, naming the first refused schedule's id.
        ScheduleError: as for `add`, naming the first refused schedule's id.
        TypeError: ``now`` is not a datetime.
        lease.MigrationRequired: the lease tables are missing.
    """
    now_ms = now_ms_of(now)
    news = builtins.list(schedules)
    rows = [checked(new, registry=registry) for new in news]
    paused = {new.id for new in news if new.paused}
    with _begin(db) as conn:
        return write(conn, rows, paused, if_exists, registry, now_ms=now_ms)


def update(
    db: Database,
    id: str,
    *,
    spec: str | _Unset | None = _UNSET,
    at: datetime | _Unset | None = _UNSET,
    args: dict[str, Any] | _Unset = _UNSET,
    start: datetime | _Unset | None = _UNSET,
    end: datetime | _Unset | None = _UNSET,
    task: str | _Unset = _UNSET,
    overlap: Overlap | str | _Unset | None = _UNSET,
    catch_up: CatchUp | str | _Unset | None = _UNSET,
    catch_up_window: float | timedelta | _Unset | None = _UNSET,
    jitter: float | timedelta | _Unset | None = _UNSET,
    heartbeat: str | _Unset | None = _UNSET,
    now: datetime | None = None,
) -> bool:
    """Change what is given of the schedule ``id`` (``None`` clears ``start`` or
    ``end``, and gives a policy back to the task; a ``spec`` replaces an ``at`` and the
    other way round), checked as [add][cronjob.schedules.add] checks it.

    A round in flight runs to its end as it began; the next instant is the new
    schedule's first after the change is seen. A change of its spec, instant or window
    is committed at ``now`` (the database's clock by default; as for `add`): committed
    while no replica runs, the schedule is owed its instants from the change, never
    from before it (nor any of its old spec's).

    Returns:
        Whether the schedule was on record (``False``: nothing written).

    Raises:
        RegistrationError: a bad task name, args or policy (as for `add`).
        ScheduleError: a bad spec, ``at``, ``start`` or ``end`` (as for `add`); a naive
            ``now``.
        TypeError: ``now`` is not a datetime.
        lease.MigrationRequired: the lease tables are missing.
    """
    now_ms = now_ms_of(now)
    if not _storable(id):
        return False
    with _begin(db) as conn, refusing_overtaken(id):
        lease.bump_schedule_rev(conn, by=0)  # locked: see _write
        found = lease.read_schedules(conn, ids=[id], lock=True)
        if not found:
            return False
        current = found[0]
        new_spec = current.spec if isinstance(spec, _Unset) else spec
        new_at = current.at if isinstance(at, _Unset) else at
        if not isinstance(spec, _Unset) and spec is not None and isinstance(at, _Unset):
            new_at = None
        if not isinstance(at, _Unset) and at is not None and isinstance(spec, _Unset):
            new_spec = None
        new = New(
            id,
            current.task if isinstance(task, _Unset) else task,
            new_spec,
            new_at,
            json.loads(current.args) if isinstance(args, _Unset) else args,
            current.start if isinstance(start, _Unset) else start,
            current.end if isinstance(end, _Unset) else end,
            **_own_after(current, overlap, catch_up, catch_up_window, jitter, heartbeat),
        )
        row = checked(new)
        rev = lease.bump_schedule_rev(conn)
        lease.update_schedule(conn, id, lease.schedule_values(row), rev, now_ms=now_ms)
        timing = ("spec", "at_s")  # a window's bounds change no instant of the spec
        values, before = lease.schedule_values(row), lease.schedule_values(current)
        if any(values[column] != before[column] for column in timing):
            lease.redeploy_schedule_leases(conn, {id: shown(row)}, now_ms=now_ms)
        elif any(values[column] != before[column] for column in ("start_s", "end_s")):
            # Missed instants count from now, and the catch-up owes from now.
            lease.retime_schedule_leases(conn, [id], now_ms=now_ms)
        lease.tell_on_commit(conn)
        return True


def _own_after(current: lease.ScheduleRow, *given: object) -> dict[str, Any]:
    """The policies of ``current`` after an update's ``given`` (in `OWN_POLICIES`'s order;
    unset: as on record, ``None``: the task's), as the values stored (checked again)."""
    stored = json.loads(current.policies) if current.policies else {}
    own = {k: v for k, v in stored.items() if k in OWN_POLICIES} if isinstance(stored, dict) else {}
    for key, value in zip(OWN_POLICIES, given, strict=True):
        if value is None:
            own.pop(key, None)
        elif not isinstance(value, _Unset):
            own[key] = value
    return own


def remove(db: Database, id: str, *, now: datetime | None = None) -> bool:
    """Remove the schedule ``id``: no instant of it starts after a replica sees the
    removal; a round in flight runs to its end, on record. Its history stays (pruned as
    any). Added again later, it is owed its instants from that add, none from before.
    Returns whether it was on record; an id that is not refuses nothing.

    Args:
        now: When it is removed, on the lease clock (as for `add`): the prune ages the
            tombstone from it. The database's clock by default.

    Raises:
        ScheduleError: a naive ``now``.
        TypeError: ``now`` is not a datetime.
        lease.MigrationRequired: the lease tables are missing.
    """
    now_ms = now_ms_of(now)
    if not _storable(id):
        return False
    with _begin(db) as conn, refusing_overtaken(id):
        lease.bump_schedule_rev(conn, by=0)  # locked: see _write
        if lease.taken_schedule_ids(conn, [id], lock=True).get(id) is not False:
            return False  # none, or a tombstone
        rev = lease.bump_schedule_rev(conn)
        removed = lease.remove_schedule(conn, id, rev, now_ms=now_ms)
        lease.tell_on_commit(conn)
        return removed


def get(db: Database, id: str) -> ScheduleRecord | None:
    """The schedule ``id`` as on record, or ``None``.

    Raises:
        lease.MigrationRequired: the lease tables are missing.
    """
    if not _storable(id):
        return None
    with _begin(db) as conn:
        rows = lease.read_schedules(conn, ids=[id])
        paused = lease.paused_names(conn, [id]) if rows else set()
    return record_of(rows[0], paused=id in paused) if rows else None


def list(
    db: Database, *, task: str | None = None, prefix: str | None = None
) -> builtins.list[ScheduleRecord]:
    """The schedules on record, by id: of ``task`` only, and whose id starts with
    ``prefix``, when given.

    Raises:
        lease.MigrationRequired: the lease tables are missing.
    """
    with _begin(db) as conn:
        rows = lease.read_schedules(conn, task=task, prefix=prefix)
        paused = lease.paused_names(conn, [row.id for row in rows]) if rows else set()
    return [record_of(row, paused=row.id in paused) for row in rows]
