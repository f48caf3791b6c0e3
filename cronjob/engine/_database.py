"""The scheduler's database: which one, and the engines it makes or takes for it.

The lease statements always run synchronously, on the control thread. Given an
``AsyncEngine`` or an async URL, they run on a sync engine made by
[lease.create_engine][] on the same URL with the sync driver, and the async engine
serves ``ctx.transaction_async()``. Given a sync URL or engine and async jobs,
``transaction_async`` gets an async engine made by [lease.create_async_engine][]
with the matching async driver. With no async driver, or no greenlet, installed, it
gets the error naming what to install instead, raised to the jobs that call it (the
others run). Engines passed in are not ours to dispose.

SQLAlchemy's asyncio support is imported only on those paths: it needs greenlet, which
the base install and the sync extras do not bring (see docs/decisions.md).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lease
from execctx import instrument

from .._clock import Clock

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine
    from typing_extensions import TypeIs  # typing's own from Python 3.13

__all__ = [
    "DATABASE_ENV",
    "DEFAULT_SQLITE_FILE",
    "Engines",
    "connect",
    "is_async_engine",
    "resolve_database",
    "warn_if_embedded",
]

log = logging.getLogger("cronjob")

#: The embedded SQLite file used when no database is named.
DEFAULT_SQLITE_FILE = "cronjob.sqlite"
#: The environment variable naming the database.
DATABASE_ENV = "CRONJOB_DATABASE_URL"


def resolve_database(
    database: str | Engine | AsyncEngine | None,
) -> str | Engine | AsyncEngine:
    """Return ``database``, or ``$CRONJOB_DATABASE_URL``, or the embedded SQLite file."""
    if database is not None:
        return database
    return os.environ.get(DATABASE_ENV) or f"sqlite:///{DEFAULT_SQLITE_FILE}"


def warn_if_embedded(database: str | Engine | AsyncEngine) -> None:
    """Warn, at start, when ``database`` is the embedded default: nothing was named, so
    every host has a file of its own and replicas do not coordinate."""
    if database == f"sqlite:///{DEFAULT_SQLITE_FILE}":  # nothing named: one per host
        log.warning(
            "database: the embedded default, %s in the working directory: replicas on other "
            "hosts will not coordinate with this one and will each run every job; in "
            "production set $%s (or --database-url, or Scheduler(database)) to the database "
            "all replicas share",
            DEFAULT_SQLITE_FILE,
            DATABASE_ENV,
        )


def is_async_engine(database: object) -> TypeIs[AsyncEngine]:
    """Tell whether ``database`` is an ``AsyncEngine``, without importing asyncio support.

    Importing ``sqlalchemy.ext.asyncio`` fails without greenlet; an ``AsyncEngine`` can
    only exist once that module has been imported, so if it is not loaded, none exists.
    """
    module = sys.modules.get("sqlalchemy.ext.asyncio")
    return module is not None and isinstance(database, module.AsyncEngine)


@dataclass(eq=False)
class Engines:
    """The engines of one scheduler, and which of them it made (and so disposes)."""

    #: Where the lease statements run (and sync jobs' ``ctx.transaction()``).
    engine: Engine
    owns_engine: bool
    #: Serves ``ctx.transaction_async()``; the error saying why not, or ``None``.
    async_engine: AsyncEngine | lease.LeaseError | None
    owns_async_engine: bool
    store: lease.LeaseStore


def connect(
    database: str | Engine | AsyncEngine,
    *,
    clock: Clock,
    sql_comments: bool,
    check_dialect: bool,
    async_jobs: bool,
) -> Engines:
    """Make or take the engines for ``database`` (see the module docstring).

    Raises:
        lease.UnsupportedDatabase: ``check_dialect`` and the database cannot carry leases.
    """
    async_engine: AsyncEngine | lease.LeaseError | None = None
    owns_engine = owns_async = False
    if is_async_engine(database):
        engine, owns_engine = lease.create_engine(lease.sync_url(database.url)), True
        async_engine = database
    elif isinstance(database, str) and lease.is_async_url(database):
        engine, owns_engine = lease.create_engine(lease.sync_url(database)), True
    elif isinstance(database, str):
        engine, owns_engine = lease.create_engine(database), True
    else:
        engine = database
    if async_engine is None and async_jobs:
        # The URL given if async, else the sync one with the first installed async driver.
        async_target = database if isinstance(database, str) else engine.url
        try:
            async_engine = lease.create_async_engine(lease.async_url(async_target))
            owns_async = True
        except lease.DatabaseError as exc:
            log.info("ctx.transaction_async() is unavailable: %s", exc)
            async_engine = exc
    if sql_comments:
        instrument(engine)
        if is_async_engine(async_engine):
            instrument(async_engine.sync_engine)
    store = lease.LeaseStore(engine, clock=clock.lease_clock())
    engines = Engines(engine, owns_engine, async_engine, owns_async, store)
    if check_dialect:
        try:
            store.check_dialect()
        except lease.LeaseError:
            if owns_engine:
                engine.dispose()
            raise
    return engines
