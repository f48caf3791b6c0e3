"""What differs by database: which can carry leases, the database clock's "now" in
SQL, and the statement bound a pooled session carries."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ._engine import refuse_sqlite_memory
from ._exceptions import UnsupportedDatabase

#: Dialect names (``engine.dialect.name``) that can carry leases.
SUPPORTED_DIALECTS: Final = ("postgresql", "mysql", "mariadb", "sqlite")


def check_dialect(bind: Engine | Connection | Dialect) -> None:
    """Refuse a database that cannot carry leases.

    Raises:
        UnsupportedDatabase: the dialect is not one of `SUPPORTED_DIALECTS`, or
            the engine or connection is on an in-memory SQLite database (see
            [create_engine][lease.create_engine]); a bare dialect is judged by its name alone.
    """
    dialect = bind if isinstance(bind, Dialect) else bind.dialect
    if dialect.name not in SUPPORTED_DIALECTS:
        raise UnsupportedDatabase(
            f"the {dialect.name!r} database cannot carry leases; "
            "supported are PostgreSQL, MySQL/MariaDB and SQLite"
        )
    if isinstance(bind, Engine):
        refuse_sqlite_memory(bind.url)
    elif isinstance(bind, Connection):
        refuse_sqlite_memory(bind.engine.url)


class _db_now_ms(FunctionElement[int]):  # lower case, like the SQL functions it renders
    """The database clock's "now" in epoch milliseconds, once per statement."""

    type = sa.BigInteger()
    inherit_cache = True
    name = "lease_now_ms"


def _now_ms_or(now_ms: int | None) -> sa.ColumnElement[int]:
    """``now_ms`` as a statement's value (a writer's ``now=``, on its clock), or the
    database clock's now (`_db_now_ms`) when it is ``None``."""
    if now_ms is None:
        return _db_now_ms()
    return sa.literal(now_ms, sa.BigInteger())


# statement_timestamp(), not clock_timestamp(): one value for the whole statement, so the
# "is it free" test and the new expiry in one UPDATE read the same now (clock_timestamp()
# would be read again for each row).
@compiles(_db_now_ms, "postgresql")
def _now_ms_postgresql(element: _db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000) AS BIGINT)"


# UTC_TIMESTAMP is fixed for the statement and needs no time zone conversion, unlike
# UNIX_TIMESTAMP(NOW(3)), which reads NOW in the session's zone and is ambiguous in the
# hour a daylight-saving change repeats.
@compiles(_db_now_ms, "mysql")
@compiles(_db_now_ms, "mariadb")
def _now_ms_mysql(element: _db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"


# 'now' is fixed for the statement (one sqlite3_step) and kept in whole milliseconds;
# ROUND undoes the floating point error of the Julian day arithmetic.
@compiles(_db_now_ms, "sqlite")
def _now_ms_sqlite(element: _db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"


#: ``(timeout_ms, the statement that restores the session's own settings, PostgreSQL)``.
_BOUND: Final = "lease_statement_bound"

#: ``active`` while this thread checks a connection out for a store's transaction.
_store_checkout = threading.local()


def _unbind_for_others(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """The pool's ``checkout`` listener: a connection the store bounded goes to anyone
    else only after its session's own settings are restored (one statement; it happens
    only when a connection passes from the store to other users).

    Raises:
        DisconnectionError: restoring failed; the pool drops the connection and hands
            out another.
    """
    bound = record.info.get(_BOUND)
    if bound is None or getattr(_store_checkout, "active", False):
        return
    try:
        # PostgreSQL's set_config outside a transaction (the drivers' autocommit is a
        # flag on the client, idle here): one round trip, no COMMIT. MariaDB/MySQL's
        # session variables are not transactional.
        postgres = bound[2]
        if postgres:
            dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(bound[1])
        finally:
            cursor.close()
            if postgres:
                dbapi_connection.autocommit = False
    except Exception as exc:
        raise sa.exc.DisconnectionError(f"restoring the session's settings failed: {exc}") from exc
    del record.info[_BOUND]


@contextlib.contextmanager
def transaction_bounded(conn: Connection, timeout_ms: int) -> Iterator[None]:
    """Run the block in a transaction on ``conn`` (PostgreSQL) whose statements give up
    after ``timeout_ms``, leaving nothing on the session: the bound is the
    transaction's (``set_config(..., true)``), for a transaction pooler's server
    connections, which any client may get next.

    With psycopg the bound costs no round trip: the transaction's ``BEGIN`` (with the
    isolation level psycopg would have sent) and the bound go as one simple-protocol
    query, the driver in autocommit meanwhile so that it sends no ``BEGIN`` of its own
    (SQLAlchemy's ping toggles it likewise); psycopg's commit and rollback go by the
    server's transaction status, so they end it. Another driver sends the bound as a
    statement of its own after its ``BEGIN``.
    """
    bound = f"SELECT set_config('statement_timeout', '{timeout_ms}', true)"
    if conn.dialect.driver != "psycopg":
        with conn.begin():
            conn.exec_driver_sql(bound)
            yield
        return
    driver = conn.connection.driver_connection
    assert driver is not None
    begin = ["BEGIN"]
    if driver.isolation_level is not None:
        begin.append("ISOLATION LEVEL " + driver.isolation_level.name.replace("_", " "))
    if driver.read_only is not None:
        begin.append("READ ONLY" if driver.read_only else "READ WRITE")
    driver.autocommit = True
    try:
        with conn.begin():
            conn.exec_driver_sql(f"{' '.join(begin)}; {bound}")
            yield
    finally:
        if not conn.invalidated:
            if driver.info.transaction_status.name == "IDLE":  # committed or rolled back
                driver.autocommit = False
            else:  # never handed out in autocommit
                conn.invalidate()
