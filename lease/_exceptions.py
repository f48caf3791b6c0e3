"""Exceptions raised by :mod:`lease`.

The tree::

    LeaseError
    ├── DatabaseUnavailable (ConnectionError)   the database could not be reached or
    │                                           dropped the connection; worth retrying
    ├── DatabaseError (RuntimeError)            the database refused a statement
    ├── UnsupportedDatabase (RuntimeError)      the dialect cannot carry leases
    ├── MigrationRequired (RuntimeError)        the tables are not at the head revision
    │                                           and migrating was not allowed
    └── MigrationFailed (RuntimeError)          the migrations could not be found or run

Every error SQLAlchemy (or a driver under it) raises inside this package is translated
into this tree at one boundary, :func:`translate_errors`, and chained with
``raise ... from exc`` so the original stays on ``__cause__``. Bad arguments (an instant
that is not aware UTC, an empty name) are programming errors and raise the builtin
:class:`ValueError` or :class:`TypeError` instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy.exc

__all__ = [
    "DatabaseError",
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
    # says what went wrong without them.
    return f"{type(exc.orig).__name__}: {str(exc.orig).strip()}"
