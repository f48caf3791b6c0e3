"""Shared fixtures: the three databases, engines on them, a manual clock.

``sqlite_url``, ``postgres_url`` and ``mysql_url`` give a URL to an empty database of the
test's own: SQLite gets a new file in ``tmp_path``; on the PostgreSQL and MariaDB servers
(see SPEC.md, "Databases") the test gets a new schema (PostgreSQL, as the connection's
``search_path``) or database (MariaDB), dropped after it. So a test never sees another
test's tables, even when two developers run the suite at once against the same servers.
``db_url`` gives one of its own too, but with the lease tables already at head and empty,
taken back for the next test after it (tests/_pool.py); a test marked
``blank_database`` gets an empty one.

A server that cannot be reached skips the test, except under CI (``CI=true``), where
it fails it: CI must never pass by skipping the servers.

Tests that should run on every database take ``db_url`` (parametrised: ids ``sqlite``,
``postgres``, ``mysql``; the server ones carry the ``postgres`` / ``mysql`` marks, so
``-m "not postgres and not mysql"`` runs SQLite alone).

``pgbouncer_url`` is PostgreSQL again, through the suite's PgBouncer in transaction
mode (``bash scripts/pgbouncer`` starts it; ``scripts/test`` does): a new database per
test, since PgBouncer does not pass on the ``options`` that name a schema. A module
runs a suite through it too by overriding ``db_url`` with ``[*DATABASES, PGBOUNCER]``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import cronjob
import lease
from tests._endpoint import endpoint  # noqa: F401 (a fixture: heartbeat pings)
from tests._pool import AtHead, drop_schema, scratch_name

pytest_plugins = ["pytester"]  # tests/test_pytest_plugin.py

#: The PostgreSQL server of the development and CI machines.
POSTGRES_URL = os.environ.get(
    "CRONJOB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
#: The suite's PgBouncer (scripts/pgbouncer): transaction pooling in front of the
#: PostgreSQL server, any database name passed on.
PGBOUNCER_URL = os.environ.get(
    "CRONJOB_TEST_PGBOUNCER_URL", "postgresql+psycopg://postgres@127.0.0.1:6432/test"
)
#: The MariaDB/MySQL server of the development and CI machines. Its TLS is off
#: (``have_ssl`` is ``DISABLED``) and ``ssl_disabled`` says so to PyMySQL, which otherwise
#: builds a TLS context for every connection it opens (about 20 ms of CPU each).
MYSQL_URL = os.environ.get(
    "CRONJOB_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test?ssl_disabled=true"
)
#: The tables the lease package owns.
LEASE_TABLES = ("cronjob_round", "cronjob_replica", "cronjob_lease", "cronjob_alembic_version")
#: A fixed start for manual clocks: Sunday 2026-03-08 06:00 UTC.
START = datetime(2026, 3, 8, 6, 0, tzinfo=UTC)

# Server URL -> why it cannot be reached (None: reachable), checked once per session.
_unreachable: dict[str, str | None] = {}


def drop_lease_tables(url: str) -> None:
    """Drop the lease package's tables at ``url``, if they exist."""
    for table in LEASE_TABLES:
        _execute(url, f"DROP TABLE IF EXISTS {table}")


def _reachable(url: str, what: str) -> None:
    if url not in _unreachable:
        engine = sa.create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            _unreachable[url] = None
        except sa.exc.SQLAlchemyError as exc:
            cause = getattr(exc, "orig", None) or exc
            _unreachable[url] = f"{type(cause).__name__}: {cause}"
        finally:
            engine.dispose()
    reason = _unreachable[url]
    if reason is not None:
        message = f"the {what} server at {lease.redact(url)} is unreachable ({reason})"
        if what == "PgBouncer":
            message += "; bash scripts/pgbouncer starts it"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; under CI the servers must run (.ci/run starts them)")
        pytest.skip(message)


def _execute(url: str, statement: str) -> None:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement))
    finally:
        engine.dispose()


def _execute_outside_transaction(url: str, statement: str) -> None:
    """Run ``statement`` in autocommit (``CREATE DATABASE`` refuses a transaction)."""
    engine = sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(statement))
    finally:
        engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite database in a new file."""
    return f"sqlite:///{tmp_path / 'lease.sqlite'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A new, empty schema of the PostgreSQL test database (the connection's search_path)."""
    with postgres_schema() as url:
        yield url


@contextlib.contextmanager
def postgres_schema() -> Iterator[str]:
    """`postgres_url`'s schema, as a context (a test that needs two)."""
    _reachable(POSTGRES_URL, "PostgreSQL")
    schema = scratch_name()
    _execute(POSTGRES_URL, f"CREATE SCHEMA {schema}")
    url = sa.make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        _drop_schema(schema)


def _drop_schema(schema: str) -> None:
    drop_schema(POSTGRES_URL, schema)


@pytest.fixture
def mysql_url() -> Iterator[str]:
    """A new, empty database on the MariaDB/MySQL server."""
    with mysql_database() as url:
        yield url


@contextlib.contextmanager
def mysql_database() -> Iterator[str]:
    """`mysql_url`'s database, as a context (a test that needs two)."""
    _reachable(MYSQL_URL, "MariaDB/MySQL")
    database = scratch_name()
    _execute(MYSQL_URL, f"CREATE DATABASE {database} CHARACTER SET utf8mb4")
    try:
        yield sa.make_url(MYSQL_URL).set(database=database).render_as_string(hide_password=False)
    finally:
        _execute(MYSQL_URL, f"DROP DATABASE {database}")


@pytest.fixture
def pgbouncer_url() -> Iterator[str]:
    """A new, empty database of the PostgreSQL server, reached through the suite's
    PgBouncer in transaction mode, with ``pooler=transaction`` in the URL."""
    _reachable(POSTGRES_URL, "PostgreSQL")
    _reachable(PGBOUNCER_URL, "PgBouncer")
    database = scratch_name()
    _execute_outside_transaction(POSTGRES_URL, f"CREATE DATABASE {database}")
    url = sa.make_url(PGBOUNCER_URL).set(database=database)
    try:
        yield url.update_query_dict({"pooler": "transaction"}).render_as_string(hide_password=False)
    finally:
        # FORCE: PgBouncer keeps its server connections to the database open.
        _execute_outside_transaction(POSTGRES_URL, f"DROP DATABASE {database} WITH (FORCE)")


#: The Redis server of the development and CI machines (RQ's broker).
REDIS_URL = os.environ.get("CRONJOB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_url() -> str:
    """The Redis server, reachable (skipped when it is not, failed under CI)."""
    redis = pytest.importorskip("redis")
    if REDIS_URL not in _unreachable:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
        try:
            client.ping()
            _unreachable[REDIS_URL] = None
        except redis.RedisError as exc:
            _unreachable[REDIS_URL] = f"{type(exc).__name__}: {exc}"
        finally:
            client.close()
    reason = _unreachable[REDIS_URL]
    if reason is not None:
        message = f"the Redis server at {REDIS_URL} is unreachable ({reason})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; under CI the servers must run (.ci/run starts them)")
        pytest.skip(message)
    return REDIS_URL


#: The databases ``db_url`` runs a test on, by the name of their URL fixture.
DATABASES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
]
#: PostgreSQL through PgBouncer in transaction mode, for a module's own ``db_url``.
PGBOUNCER = pytest.param(
    "pgbouncer", id="pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]
)


#: This process's databases at head (tests/_pool.py), for ``db_url``.
_at_head = AtHead(postgres=POSTGRES_URL, mysql=MYSQL_URL)


@pytest.fixture(scope="session", autouse=True)
def _drop_databases_at_head() -> Iterator[None]:
    yield
    _at_head.close()


def database_url(request: pytest.FixtureRequest, kind: str) -> str:
    """The URL of a database of ``kind`` (a ``DATABASES`` or ``PGBOUNCER`` id) for the
    test: its lease tables at head and empty, as `lease.migrate` leaves a new database
    (see tests/_pool.py); for a test marked ``blank_database``, and through PgBouncer,
    ``{kind}_url``'s database without the tables."""
    if kind == "pgbouncer" or request.node.get_closest_marker("blank_database"):
        return str(request.getfixturevalue(f"{kind}_url"))
    if kind == "postgres":
        _reachable(POSTGRES_URL, "PostgreSQL")
    elif kind == "mysql":
        _reachable(MYSQL_URL, "MariaDB/MySQL")
    database = _at_head.database(kind, request.getfixturevalue("tmp_path"))
    url = database.__enter__()
    request.addfinalizer(lambda: database.__exit__(None, None, None))
    return url


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest) -> str:
    """Each supported database in turn, its lease tables at head (``database_url``)."""
    return database_url(request, request.param)


@pytest.fixture
def db_engine(db_url: str) -> Iterator[sa.Engine]:
    """An engine from :func:`lease.create_engine` on each database; disposed after."""
    engine = lease.create_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def migrated_engine(db_engine: sa.Engine) -> sa.Engine:
    """:func:`db_engine` with the lease tables at head."""
    lease.migrate(db_engine)
    return db_engine


#: A Monday, on the hour: where the ``clock`` fixture starts (a module's own ``START``).
MONDAY = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> cronjob.testing.FakeClock:
    """A fake clock at :data:`MONDAY` (a module may define its own ``clock``)."""
    return cronjob.testing.FakeClock(MONDAY)


@pytest.fixture
def url(db_url: str) -> str:
    """Each database in turn (``db_url``), as the scheduler tests name it."""
    return db_url


@dataclass
class ManualClock:
    """A clock that moves only when told: ``now()``, ``advance(seconds)``, ``set(when)``.

    Pass ``clock.now`` wherever a ``Callable[[], datetime]`` clock is wanted. Picklable,
    so a process started with it gets a copy frozen at the time it was sent.
    """

    current: datetime = field(default=START)

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> datetime:
        if seconds < 0:
            raise ValueError("time can't go backwards")
        self.current += timedelta(seconds=seconds)
        return self.current

    def set(self, when: datetime) -> datetime:
        if when < self.current:
            raise ValueError("time can't go backwards")
        self.current = when
        return self.current


@pytest.fixture
def manual_clock() -> ManualClock:
    """A :class:`ManualClock` at :data:`START`."""
    return ManualClock()


@pytest.fixture
def replicas(
    db_url: str, clock: cronjob.testing.FakeClock
) -> Iterator[Callable[..., cronjob.Scheduler]]:
    """Start replicas (schedulers) on the test module's ``clock`` fixture and each
    database: ``replicas(registry, "a", **options)`` (``database=`` another URL or
    engine); whatever is left is stopped after."""
    started: list[cronjob.Scheduler] = []

    def start(
        registry: cronjob.Registry, replica_id: str = "a", **options: object
    ) -> cronjob.Scheduler:
        database = options.pop("database", db_url)
        scheduler = cronjob.Scheduler(
            database, registry=registry, clock=clock, replica_id=replica_id, **options
        )
        scheduler.start()
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        with contextlib.suppress(Exception):
            scheduler.stop()


def lease_row(url: str, name: str) -> lease.LeaseRow:
    """The lease row of ``name`` as the store reads it, on a short-lived engine."""
    engine = lease.create_engine(url)
    try:
        return lease.LeaseStore(engine).read([name])[name]
    finally:
        engine.dispose()
