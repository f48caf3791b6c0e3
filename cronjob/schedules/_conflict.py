"""A writer's snapshot that another writer of schedules overtook, refused by its id.

A caller's transaction under REPEATABLE READ (MariaDB/MySQL's default, PostgreSQL's when
asked) reads from a snapshot taken at its first statement. Every write of schedules
locks the change counter and reads the rows it replaces with locking reads, which see
the latest commit on MariaDB/MySQL; PostgreSQL instead refuses to lock a row changed
after the snapshot (a serialization failure, SQLSTATE 40001), as does MariaDB with
``innodb_snapshot_isolation`` (error 1020). That transaction cannot write any more: the
call is refused with a `ScheduleError` naming the schedule, which the caller runs again
in a new transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

import sqlalchemy as sa

import lease

from .._exceptions import ScheduleError

__all__ = ["refusing_overtaken"]

#: PostgreSQL's serialization_failure (MariaDB/MySQL give it to deadlocks too: those
#: are not a snapshot's, and stay the database's error).
_PG_SERIALIZATION: Final = "40001"
#: MariaDB's ER_CHECKREAD: "Record has changed since last read" (snapshot isolation).
_MYSQL_CHECKREAD: Final = 1020


def _overtaken(exc: lease.LeaseError) -> bool:
    """Whether ``exc`` is the database refusing a write from a snapshot that another
    transaction's commit overtook."""
    cause = exc.__cause__
    if not isinstance(cause, sa.exc.DBAPIError):
        return False
    orig = cause.orig
    if getattr(orig, "sqlstate", None) == _PG_SERIALIZATION:
        return True
    # MariaDB/MySQL drivers give the error number first; PostgreSQL's give a message.
    args: tuple[object, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] == _MYSQL_CHECKREAD


@contextlib.contextmanager
def refusing_overtaken(id_: str) -> Iterator[None]:
    """Raise `ScheduleError` naming ``id_`` for a write the database refuses because the
    caller's snapshot was taken before another writer of schedules committed.

    Raises:
        ScheduleError: the caller's transaction read before another writer committed, and
            the database (REPEATABLE READ or stricter) cannot let it write; nothing of the
            call was written, and the transaction must be rolled back and run again.
    """
    try:
        yield
    except lease.LeaseError as exc:
        if not _overtaken(exc):
            raise
        raise ScheduleError(
            f"schedule {id_!r}: another transaction changed schedules after this "
            "transaction's snapshot was taken (REPEATABLE READ); roll it back and run it again"
        ) from exc
