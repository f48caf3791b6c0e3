"""What [cronjob.admin][]'s readers and writers share: the errors, the store on a
database at this release's revision (never migrated), who the operator is, and times."""

from __future__ import annotations

import contextlib
import enum
import getpass
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Final, TypeVar

import sqlalchemy as sa

import lease

from .._exceptions import CronjobError

#: A replica not seen for this long is not shown as live (four sweeps missed).
REPLICA_LIVE_SECONDS: Final = 60.0
#: The revision of the tables this release reads.
REVISION: Final = "0018"

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_E = TypeVar("_E", bound=enum.StrEnum)


class StatusError(CronjobError):
    """Raised when the database cannot answer: the root of the errors below."""


class TablesMissing(StatusError, LookupError):
    """Raised when the database has no cronjob tables: no replica ever started on it."""


class SchemaOutdated(StatusError):
    """Raised when the cronjob tables are at an older revision than this release reads."""


class SchemaNewer(StatusError):
    """Raised when the cronjob tables are at a revision this release does not know."""


class UnknownJob(CronjobError, LookupError):
    """Raised when no job of that name is on record."""


def operator() -> str:
    """``user@host`` of this process: who pauses or resumes unless told."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


@contextlib.contextmanager
def store_on(database: str | sa.Engine) -> Iterator[lease.LeaseStore]:
    """A store on ``database`` whose tables are at this release's revision (it never migrates)."""
    if isinstance(database, sa.Engine):
        engine, owned = database, False
    elif isinstance(database, str):
        refuse_missing_file(database)
        engine, owned = lease.create_engine(database), True
    else:
        raise TypeError(f"database must be a URL or an Engine, not {type(database).__name__}")
    try:
        check_revision(engine)
        yield lease.LeaseStore(engine)
    finally:
        if owned:
            engine.dispose()


def refuse_missing_file(url: str) -> None:
    """A SQLite URL naming a file that does not exist: say so, and do not create it (as
    connecting would)."""
    parsed = sa.make_url(url)
    path = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or path in ("", ":memory:"):
        return
    if path.startswith("file:"):
        path = path[len("file:") :].split("?", 1)[0]
    if not os.path.exists(path):
        raise TablesMissing(
            f"no cronjob tables: the SQLite file {path} does not exist (no replica has "
            "started on it; nothing was changed)"
        )


def check_revision(engine: sa.Engine) -> None:
    revision = lease.current_revision(engine)
    if revision == REVISION:
        return
    if revision is None:
        where = lease.redact(str(engine.url.render_as_string(hide_password=True)))
        raise TablesMissing(
            f"no cronjob tables in {where}: no replica has started on this database "
            "(a replica creates them as it starts; nothing was changed)"
        )
    if revision < REVISION and revision.isdigit():
        raise SchemaOutdated(
            f"the cronjob tables are at revision {revision}, older than {REVISION}, which "
            "this release reads: start a replica of this release (it migrates at start) or "
            "run lease.migrate(); nothing was changed"
        )
    raise SchemaNewer(
        f"the cronjob tables are at revision {revision}, which this release (revision "
        f"{REVISION}) does not know: use the release that migrated them"
    )


def as_enum(kind: type[_E], value: str | None) -> _E | str | None:
    """``value`` as a member of ``kind``; a value a newer release wrote stays a string."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        return value


def aware(when: datetime, what: str) -> datetime:
    if not isinstance(when, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(when).__name__}")
    if when.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, not naive {when!r}")
    return when


def to_ms(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(milliseconds=1)


def at_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)
