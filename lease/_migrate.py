"""Bring the lease tables to the head revision, under a lock.

The migrations are alembic's, configured here in code (no ``alembic.ini``, and no
``logging.config.fileConfig``: the application's logging is its own). Their version
table is `VERSION_TABLE`, so an application's own alembic history
is never touched. Each [migrate][lease.migrate] logs one INFO line of its own on the ``lease``
logger (the revision, and what it did); alembic's lines are DEBUG records meanwhile
(`lease._alembic_log`).

Alembic is imported only when there is something to migrate: a database already at head
(every start but the first after a release) is read with two plain statements, so a
process that starts on it never imports alembic, which is about a fifth of the time
``import cronjob`` takes. A database never migrated is not taken through every revision:
its tables are created as the head defines them and it is stamped at head
(`_create_at_head`); upgrades from an earlier revision run the revisions.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ._alembic_log import alembic_at_debug

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

from ._engine import behind_transaction_pooler, is_sqlite_memory
from ._exceptions import MigrationFailed, MigrationRequired, translate_errors
from ._schema import VERSION_TABLE, metadata, schedule_rev_table
from ._store import check_dialect

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["current_revision", "head_revision", "migrate", "migrations_location"]

logger = logging.getLogger("lease")

# pg_advisory_lock takes a bigint; derive one from a name no one else would pick.
_PG_LOCK_KEY: Final = int.from_bytes(
    hashlib.sha256(b"cronjob_lease migrate").digest()[:8], "big", signed=True
)
# GET_LOCK is server-wide on MySQL/MariaDB: name the database too (64 characters at most).
_MYSQL_LOCK_NAME: Final = "LEFT(CONCAT('cronjob_lease migrate ', DATABASE()), 64)"
# How long a replica waits for another one's migration on MySQL/MariaDB, in seconds.
_MYSQL_LOCK_TIMEOUT: Final = 600


def migrations_location() -> Path:
    """Find the migrations: the package data of an installed wheel, else the checkout's.

    An installed wheel carries them as ``lease/_migrations``; a checkout (an editable
    install included) has them at the top of the repository, in ``alembic/``.

    Raises:
        MigrationFailed: neither place holds them.
    """
    packaged = importlib.resources.files("lease") / "_migrations"
    # Alembic reads a directory of files; a zipped install has none to give it.
    if isinstance(packaged, Path) and (packaged / "env.py").is_file():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "alembic"
    if (checkout / "env.py").is_file():
        return checkout
    raise MigrationFailed(f"the lease migrations are missing: looked in {packaged} and {checkout}")


def head_revision() -> str:
    """The head revision of the migrations this package ships."""
    with alembic_at_debug():
        head = _script().get_current_head()
    if head is None:  # pragma: no cover - the package ships at least one revision
        raise MigrationFailed("the lease migrations have no head revision")
    return head


@functools.cache
def shipped_head() -> str:
    """The head revision, read from the names of the revision files, without alembic.

    The rule of these migrations: each revision's id is the number its file name starts
    with (``0018_prev_start.py`` is ``0018``) and each revises the one before, so the
    head is the greatest (tests/test_migrations.py checks it against alembic's).
    """
    versions = migrations_location() / "versions"
    numbers = [p.name.split("_", 1)[0] for p in versions.glob("*.py")]
    found = [n for n in numbers if n.isdigit()]
    if not found:  # pragma: no cover - the package ships at least one revision
        raise MigrationFailed(f"the lease migrations have no revision in {versions}")
    return max(found, key=int)


def current_revision(engine: Engine) -> str | None:
    """The revision the lease tables are at; ``None`` on a database never migrated."""
    with translate_errors("read the lease tables' revision"), engine.connect() as conn:
        return _current(conn)


def migrate(engine: Engine, *, auto_migrate: bool = True) -> None:
    """Bring the lease tables to the head revision.

    Replicas that start together do not race: the upgrade runs under a lock —
    ``pg_advisory_lock`` on PostgreSQL, ``GET_LOCK`` on MySQL/MariaDB, an exclusive
    ``fcntl`` lock on a file beside the database on SQLite (none for an in-memory
    database, which no other process can open). A replica that waited finds the tables
    at head and does nothing. A database already at head is not locked at all, nor one
    that a newer release migrated with additive revisions (numbered ``0002``, ``0003``,
    …: see `_newer_additive`), which this release runs beside as it is.

    Logs one INFO line on the ``lease`` logger: ``lease schema at 0004`` (nothing to
    do), ``lease schema created at 0004`` (a database never migrated), ``lease schema
    at 0004, upgraded from 0002``, or that a newer release's revision is run beside.
    Alembic's own lines are DEBUG records (on this thread, for the duration).

    Args:
        engine: the database; not disposed.
        auto_migrate: ``False`` makes a database that is not at head an error instead
            of something to fix.

    Raises:
        UnsupportedDatabase: the dialect cannot carry leases.
        MigrationRequired: ``auto_migrate`` is ``False`` and the tables are not at head.
        MigrationFailed: the migrations cannot be found, the lock cannot be had, the
            database is at a revision these migrations do not know and that is not a
            newer additive one, or alembic fails.
        DatabaseUnavailable, DatabaseError: the database failed a statement.
    """
    check_dialect(engine)
    with alembic_at_debug():
        done = _migrate(engine, auto_migrate=auto_migrate)
    if done is not None:
        logger.info("%s", done)


def _migrate(engine: Engine, *, auto_migrate: bool) -> str | None:
    """[migrate][lease.migrate]'s work; returns its line for the log (``None``: said already)."""
    head = shipped_head()
    with translate_errors("migrate the lease tables"), engine.connect() as conn:
        current = _current(conn)
        conn.rollback()
        if _newer_additive(current, head):
            return None
        if current == head:
            return f"lease schema at {head}"
        import alembic.util  # there is something to migrate: alembic from here on

        script = _script()
        _check_known(script, current, head)
        if not auto_migrate:
            raise MigrationRequired(
                f"the lease tables are at revision {current or 'none (never migrated)'}"
                f" but the head is {head}; run lease.migrate() or allow auto_migrate"
            )
        pooled = behind_transaction_pooler(engine)
        with _migration_lock(engine, conn, pooled=pooled):
            current = _current(conn)
            # End the transaction that read the revision: alembic then begins and
            # commits its own, instead of leaving the upgrade to an outer one. Behind
            # a transaction pooler the lock lasts as long as that transaction: the
            # upgrade runs in it (alembic joins a transaction it finds open).
            if not pooled:
                conn.commit()
            if _newer_additive(current, head):
                return None
            if current == head:  # another replica migrated while this one waited
                return f"lease schema at {head}"
            _check_known(script, current, head)
            try:
                if current is None:
                    _create_at_head(conn, script)
                else:
                    _upgrade(conn)
            except alembic.util.CommandError as exc:
                raise MigrationFailed(f"migrating the lease tables failed: {exc}") from exc
            conn.commit()
    if current is None:
        return f"lease schema created at {head}"
    return f"lease schema at {head}, upgraded from {current}"


def _config() -> Config:
    from alembic.config import Config

    config = Config()
    # ConfigParser interpolates '%': a path holding one must escape it.
    config.set_main_option("script_location", str(migrations_location()).replace("%", "%%"))
    config.set_main_option("version_table", VERSION_TABLE)
    return config


@functools.cache
def _script() -> ScriptDirectory:
    """The migrations, read once a process: alembic reads (and compiles) every revision
    file each time it builds one, which cost more than the upgrade of a new database."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


def _upgrade(conn: Connection) -> None:
    """Upgrade to head on ``conn``: what ``alembic.command.upgrade(config, "head")``
    does, with the revisions already read (`_script`) instead of read again."""
    from alembic.runtime.environment import EnvironmentContext

    config = _config()
    config.attributes["connection"] = conn
    script = _script()

    def revisions(current: str, context: MigrationContext) -> Any:
        return script._upgrade_revs("head", current)  # as alembic's own command does

    with EnvironmentContext(config, script, fn=revisions, destination_rev="head"):
        script.run_env()


def _create_at_head(conn: Connection, script: ScriptDirectory) -> None:
    """Create the tables of a database never migrated as the head defines them, then
    stamp it at head: alembic's way to build a new database, a dozen statements where
    running every revision took about forty, and a third of the time on MariaDB.

    The revisions' data is written as they write it: the change counter's one row (0008).
    tests/test_migrations_created.py checks that both ways give the same tables, columns,
    server defaults, keys, indexes and rows on every supported database.

    Raises:
        MigrationFailed: a lease table is there without a revision on record (a first
            migration that died on a server whose DDL commits, or tables made by hand):
            nothing is created or stamped over it.
    """
    from alembic.runtime.migration import MigrationContext

    found = sorted(set(sa.inspect(conn).get_table_names()) & set(metadata.tables))
    if found:
        raise MigrationFailed(
            f"the lease tables {', '.join(found)} exist but no revision is on record in "
            f"{VERSION_TABLE}: drop them (they hold nothing a migration made whole) or "
            "stamp the revision they are at with alembic"
        )
    metadata.create_all(conn, checkfirst=False)
    conn.execute(schedule_rev_table.insert(), [{"id": 1, "rev": 0}])
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    context.stamp(script, "head")


def _current(conn: Connection) -> str | None:
    """The revision in the version table (as alembic reads it: ``None`` without the table
    or a row), with plain statements: no alembic."""
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return None
    found = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(found) > 1:  # pragma: no cover - these migrations have one line of history
        raise MigrationFailed(f"the lease tables are at several revisions: {sorted(found)}")
    return found[0] if found else None


def _newer_additive(current: str | None, head: str) -> bool:
    """Whether ``current`` is a newer release's revision that this release runs beside.

    The rule of these migrations: a revision named by digits alone (``0002``, ``0003``)
    only adds — nullable columns, tables, indexes — so the statements of every earlier
    release keep working on it, and a replica of the previous release can still start
    (and restart) during a rolling deploy. A migration that breaks this must take a name
    that is not digits alone, which earlier releases refuse.
    """
    if current is None or not (current.isdigit() and head.isdigit()) or int(current) <= int(head):
        return False
    logger.info(
        "the lease tables are at revision %s, newer than this release's %s: a newer "
        "release migrated them, adding only; running beside it without migrating",
        current,
        head,
    )
    return True


def _check_known(script: ScriptDirectory, current: str | None, head: str) -> None:
    import alembic.util

    if current is None:
        return
    try:
        script.get_revision(current)
    except alembic.util.CommandError as exc:
        raise MigrationFailed(
            f"the lease tables are at revision {current!r}, which these migrations "
            f"(head {head}) do not know and that is not a newer additive revision: was "
            "the database migrated by a newer release that this one cannot run beside?"
        ) from exc


@contextlib.contextmanager
def _migration_lock(engine: Engine, conn: Connection, *, pooled: bool) -> Iterator[None]:
    dialect = engine.dialect.name
    if pooled:
        # A session lock would stay on whichever server connection the pooler lent,
        # held for no one, and the unlock would go to another: lock the transaction.
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
        yield
    elif dialect == "postgresql":
        # Session-level: outlives the transactions the upgrade commits, and dies with
        # the session if this process does.
        conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK_KEY})
        conn.commit()
        try:
            yield
        finally:
            _unlock(conn, sa.text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK_KEY})
    elif dialect in ("mysql", "mariadb"):
        got = conn.execute(
            sa.text(f"SELECT GET_LOCK({_MYSQL_LOCK_NAME}, :timeout)"),
            {"timeout": _MYSQL_LOCK_TIMEOUT},
        ).scalar()
        conn.commit()
        if got != 1:
            raise MigrationFailed(
                f"could not lock the lease migrations within {_MYSQL_LOCK_TIMEOUT} s"
                " (another replica is migrating)"
            )
        try:
            yield
        finally:
            _unlock(conn, sa.text(f"SELECT RELEASE_LOCK({_MYSQL_LOCK_NAME})"), {})
    else:
        with _sqlite_file_lock(engine):
            yield


def _unlock(conn: Connection, statement: sa.TextClause, params: dict[str, int]) -> None:
    try:
        if conn.in_transaction():
            conn.rollback()
        conn.execute(statement, params)
        conn.commit()
    except sa.exc.SQLAlchemyError:
        # The lock belongs to the session: closing the connection for good frees it.
        conn.invalidate()


@contextlib.contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    database = engine.url.database or ""
    if is_sqlite_memory(engine.url) or fcntl is None:
        yield
        return
    if database.startswith("file:"):  # a URI filename (?uri=true)
        database = database[len("file:") :].split("?", 1)[0]
    # Beside the database, named like SQLite's own -wal and -shm files. Never deleted:
    # removing a lock file another process has open would let a third lock a new one.
    path = f"{database}-migrate-lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
