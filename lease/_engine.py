"""Engines configured for leases, and URLs made safe to print."""

from __future__ import annotations

import importlib.util
import re
import socket
import sqlite3
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine

from ._exceptions import DatabaseError, UnsupportedDatabase, translate_errors

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "POOL_SIZE",
    "SQLITE_BUSY_TIMEOUT",
    "async_url",
    "behind_transaction_pooler",
    "create_async_engine",
    "create_engine",
    "is_async_url",
    "is_sqlite_memory",
    "redact",
    "refuse_sqlite_memory",
    "sync_url",
]

#: How long, in seconds, a SQLite writer waits for another process's write lock
#: before the statement fails with "database is locked".
SQLITE_BUSY_TIMEOUT = 30.0

#: The connections a server engine made here keeps, and the most it opens at once
#: (``pool_size``, with ``max_overflow=0``): as many as SQLAlchemy's default pool opened
#: at most (5 + 10 overflow), but kept once opened. A pool that overflowed closed each
#: connection past its 5 when it came back, so every burst of rounds (the instants of
#: many hand-off jobs falling together) opened new ones: hundreds a minute.
POOL_SIZE = 15

#: libpq settings for PostgreSQL connections made here, unless the URL sets them: a
#: connection whose peer vanished (a network partition, a black-holed route) fails
#: within seconds instead of hanging for the kernel's retransmission time (~15 min).
#: ``tcp_user_timeout`` only fires when sent data stays unacknowledged, so a long query
#: the server is working on is never cut.
POSTGRES_CONNECT_DEFAULTS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}

#: Socket settings for MariaDB/MySQL connections made here with PyMySQL, which has no
#: option for them: the same liveness as `POSTGRES_CONNECT_DEFAULTS` (keepalive
#: probes after 5 s idle, 2 s apart, 3 of them; a 10 s TCP user timeout), as
#: ``(level, option name, value)``. Options the platform lacks are left out.
MYSQL_SOCKET_OPTIONS: tuple[tuple[int, str, int], ...] = (
    (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
    (socket.IPPROTO_TCP, "TCP_KEEPIDLE", POSTGRES_CONNECT_DEFAULTS["keepalives_idle"]),
    (socket.IPPROTO_TCP, "TCP_KEEPINTVL", POSTGRES_CONNECT_DEFAULTS["keepalives_interval"]),
    (socket.IPPROTO_TCP, "TCP_KEEPCNT", POSTGRES_CONNECT_DEFAULTS["keepalives_count"]),
    (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", POSTGRES_CONNECT_DEFAULTS["tcp_user_timeout"]),
)

#: PyMySQL's connect timeout, in seconds, for connections made here unless the URL's
#: query sets ``connect_timeout``.
MYSQL_CONNECT_TIMEOUT = POSTGRES_CONNECT_DEFAULTS["connect_timeout"]

#: The sync driver that runs the lease statements for each async driver (URL driver
#: names). ``postgresql+psycopg`` on an AsyncEngine is psycopg's async mode.
SYNC_DRIVERS = {
    "asyncpg": "psycopg",
    "psycopg_async": "psycopg",
    "psycopg": "psycopg",
    "aiosqlite": "pysqlite",
    "aiomysql": "pymysql",
    "asyncmy": "pymysql",
}

#: The async drivers tried, in order, for a database named by a sync URL, as
#: ``(URL driver name, module it needs)``; the first installed one is used.
ASYNC_DRIVERS = {
    "postgresql": (("psycopg_async", "psycopg"), ("asyncpg", "asyncpg")),
    "sqlite": (("aiosqlite", "aiosqlite"),),
    "mysql": (("aiomysql", "aiomysql"), ("asyncmy", "asyncmy")),
    "mariadb": (("aiomysql", "aiomysql"), ("asyncmy", "asyncmy")),
}

#: PyMySQL's URL options that aiomysql and asyncmy do not take (and need not: they use
#: no TLS unless given a context), dropped from a URL given to those drivers.
PYMYSQL_ONLY_OPTIONS = ("ssl_disabled",)

#: What to install for the async drivers of each database (extras of ``cronjob-lease``).
ASYNC_EXTRAS = {
    "postgresql": "cronjob-lease[postgres-async] (psycopg and greenlet), or asyncpg and greenlet",
    "sqlite": "cronjob-lease[sqlite-async] (aiosqlite and greenlet)",
    "mysql": "cronjob-lease[mysql-async] (aiomysql and greenlet)",
    "mariadb": "cronjob-lease[mysql-async] (aiomysql and greenlet)",
}

#: The URL query parameter that says PostgreSQL is reached through a transaction pooler
#: (PgBouncer's ``pool_mode = transaction``): ``?pooler=transaction``. The engine's URL
#: keeps it; the driver never sees it (see `behind_transaction_pooler`).
POOLER_PARAMETER = "pooler"

#: Execution option naming how a SQLite transaction of an engine made here begins:
#: "IMMEDIATE" (the default: takes the write lock at BEGIN) or "DEFERRED" (for reads).
SQLITE_BEGIN_OPTION = "lease_sqlite_begin"


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """Create an engine suited to the lease statements, for the database at ``url``.

    - SQLite file: exactly one connection per process (``pool_size=1``,
      ``max_overflow=0``, usable from any thread), WAL journal, a busy timeout of
      `SQLITE_BUSY_TIMEOUT` seconds, and every transaction opened with
      ``BEGIN IMMEDIATE`` (the pysqlite recipe in SQLAlchemy's documentation), so writers
      in several processes queue on the file lock instead of failing on a read lock
      they cannot upgrade.
    - SQLite in memory (``sqlite://``, ``:memory:``, ``file::memory:``,
      ``mode=memory``): refused (see `refuse_sqlite_memory`).
    - Any other database: ``pool_pre_ping=True`` (a connection the server closed is
      replaced, not handed out), ``READ COMMITTED`` isolation, which the lease
      statements are written for, and a pool of `POOL_SIZE` connections opened as needed
      and kept (``max_overflow=0``), unless ``pool_size``, ``max_overflow``, ``poolclass`` or
      ``pool`` is given.
    - PostgreSQL with psycopg: also TCP keepalives and a TCP user timeout
      (`POSTGRES_CONNECT_DEFAULTS`, each unless the URL's query sets it).
    - MariaDB/MySQL with PyMySQL: the same TCP keepalives and user timeout, set on each
      new connection's socket (`MYSQL_SOCKET_OPTIONS`), and a connect timeout of
      `MYSQL_CONNECT_TIMEOUT` seconds unless the URL's query sets one.

    - PostgreSQL behind a transaction pooler (``?pooler=transaction`` in the URL, see
      [behind_transaction_pooler][lease.behind_transaction_pooler]): no server-side prepared
      statements (psycopg's ``prepare_threshold=None``), since a statement prepared on one
      server connection is not on the next; the parameter itself never reaches the driver.

    Keyword arguments are passed to `sqlalchemy.create_engine` and win.

    Raises:
        DatabaseError: the URL does not parse, names no installed dialect, or has a
            ``pooler`` parameter this package cannot honour.
        UnsupportedDatabase: the URL names an in-memory SQLite database.
    """
    with translate_errors("create engine"):
        parsed = sa.make_url(url)
    refuse_sqlite_memory(url)
    with translate_errors("create engine"):  # the driver's name loads the dialect
        options, kwargs = _engine_options(parsed, kwargs)
        engine = sa.create_engine(parsed, **(options | kwargs))
    _configure(engine, parsed)
    return engine


def create_async_engine(url: str | URL, **kwargs: Any) -> AsyncEngine:
    """Create an `AsyncEngine` with the settings of
    [create_engine][lease.create_engine], for jobs' ``transaction_async``.

    The same settings as a sync engine get, where the async driver has them: SQLite's
    WAL journal, busy timeout and ``BEGIN IMMEDIATE`` (aiosqlite; a pool of several
    connections, each waiting on the file lock in the driver's thread, not on the loop);
    ``pool_pre_ping`` and ``READ COMMITTED`` on the servers; the libpq keepalives and
    TCP user timeout with psycopg's async mode. asyncpg, aiomysql and asyncmy get no
    keepalive settings (they have no such options). Behind a transaction pooler,
    psycopg's async mode prepares no statements; asyncpg, which always does, is refused.

    Raises:
        DatabaseError: the URL does not parse, names no installed dialect, or its driver
            (or greenlet, which SQLAlchemy's asyncio support needs) is not installed;
            or its ``pooler`` parameter cannot be honoured.
        UnsupportedDatabase: the URL names an in-memory SQLite database.
    """
    with translate_errors("create engine"):
        parsed = sa.make_url(url)
    refuse_sqlite_memory(url)
    _require_async_support(parsed)
    # Imported only here: importing it without greenlet raises ImportError.
    from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

    with translate_errors("create engine"):
        options, kwargs = _engine_options(parsed, kwargs)
    if parsed.get_backend_name() == "sqlite":
        # Several connections, unlike the sync engine's one: async jobs run side by
        # side on one loop, and each waits for the file lock in aiosqlite's thread.
        options.pop("pool_size")
        options.pop("max_overflow")
        options["connect_args"].pop("check_same_thread")
    with translate_errors("create engine"):
        engine = sa_create_async_engine(parsed, **(options | kwargs))
    _configure(engine.sync_engine, parsed)
    return engine


def is_async_url(url: str | URL) -> bool:
    """Tell whether ``url`` names an asyncio driver (``postgresql+asyncpg``, ...).

    Raises:
        DatabaseError: the URL does not parse or names no installed dialect.
    """
    with translate_errors("read the database URL"):
        return bool(sa.make_url(url).get_dialect().is_async)


def sync_url(url: str | URL) -> URL:
    """Return ``url`` (an async driver's) with the sync driver the lease statements use.

    ``postgresql+asyncpg`` and ``postgresql+psycopg_async`` become ``postgresql+psycopg``,
    ``sqlite+aiosqlite`` becomes ``sqlite+pysqlite``, ``mysql+aiomysql`` and
    ``mysql+asyncmy`` become ``mysql+pymysql`` (``mariadb+`` alike). Everything else in
    the URL (credentials, host, database, query) is kept.

    Raises:
        DatabaseError: no sync driver is known for the URL's driver.
    """
    with translate_errors("read the database URL"):
        parsed = sa.make_url(url)
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    sync = SYNC_DRIVERS.get(driver)
    if sync is None:
        raise DatabaseError(
            f"no sync driver is known for {backend}+{driver} to run the lease statements; "
            f"use one of {', '.join(sorted(SYNC_DRIVERS))}"
        )
    return parsed.set(drivername=f"{backend}+{sync}")


def async_url(url: str | URL) -> URL:
    """Return ``url`` (a sync driver's) with the first installed async driver.

    PostgreSQL: psycopg's async mode, else asyncpg; SQLite: aiosqlite; MariaDB/MySQL:
    aiomysql, else asyncmy, without PyMySQL's ``ssl_disabled`` (they take no such option,
    and use no TLS unless given a context). A URL that already names an async driver is
    returned as is.

    Raises:
        DatabaseError: none of the database's async drivers, or greenlet, is installed
            (the message says what to install), or the URL does not parse.
    """
    with translate_errors("read the database URL"):
        parsed = sa.make_url(url)
        if parsed.get_dialect().is_async:
            return parsed
    backend = parsed.get_backend_name()
    candidates = ASYNC_DRIVERS.get(backend, ())
    if backend in ("mysql", "mariadb"):
        parsed = parsed.difference_update_query(PYMYSQL_ONLY_OPTIONS)
    for driver, module in candidates:
        if importlib.util.find_spec(module) is not None:
            found = parsed.set(drivername=f"{backend}+{driver}")
            _require_async_support(found)
            return found
    if not candidates:
        raise DatabaseError(f"no async driver is known for the {backend!r} database")
    raise DatabaseError(
        f"an async transaction on {backend} needs an async driver: install {ASYNC_EXTRAS[backend]}"
    )


def _require_async_support(parsed: URL) -> None:
    # Without greenlet, SQLAlchemy fails only at the first statement, from deep inside.
    if importlib.util.find_spec("greenlet") is None:
        backend = parsed.get_backend_name()
        extra = ASYNC_EXTRAS.get(backend, "greenlet")
        raise DatabaseError(
            f"SQLAlchemy's asyncio support needs greenlet, which is not installed: install {extra}"
        )


def _engine_options(parsed: URL, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The engine options for ``parsed``, and the caller's ``kwargs`` left to merge last."""
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    pooled = behind_transaction_pooler(parsed)
    if backend == "sqlite":
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT}
        kwargs = dict(kwargs)
        connect_args |= kwargs.pop("connect_args", {})
        return {"pool_size": 1, "max_overflow": 0, "connect_args": connect_args}, kwargs
    options: dict[str, Any] = {"pool_pre_ping": True}
    if not {"pool_size", "max_overflow", "poolclass", "pool"} & kwargs.keys():
        options |= {"pool_size": POOL_SIZE, "max_overflow": 0}
    if backend in ("postgresql", "mysql", "mariadb"):
        options["isolation_level"] = "READ COMMITTED"
    if pooled and driver == "asyncpg":
        raise DatabaseError(
            "asyncpg prepares every statement, which a transaction pooler does not keep "
            "from one transaction to the next: use postgresql+psycopg behind it"
        )
    if backend == "postgresql" and driver in ("psycopg", "psycopg_async"):
        defaults = POSTGRES_CONNECT_DEFAULTS.items()
        options["connect_args"] = {k: v for k, v in defaults if k not in parsed.query}
        if pooled:  # psycopg prepares a statement run 5 times; never behind a pooler
            options["connect_args"]["prepare_threshold"] = None
    mysql = backend in ("mysql", "mariadb") and driver in ("pymysql", "aiomysql")
    if mysql and "connect_timeout" not in parsed.query:
        options["connect_args"] = {"connect_timeout": MYSQL_CONNECT_TIMEOUT}
    return options, kwargs


def _configure(engine: Engine, parsed: URL) -> None:
    """Install the per-connection settings of [create_engine][lease.create_engine] on ``engine``."""
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if POOLER_PARAMETER in parsed.query:
        event.listen(engine, "do_connect", _drop_pooler_parameter)
    if backend == "sqlite":
        _install_sqlite_recipe(engine)
    elif backend in ("mysql", "mariadb") and driver == "pymysql":
        event.listen(engine, "connect", _set_mysql_socket_options)


def behind_transaction_pooler(bind: str | URL | Engine) -> bool:
    """Tell whether ``bind``'s URL says PostgreSQL is reached through a transaction pooler.

    Say so with ``?pooler=transaction`` in the URL (PgBouncer's ``pool_mode =
    transaction``, or any pooler that hands each transaction a server connection of its
    choosing). Behind one, nothing may rely on the state of a session: the engines of
    [create_engine][lease.create_engine] prepare no statements, the store bounds its
    statements in each transaction (``SET LOCAL``) instead of on the session, a migration
    locks for its transaction only, and the scheduler does not ``LISTEN`` (its sweep takes
    requests). A session-pooling pooler needs no parameter.

    Raises:
        DatabaseError: the URL does not parse, its ``pooler`` is another value than
            ``transaction``, or it names a database other than PostgreSQL.
    """
    with translate_errors("read the database URL"):
        parsed = bind.url if isinstance(bind, Engine) else sa.make_url(bind)
    value = parsed.query.get(POOLER_PARAMETER)
    if value is None:
        return False
    if value != "transaction":
        raise DatabaseError(
            f"the URL's {POOLER_PARAMETER}={value!r} is not understood: "
            f"{POOLER_PARAMETER}=transaction says a transaction pooler is in between; "
            "a session pooler needs nothing"
        )
    if parsed.get_backend_name() != "postgresql":
        raise DatabaseError(
            f"{POOLER_PARAMETER}=transaction is for PostgreSQL (PgBouncer), "
            f"not {parsed.get_backend_name()}"
        )
    return True


def _drop_pooler_parameter(
    dialect: Any, conn_rec: Any, cargs: tuple[Any, ...], cparams: dict[str, Any]
) -> None:
    # The engine's URL keeps ``pooler`` (the store reads it there); the driver would
    # refuse it ("invalid connection option").
    cparams.pop(POOLER_PARAMETER, None)


def is_sqlite_memory(url: str | URL) -> bool:
    """Tell whether ``url`` names an in-memory SQLite database (no file to lock).

    ``sqlite://``, ``sqlite:///:memory:``, a ``file::memory:`` URI filename and any URI
    with ``mode=memory``.
    """
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return False
    database = parsed.database or ""
    return (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or parsed.query.get("mode") == "memory"
    )


def refuse_sqlite_memory(url: str | URL) -> None:
    """Refuse an in-memory SQLite database: it cannot carry leases.

    Its one connection would have to be shared by every thread (a second connection
    opens another, empty database), with no lock between them: the lease statements the
    scheduler runs would execute inside whatever transaction a job had open on it, and
    commit or roll back with the job's work. A file gives each process its own
    connection and the file lock to queue on.

    Raises:
        UnsupportedDatabase: ``url`` names an in-memory SQLite database.
    """
    if is_sqlite_memory(url):
        # As written, when given as written: make_url would percent-encode the colons.
        shown = _redact_unparsed(url) if isinstance(url, str) else unquote(redact(url))
        raise UnsupportedDatabase(
            f"the in-memory SQLite database {shown!r} cannot carry leases: its one "
            "connection would be shared by every thread, so lease statements would run "
            "inside jobs' transactions; use a file, e.g. 'sqlite:///cronjob.sqlite'"
        )


def _set_mysql_socket_options(dbapi_connection: Any, connection_record: Any) -> None:
    # Without them, a connection whose peer vanished (a partition, a black-holed route)
    # hangs for the kernel's retransmission time (~15 min), and with it whatever thread
    # waits on it. A TCP user timeout fires only when sent data stays unacknowledged,
    # so a long query the server is working on is never cut. A Unix socket has no TCP.
    sock = getattr(dbapi_connection, "_sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (
        socket.AF_INET,
        socket.AF_INET6,
    ):
        return
    for level, name, value in MYSQL_SOCKET_OPTIONS:
        if hasattr(socket, name):
            sock.setsockopt(level, getattr(socket, name), value)


def _install_sqlite_recipe(engine: Engine) -> None:
    # pysqlite's own transaction handling issues a deferred BEGIN just before the first
    # write, so two processes that both read first deadlock on the upgrade and one fails
    # at once, busy timeout or not. Taking the driver's hands off (isolation_level=None)
    # and beginning every transaction ourselves, IMMEDIATE, makes them queue instead.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # Readers never block the writer, nor the writer the readers.
            _enable_wal(cursor)
            # Durable at each checkpoint; with WAL no longer at risk of corruption.
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT * 1000)}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
        if mode not in ("IMMEDIATE", "DEFERRED", "EXCLUSIVE"):
            raise ValueError(f"{SQLITE_BEGIN_OPTION} must be IMMEDIATE, DEFERRED or EXCLUSIVE")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _enable_wal(cursor: sqlite3.Cursor) -> None:
    # Switching a database to WAL takes an exclusive lock, and SQLite answers "database is
    # locked" at once, without the busy handler, when processes opening a new database
    # together all try it. The mode is kept in the file: once switched, this is a read.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = (
                getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_BUSY) & 0xFF == sqlite3.SQLITE_BUSY
            )
            if not busy or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


# user:password@ in a URL that make_url could not parse.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@]*):[^@/]*@")


def redact(url: str | URL) -> str:
    """Render ``url`` with its password hidden as ``***``, for logs and messages.

    A URL that does not parse is still redacted: anything between ``user:`` and ``@``
    after the scheme is replaced.
    """
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except Exception:  # whatever make_url disliked, the pattern still redacts
        return _redact_unparsed(url)


def _redact_unparsed(url: str) -> str:
    return _USERINFO.sub(r"\g<scheme>\g<user>:***@", url)
