"""Schedules made of data on Django's own connection: [cronjob.schedules][] in the
current ``transaction.atomic()`` block.

```python
from cronjob.contrib.django import schedules

with transaction.atomic():
    tenant = Tenant.objects.create(name="Acme")
    schedules.add(f"report:tenant-{tenant.pk}", task="tenant-report",
                  spec="CRON_TZ=America/New_York 0 0 9 * * *", args={"tenant": tenant.pk})
```

Each call runs its statements on the connection of ``using`` (by default
``CRONJOB_DATABASE``, ``"default"`` unless set), inside ``transaction.atomic(using=...)``:
within the caller's atomic block, a savepoint of it (a rollback of the block leaves
nothing; a refused call leaves the block usable); outside one, a transaction of the
call's own. The lease tables must live in that database.

The statements go through a SQLAlchemy `Connection` lent Django's DBAPI connection for
the call: it never commits, rolls back or closes it (Django does, as its atomic blocks
end), and changes nothing on it (no driver hooks run on it).
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from ..._policy import CatchUp, Overlap
from ..._registry import Registry
from ...schedules import IfExists, New, ScheduleRecord, _api
from ...schedules import check as check
from ._database import database_alias

__all__ = [
    "New",
    "ScheduleRecord",
    "add",
    "add_many",
    "check",
    "get",
    "list",
    "pause",
    "remove",
    "resume",
    "update",
]

_T = TypeVar("_T")
_UNSET: Any = _api._UNSET

#: The SQLAlchemy dialect of each DBAPI module Django may connect with.
_DIALECTS = {
    "sqlite3": "sqlite+pysqlite",
    "_sqlite3": "sqlite+pysqlite",
    "psycopg": "postgresql+psycopg",
    "psycopg2": "postgresql+psycopg2",
    "MySQLdb": "mysql+mysqldb",
    "pymysql": "mysql+pymysql",
}


class _Lent:
    """Django's DBAPI connection, lent to SQLAlchemy: everything passes through but the
    end of a transaction or of the connection, which stay Django's."""

    __slots__ = ("_dbapi",)

    def __init__(self, dbapi: Any) -> None:
        object.__setattr__(self, "_dbapi", dbapi)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dbapi, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._dbapi, name, value)

    def commit(self) -> None:
        """Django commits, as its outermost atomic block ends."""

    def rollback(self) -> None:
        """Django rolls back (SQLAlchemy's ``Connection`` does as it closes)."""

    def close(self) -> None:
        """Django closes its connection."""


#: Per alias, the engine that lends that alias's connection of the calling thread.
_engines: dict[str, sa.Engine] = {}
_engines_lock = threading.Lock()


def _engine(alias: str) -> sa.Engine:
    from django.db import connections

    with _engines_lock:
        engine = _engines.get(alias)
    if engine is not None:
        return engine
    raw = connections[alias].connection
    module = type(raw).__module__.split(".")[0]
    dialect = _DIALECTS.get(module)
    if dialect is None:
        raise RuntimeError(
            f"cronjob: DATABASES[{alias!r}] connects with {module!r}; schedules can be "
            "written on PostgreSQL, MariaDB/MySQL or SQLite"
        )
    engine = sa.create_engine(
        f"{dialect}://",  # no URL to connect to: the creator lends Django's connection
        # Django's connection of the calling thread, taken anew for each call: Django
        # connections are per thread and are replaced after CONN_MAX_AGE.
        creator=lambda: _Lent(connections[alias].connection),
        poolclass=NullPool,
        pool_reset_on_return=None,
        # No dialect hook runs on Django's connection (notice handlers, type casters):
        # the dialect is initialised once, below, by plain queries.
        _initialize=False,
        # Nor is one registered by the dialect's initialisation.
        **({"use_native_hstore": False} if dialect.startswith("postgresql") else {}),
    )
    with engine.connect() as conn:
        engine.dialect.initialize(conn)
    with _engines_lock:
        return _engines.setdefault(alias, engine)


def _watch_key(alias: str) -> str | None:
    """How this process's schedulers name ``alias``'s database (``None``: none runs on
    it), so that one is told of a committed change at once."""
    from django.core.exceptions import ImproperlyConfigured

    from ._database import database_url

    if alias != database_alias():
        return None
    try:
        return sa.make_url(database_url()).render_as_string(hide_password=True)
    except ImproperlyConfigured:
        return None


def _run(using: str | None, call: Callable[[sa.Connection], _T], *, write: bool) -> _T:
    from django.db import connections, transaction

    alias = using if using is not None else database_alias()
    with transaction.atomic(using=alias):
        connections[alias].ensure_connection()
        engine = _engine(alias)
        with engine.connect() as conn:
            result = call(conn)
        key = _watch_key(alias) if write else None
        if key is not None:
            transaction.on_commit(lambda: _tell(key), using=alias)
        return result


def _tell(key: str) -> None:
    """Tell this process's schedulers on the database ``key`` names of a committed change
    (as `lease.tell_on_commit` does for a SQLAlchemy transaction)."""
    import lease

    lease.tell_schedules_changed(key)


def add(
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
    using: str | None = None,
    overlap: Overlap | str | None = None,
    catch_up: CatchUp | str | None = None,
    catch_up_window: float | timedelta | None = None,
    jitter: float | timedelta | None = None,
    heartbeat: str | None = None,
    now: datetime | None = None,
) -> bool:
    """[cronjob.schedules.add][] on Django's connection of ``using`` (by default
    ``CRONJOB_DATABASE``), in the current atomic block (or one of its own); ``now`` as
    there (the database's clock by default)."""
    return _run(
        using,
        lambda conn: _api.add(
            conn,
            id,
            task=task,
            spec=spec,
            at=at,
            args=args,
            start=start,
            end=end,
            paused=paused,
            if_exists=if_exists,
            registry=registry,
            overlap=overlap,
            catch_up=catch_up,
            catch_up_window=catch_up_window,
            jitter=jitter,
            heartbeat=heartbeat,
            now=now,
        ),
        write=True,
    )


def add_many(
    schedules: Iterable[New],
    *,
    if_exists: IfExists = "error",
    registry: Registry | None = None,
    using: str | None = None,
    now: datetime | None = None,
) -> int:
    """[cronjob.schedules.add_many][] on Django's connection (see `add`)."""
    news = builtins.list(schedules)
    return _run(
        using,
        lambda conn: _api.add_many(conn, news, if_exists=if_exists, registry=registry, now=now),
        write=True,
    )


def update(
    id: str,
    *,
    spec: str | None = _UNSET,
    at: datetime | None = _UNSET,
    args: dict[str, Any] = _UNSET,
    start: datetime | None = _UNSET,
    end: datetime | None = _UNSET,
    task: str = _UNSET,
    overlap: Overlap | str | None = _UNSET,
    catch_up: CatchUp | str | None = _UNSET,
    catch_up_window: float | timedelta | None = _UNSET,
    jitter: float | timedelta | None = _UNSET,
    heartbeat: str | None = _UNSET,
    using: str | None = None,
    now: datetime | None = None,
) -> bool:
    """[cronjob.schedules.update][] on Django's connection (see `add`): what is given
    changes; ``None`` clears ``start`` or ``end``, and gives a policy back to the task."""
    return _run(
        using,
        lambda conn: _api.update(
            conn,
            id,
            spec=spec,
            at=at,
            args=args,
            start=start,
            end=end,
            task=task,
            overlap=overlap,
            catch_up=catch_up,
            catch_up_window=catch_up_window,
            jitter=jitter,
            heartbeat=heartbeat,
            now=now,
        ),
        write=True,
    )


def remove(id: str, *, using: str | None = None, now: datetime | None = None) -> bool:
    """[cronjob.schedules.remove][] on Django's connection (see `add`)."""
    return _run(using, lambda conn: _api.remove(conn, id, now=now), write=True)


def get(id: str, *, using: str | None = None) -> ScheduleRecord | None:
    """[cronjob.schedules.get][] on Django's connection (see `add`)."""
    return _run(using, lambda conn: _api.get(conn, id), write=False)


def list(
    *, task: str | None = None, prefix: str | None = None, using: str | None = None
) -> builtins.list[ScheduleRecord]:
    """[cronjob.schedules.list][] on Django's connection (see `add`)."""
    return _run(using, lambda conn: _api.list(conn, task=task, prefix=prefix), write=False)


def pause(
    id: str, *, reason: str | None = None, by: str | None = None, using: str | None = None
) -> bool:
    """Pause the schedule ``id`` on every replica, as [cronjob.admin.pause][] pauses a
    job, on Django's connection (see `add`): from its next instant no replica claims it,
    a round running now runs to its end; noted in its history. ``by`` is who (``user@host``
    of this process by default), ``reason`` why. Returns whether it changed: ``False``
    for no live schedule ``id``, or one paused already.

    Raises:
        ValueError: ``by`` is empty or too long, ``reason`` longer than
            `cronjob.admin.REASON_LENGTH`; nothing was written.
    """
    return _paused(id, paused=True, reason=reason, by=by, using=using)


def resume(id: str, *, by: str | None = None, using: str | None = None) -> bool:
    """Resume the schedule ``id``: its next instant runs as usual, the instants skipped
    while paused never run (as [cronjob.admin.resume][] without ``catch_up``). Returns
    whether it changed: ``False`` for no live schedule ``id``, or one not paused. Raises
    as `pause`."""
    return _paused(id, paused=False, reason=None, by=by, using=using)


def _paused(
    id: str, *, paused: bool, reason: str | None, by: str | None, using: str | None
) -> bool:
    import lease

    from ...admin._base import operator

    who = operator() if by is None else by

    def call(conn: sa.Connection) -> bool:
        if lease.taken_schedule_ids(conn, [id]).get(id) is not False:
            return False  # none, or a tombstone
        return bool(lease.set_paused_on(conn, [id], paused=paused, by=who, reason=reason))

    if not isinstance(id, str) or not id:
        return False
    return _run(using, call, write=False)
