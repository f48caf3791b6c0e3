"""Engines configured for leases, and URLs made safe to print."""

from __future__ import annotations

import re
import socket
import sqlite3
import time
from typing import Any
from urllib.parse import unquote

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine

from ._exceptions import UnsupportedDatabase, translate_errors

__all__ = [
    "SQLITE_BUSY_TIMEOUT",
    "create_engine",
    "is_sqlite_memory",
    "redact",
    "refuse_sqlite_memory",
]

#: How long, in seconds, a SQLite writer waits for another process's write lock
#: before the statement fails with "database is locked".
SQLITE_BUSY_TIMEOUT = 30.0

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
#: option for them: the same liveness as :data:`POSTGRES_CONNECT_DEFAULTS` (keepalive
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

#: Execution option naming how a SQLite transaction of an engine made here begins:
#: "IMMEDIATE" (the default: takes the write lock at BEGIN) or "DEFERRED" (for reads).
SQLITE_BEGIN_OPTION = "lease_sqlite_begin"


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """Create an engine suited to the lease statements, for the database at ``url``.

    - SQLite file: exactly one connection per process (``pool_size=1``,
      ``max_overflow=0``, usable from any thread), WAL journal, a busy timeout of
      :data:`SQLITE_BUSY_TIMEOUT` seconds, and every transaction opened with
      ``BEGIN IMMEDIATE`` (the pysqlite recipe in SQLAlchemy's documentation), so writers
      in several processes queue on the file lock instead of failing on a read lock
      they cannot upgrade.
    - SQLite in memory (``sqlite://``, ``:memory:``, ``file::memory:``,
      ``mode=memory``): refused (see :func:`refuse_sqlite_memory`).
    - Any other database: ``pool_pre_ping=True`` (a connection the server closed is
      replaced, not handed out) and ``READ COMMITTED`` isolation, which the lease
      statements are written for.
    - PostgreSQL with psycopg: also TCP keepalives and a TCP user timeout
      (:data:`POSTGRES_CONNECT_DEFAULTS`, each unless the URL's query sets it).
    - MariaDB/MySQL with PyMySQL: the same TCP keepalives and user timeout, set on each
      new connection's socket (:data:`MYSQL_SOCKET_OPTIONS`), and a connect timeout of
      :data:`MYSQL_CONNECT_TIMEOUT` seconds unless the URL's query sets one.

    Keyword arguments are passed to :func:`sqlalchemy.create_engine` and win.

    Raises:
        DatabaseError: the URL does not parse or names no installed dialect.
        UnsupportedDatabase: the URL names an in-memory SQLite database.
    """
    with translate_errors("create engine"):
        parsed = sa.make_url(url)
    refuse_sqlite_memory(url)
    if parsed.get_backend_name() != "sqlite":
        options: dict[str, Any] = {"pool_pre_ping": True}
        if parsed.get_backend_name() in ("postgresql", "mysql", "mariadb"):
            options["isolation_level"] = "READ COMMITTED"
        if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
            options["connect_args"] = {
                key: value
                for key, value in POSTGRES_CONNECT_DEFAULTS.items()
                if key not in parsed.query
            }
        pymysql = (
            parsed.get_backend_name() in ("mysql", "mariadb")
            and parsed.get_driver_name() == "pymysql"
        )
        if pymysql and "connect_timeout" not in parsed.query:
            options["connect_args"] = {"connect_timeout": MYSQL_CONNECT_TIMEOUT}
        with translate_errors("create engine"):
            engine = sa.create_engine(parsed, **(options | kwargs))
        if pymysql:
            event.listen(engine, "connect", _set_mysql_socket_options)
        return engine
    connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT}
    connect_args |= kwargs.pop("connect_args", {})
    options = {"pool_size": 1, "max_overflow": 0}
    with translate_errors("create engine"):
        engine = sa.create_engine(parsed, connect_args=connect_args, **(options | kwargs))
    _install_sqlite_recipe(engine)
    return engine


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
