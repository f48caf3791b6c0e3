"""Exceptions raised by [lease][].

The tree::

    LeaseError
    ├── DatabaseUnavailable (ConnectionError)   the database could not be reached or
    │   │                                       dropped the connection; worth retrying
    │   └── DatabaseRefused                     the server answered and refused: no such
    │                                           database, credentials refused, a missing
    │                                           privilege; waiting will not heal it
    ├── DatabaseError (RuntimeError)            the database refused a statement
    ├── UnsupportedDatabase (RuntimeError)      the dialect cannot carry leases
    ├── MigrationRequired (RuntimeError)        the tables are not at the head revision
    │                                           and migrating was not allowed
    └── MigrationFailed (RuntimeError)          the migrations could not be found or run

Every error SQLAlchemy (or a driver under it) raises inside this package is translated
into this tree at one boundary, `translate_errors`, and chained with
``raise ... from exc`` so the original stays on ``__cause__``. Bad arguments (an instant
that is not aware UTC, an empty name) are programming errors and raise the builtin
`ValueError` or `TypeError` instead.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from typing import Final

import sqlalchemy.exc

__all__ = [
    "DatabaseError",
    "DatabaseRefused",
    "DatabaseUnavailable",
    "LeaseError",
    "MigrationFailed",
    "MigrationRequired",
    "UnsupportedDatabase",
    "translate_errors",
]


class LeaseError(Exception):
    """Root of every exception this package raises on purpose."""


class DatabaseUnavailable(LeaseError, ConnectionError):
    """Raised when the database cannot be reached, drops the connection, or times out.

    SQLAlchemy's ``OperationalError`` lands here (which, on SQLite, also covers
    "database is locked" after the busy timeout), and so does any error SQLAlchemy
    recognised as a disconnect, and a connection pool that timed out.
    """


class DatabaseRefused(DatabaseUnavailable):
    """Raised when the server answered but refused: the database does not exist, the
    credentials were refused, or a privilege is missing (or, on SQLite, the file cannot
    be opened).

    Waiting does not heal it, so [cronjob.Scheduler.start][] fails on it at once
    (``cronjob run`` exits 2) instead of retrying. It stays a
    [DatabaseUnavailable][lease.DatabaseUnavailable]: a replica already running treats it as
    the database going away (its instants stay owed) until someone restores the grant or
    password. The message starts with what was refused ("the database does not exist", "the
    credentials were refused", "a permission is missing", "the SQLite file cannot be
    opened").
    """


class DatabaseError(LeaseError, RuntimeError):
    """Raised when the database refuses a statement for a reason other than availability."""


class UnsupportedDatabase(LeaseError, RuntimeError):
    """Raised when the database's dialect cannot carry leases."""


class MigrationRequired(LeaseError, RuntimeError):
    """Raised when the lease tables are not at the head revision and migrating is off."""


class MigrationFailed(LeaseError, RuntimeError):
    """Raised when the migrations cannot be located, locked or applied."""


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Translate SQLAlchemy's exceptions raised inside the block into this tree.

    ``what`` names the operation ("claim", "migrate"...) and starts the message; the
    SQLAlchemy message is appended without its parameters, which may hold job data.
    """
    try:
        yield
    except sqlalchemy.exc.DBAPIError as exc:
        refused = _refusal(exc.orig)
        if refused is not None:
            raise DatabaseRefused(f"{what}: {refused}: {_describe(exc)}") from exc
        message = f"{what}: {_describe(exc)}"
        if exc.connection_invalidated or isinstance(exc, sqlalchemy.exc.OperationalError):
            raise DatabaseUnavailable(message) from exc
        raise DatabaseError(message) from exc
    except sqlalchemy.exc.TimeoutError as exc:
        # The connection pool gave up waiting for a free connection.
        raise DatabaseUnavailable(f"{what}: {exc}") from exc
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise DatabaseError(f"{what}: {exc}") from exc


def _describe(exc: sqlalchemy.exc.DBAPIError) -> str:
    # str(exc) would render the statement's bound parameters; the driver's own message
    # says what went wrong without them. One line: it ends up in one-line CLI errors.
    return f"{type(exc.orig).__name__}: {' '.join(str(exc.orig).split())}"


_NO_DATABASE: Final = "the database does not exist"
_CREDENTIALS: Final = "the credentials were refused"
_PERMISSION: Final = "a permission is missing"

#: PostgreSQL SQLSTATEs that waiting does not heal (statement errors carry one).
_PG_REFUSED: Final = {
    "3D000": _NO_DATABASE,  # invalid_catalog_name
    "28000": _CREDENTIALS,  # invalid_authorization_specification
    "28P01": _CREDENTIALS,  # invalid_password
    "42501": _PERMISSION,  # insufficient_privilege
    "3F000": _PERMISSION,  # invalid_schema_name: no schema on the search_path to create in
}
#: The server's FATAL lines at connection time, where libpq gives no SQLSTATE. Matched in
#: English only: a server with other lc_messages has its refusals retried, as before.
_PG_CONNECT_REFUSED: Final = (
    (re.compile(r'FATAL:\s+database ".*" does not exist'), _NO_DATABASE),
    (re.compile(r'FATAL:\s+role ".*" does not exist'), _CREDENTIALS),
    (re.compile(r"FATAL:\s+(password|\w+) authentication failed for user"), _CREDENTIALS),
    (re.compile(r"FATAL:\s+(no pg_hba\.conf entry|pg_hba\.conf rejects)"), _CREDENTIALS),
    (re.compile(r"FATAL:\s+permission denied for database"), _PERMISSION),
    (re.compile(r'FATAL:\s+role ".*" is not permitted to log in'), _PERMISSION),
    (re.compile(r"fe_sendauth: no password supplied"), _CREDENTIALS),
)
#: MariaDB/MySQL error numbers that waiting does not heal. Not among them: 2003 (cannot
#: connect), 1040 (too many connections), 1053 (server shutting down): those retry.
_MYSQL_REFUSED: Final = {
    1049: _NO_DATABASE,  # ER_BAD_DB_ERROR
    1045: _CREDENTIALS,  # ER_ACCESS_DENIED_ERROR
    1698: _CREDENTIALS,  # ER_ACCESS_DENIED_NO_PASSWORD_ERROR
    1251: _CREDENTIALS,  # ER_NOT_SUPPORTED_AUTH_MODE
    1044: _PERMISSION,  # ER_DBACCESS_DENIED_ERROR
    1142: _PERMISSION,  # ER_TABLEACCESS_DENIED_ERROR
    1143: _PERMISSION,  # ER_COLUMNACCESS_DENIED_ERROR
    1227: _PERMISSION,  # ER_SPECIFIC_ACCESS_DENIED_ERROR
}
#: SQLite result codes that waiting does not heal: the file cannot be opened (its
#: directory does not exist, or is not ours), it is read-only, or it is no database.
_SQLITE_REFUSED: Final = {
    sqlite3.SQLITE_CANTOPEN: "the SQLite file cannot be opened",
    sqlite3.SQLITE_READONLY: "the SQLite file is read-only",
    sqlite3.SQLITE_PERM: "the SQLite file is read-only",
    sqlite3.SQLITE_NOTADB: "the SQLite file is not a database",
}


def _refusal(orig: BaseException | None) -> str | None:
    """Say what the server refused if ``orig`` (a driver error) will not heal by waiting.

    ``None`` for everything else: an unreachable or restarting server, a timeout, too
    many connections, a lock, a statement error.
    """
    if orig is None:
        return None
    module = type(orig).__module__
    if module.startswith("psycopg"):
        sqlstate = getattr(orig, "sqlstate", None)
        if sqlstate is not None:
            return _PG_REFUSED.get(sqlstate)
        text = str(orig)
        for pattern, reason in _PG_CONNECT_REFUSED:
            if pattern.search(text):
                return reason
        return None
    if module.startswith("pymysql"):
        code = orig.args[0] if orig.args and isinstance(orig.args[0], int) else None
        return _MYSQL_REFUSED.get(code) if code is not None else None
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        # Extended codes carry the primary one in their low byte.
        return _SQLITE_REFUSED.get(code & 0xFF) if code is not None else None
    return None
