"""``ctx.transaction_async()`` and AsyncEngines, against the real databases.

An async job writes through a fenced transaction on an ``AsyncEngine``: the write
commits while the round holds its lease, and a round whose lease was taken is refused
with ``LeaseLost`` and its write rolled back. A scheduler given an ``AsyncEngine`` (or an
async URL) runs its lease statements on a sync engine it derives, and the jobs'
transactions on the engine given. While a transaction waits on the database, the event
loop keeps serving other tasks.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

import cronjob
import lease
from cronjob import Registry, Scheduler
from cronjob.testing import FakeClock
from tests.conftest import POSTGRES_URL, _reachable

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
#: The async driver a test's user picks for each database of ``db_url``.
ASYNC_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "psycopg_async", "mysql": "aiomysql"}
#: The sync driver the tests' own engines use for each database.
SYNC_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql"}
#: Another claim's write, as a round sees it: its lease's fencing token changes.
TAKE_LEASE = "UPDATE cronjob_lease SET token = 12345 WHERE name = :name"
#: Real seconds a test waits for something that happens at once when the code is right.
PATIENCE = 20.0


@pytest.fixture
def url(db_url: str) -> Iterator[str]:
    """Each database, with the table the jobs write to."""
    execute(db_url, "CREATE TABLE report_out (n INTEGER PRIMARY KEY)")
    yield db_url
    execute(db_url, "DROP TABLE IF EXISTS report_out")


@pytest.fixture
def replicas(url: str, replicas: Callable[..., Scheduler]) -> Callable[..., Scheduler]:
    """The suite's replicas, once this module's table is made (they stop before it goes)."""
    return replicas


@pytest.fixture
def asyncpg_url() -> Iterator[str]:
    """A new PostgreSQL database, named by a ``postgresql+asyncpg`` URL.

    A database of its own rather than a schema: asyncpg takes no ``options`` in the URL,
    so the scratch schema of ``postgres_url`` could not be named in it.
    """
    _reachable(POSTGRES_URL, "PostgreSQL")
    name = f"lease_test_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(POSTGRES_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        base = sa.make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg", database=name)
        yield base.render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        admin.dispose()


def sync_engine(url: str) -> sa.Engine:
    """An engine on ``url``'s database with its sync driver (the test's own)."""
    parsed = sa.make_url(url)
    backend = parsed.get_backend_name()
    return lease.create_engine(parsed.set(drivername=SYNC_DRIVERS[backend]))


def execute(url: str, statement: str, **params) -> None:
    engine = sync_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement), params)
    finally:
        engine.dispose()


def written(url: str) -> list[int]:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text("SELECT n FROM report_out ORDER BY n")).scalars())
    finally:
        engine.dispose()


def lease_state(url: str, name: str) -> lease.LeaseState:
    engine = sync_engine(url)
    try:
        return lease.LeaseStore(engine).read([name])[name].state
    finally:
        engine.dispose()


def as_async(url: str) -> str:
    """``url`` with the async driver a user would pick for its database."""
    parsed = sa.make_url(url)
    driver = ASYNC_DRIVERS[parsed.get_backend_name()]
    # PyMySQL's ssl_disabled (tests/conftest.py's MYSQL_URL): aiomysql takes no such option.
    parsed = parsed.difference_update_query(["ssl_disabled"])
    return parsed.set(drivername=f"{parsed.get_backend_name()}+{driver}").render_as_string(
        hide_password=False
    )


def hourly(job: Callable[[cronjob.Round], Any], name: str = "writer") -> Registry:
    """A registry with ``job``, leased, on the hour, as ``name``."""
    registry = Registry()
    registry.register(job, "0 0 * * * *", name)
    return registry


def noting_lease_lost(
    job: Callable[[cronjob.Round], Awaitable[None]], errors: list[BaseException]
) -> Callable[[cronjob.Round], Awaitable[None]]:
    """``job``, noting in ``errors`` the ``LeaseLost`` it raises (raised on as it was)."""

    async def noting(ctx: cronjob.Round) -> None:
        try:
            await job(ctx)
        except cronjob.LeaseLost as exc:
            errors.append(exc)
            raise

    return noting


def lost_with_nothing_written(url: str, clock: FakeClock, errors: list[BaseException]) -> list[str]:
    """Once the job's last 2 s have passed, and nothing it wrote is in ``report_out``:
    what the ``LeaseLost`` noted in ``errors`` say."""
    clock.advance(2)
    assert written(url) == []
    return [str(exc) for exc in errors]


async def insert(conn: AsyncConnection, n: int) -> None:
    await conn.execute(sa.text("INSERT INTO report_out (n) VALUES (:n)"), {"n": n})


class TestTransactionAsync:
    def test_an_async_job_s_write_commits_while_its_round_holds_the_lease(
        self, url, replicas, clock
    ):
        async def job(ctx: cronjob.Round) -> None:
            async with ctx.transaction_async() as conn:
                assert isinstance(conn, AsyncConnection)
                await insert(conn, 7)

        replicas(hourly(job))
        clock.advance(3600)
        assert written(url) == [7]
        assert lease_state(url, "writer") is lease.LeaseState.DONE

    def test_a_round_whose_lease_was_taken_is_refused_when_the_transaction_opens(
        self, url, replicas, clock
    ):
        errors: list[BaseException] = []

        async def job(ctx: cronjob.Round) -> None:
            await ctx.wait_async(2)
            async with ctx.transaction_async() as conn:
                await insert(conn, 7)

        replicas(hourly(noting_lease_lost(job, errors)), on_fatal=lambda message: None)
        clock.advance(3600)
        # Another claim takes the lease: the fencing token changes under the round.
        execute(url, TAKE_LEASE, name="writer")
        assert lost_with_nothing_written(url, clock, errors) == [
            "job 'writer': lease lost: the round no longer holds it"
        ]

    def test_a_lease_taken_during_the_transaction_rolls_its_write_back(self, url, replicas, clock):
        errors: list[BaseException] = []
        sqlite = url.startswith("sqlite")

        async def job(ctx: cronjob.Round) -> None:
            async with ctx.transaction_async() as conn:
                await insert(conn, 7)
                if sqlite:
                    # The transaction holds SQLite's write lock, so no other connection
                    # can claim meanwhile: take the lease in it, as a claim committed in
                    # between would look to the final check.
                    await conn.execute(sa.text(TAKE_LEASE), {"name": "w"})
                await ctx.wait_async(2)

        replicas(hourly(noting_lease_lost(job, errors), "w"), on_fatal=lambda message: None)
        clock.advance(3600)  # the job waits inside its open transaction
        if not sqlite:  # another connection's claim, committed before the job's commit
            execute(url, TAKE_LEASE, name="w")
        assert lost_with_nothing_written(url, clock, errors) == [
            "job 'w': lease lost: taken before the transaction committed"
        ]

    def test_a_per_instance_round_gets_a_plain_transaction(self, url, replicas, clock):
        async def job(ctx: cronjob.Round) -> None:
            async with ctx.transaction_async() as conn:
                await insert(conn, 3)

        registry = Registry()
        registry.register_per_instance(job, "0 0 * * * *", "local")
        replicas(registry)
        clock.advance(3600)
        assert written(url) == [3]

    def test_without_an_async_driver_the_error_names_what_to_install(
        self, tmp_path, clock, monkeypatch
    ):
        """An uninstalled aiosqlite: the job fails with what to install, others still run."""
        monkeypatch.setitem(sys.modules, "aiosqlite", None)  # as if not installed
        errors: list[BaseException] = []

        async def job(ctx: cronjob.Round) -> None:
            try:
                async with ctx.transaction_async():
                    pass
            except lease.DatabaseError as exc:
                errors.append(exc)

        registry = hourly(job)
        with Scheduler(f"sqlite:///{tmp_path / 'jobs.sqlite'}", registry=registry, clock=clock):
            clock.advance(3600)
        assert [str(exc) for exc in errors] == [
            "job 'writer': an async transaction on sqlite needs an async driver: "
            "install cronjob-lease[sqlite-async] (aiosqlite and greenlet)"
        ]


class TestAsyncEngine:
    @pytest.mark.parametrize("given", ["engine", "url"])
    def test_an_async_engine_serves_the_jobs_and_a_sync_one_the_leases(
        self, url, replicas, clock, given
    ):
        """The lease statements run (the round's end is on record) on the sync driver."""
        async_url = as_async(url)
        engine = create_async_engine(async_url, poolclass=NullPool)
        engines: list[AsyncEngine] = []

        async def job(ctx: cronjob.Round) -> None:
            async with ctx.transaction_async() as conn:
                engines.append(conn.engine)
                await insert(conn, 7)

        scheduler = replicas(hourly(job), database=engine if given == "engine" else async_url)
        clock.advance(3600)
        assert written(url) == [7]
        assert lease_state(url, "writer") is lease.LeaseState.DONE
        assert scheduler.engine is not None
        assert not scheduler.engine.dialect.is_async
        assert scheduler.engine.dialect.driver in ("pysqlite", "psycopg", "pymysql")
        assert scheduler.engine.url.database == sa.make_url(async_url).database
        assert len(engines) == 1
        if given == "engine":
            assert engines[0] is engine  # used as is
        else:
            assert engines[0].url == sa.make_url(async_url)
        asyncio.run(engine.dispose())

    @pytest.mark.postgres
    @pytest.mark.parametrize("given", ["engine", "url"])
    def test_asyncpg_serves_the_jobs(self, asyncpg_url, clock, given):
        execute(asyncpg_url, "CREATE TABLE report_out (n INTEGER PRIMARY KEY)")
        engine = create_async_engine(asyncpg_url, poolclass=NullPool)

        async def job(ctx: cronjob.Round) -> None:
            async with ctx.transaction_async() as conn:
                assert conn.dialect.driver == "asyncpg"
                await insert(conn, 7)

        registry = hourly(job)
        database = engine if given == "engine" else asyncpg_url
        with Scheduler(database, registry=registry, clock=clock, replica_id="a") as scheduler:
            clock.advance(3600)
            assert scheduler.engine is not None
            assert scheduler.engine.dialect.driver == "psycopg"
        assert written(asyncpg_url) == [7]
        assert lease_state(asyncpg_url, "writer") is lease.LeaseState.DONE
        asyncio.run(engine.dispose())


class TestTheLoopKeepsServing:
    def test_other_tasks_run_while_a_transaction_waits_on_a_lock(self, url, replicas, clock):
        """The job's INSERT waits for a row (on SQLite: file) lock that the test holds;
        meanwhile a task on the same loop keeps ticking. A transaction run synchronously
        on the loop would stop the ticks, and the lock would never be let go."""
        ticks: list[int] = []
        started, locked = threading.Event(), threading.Event()
        waiting, done = threading.Event(), threading.Event()

        async def tick() -> None:
            while True:
                ticks.append(len(ticks))
                await asyncio.sleep(0.01)

        async def job(ctx: cronjob.Round) -> None:
            ticker = asyncio.create_task(tick())
            try:
                started.set()
                # Locked only now: on SQLite the lock would also hold back the claim.
                await asyncio.to_thread(locked.wait, PATIENCE)
                waiting.set()
                async with ctx.transaction_async() as conn:
                    await insert(conn, 7)
                done.set()
            finally:
                ticker.cancel()

        replicas(hourly(job))
        blocker = sync_engine(url).connect()
        advancing = threading.Thread(target=clock.advance, args=(3600,))
        try:
            advancing.start()
            assert started.wait(PATIENCE)
            blocker.begin()
            blocker.execute(sa.text("INSERT INTO report_out (n) VALUES (7)"))
            locked.set()
            assert waiting.wait(PATIENCE)
            before = len(ticks)
            for _ in range(int(PATIENCE / 0.01)):
                if len(ticks) >= before + 5:
                    break
                threading.Event().wait(0.01)
            assert len(ticks) >= before + 5, "the loop stopped while the transaction waited"
            assert not done.is_set()  # still waiting for the lock
        finally:
            blocker.rollback()
            blocker.close()
            blocker.engine.dispose()
            advancing.join(PATIENCE)
        assert done.is_set()
        assert written(url) == [7]


class TestFencingUnderRepeatableRead:
    @pytest.mark.mysql
    def test_a_claim_committed_during_the_transaction_is_seen_before_commit(self, mysql_url, clock):
        """On an AsyncEngine passed in as it is, at MariaDB's default REPEATABLE READ, a
        plain read would see the first check's snapshot and let the write commit."""
        execute(mysql_url, "CREATE TABLE report_out (n INTEGER PRIMARY KEY)")
        errors: list[BaseException] = []

        async def job(ctx: cronjob.Round) -> None:
            try:
                async with ctx.transaction_async() as conn:
                    await insert(conn, 7)
                    await ctx.wait_async(2)
            except cronjob.LeaseLost as exc:
                errors.append(exc)
                raise

        engine = create_async_engine(as_async(mysql_url), poolclass=NullPool)
        registry = hourly(job, "w")
        with Scheduler(engine, registry=registry, clock=clock, on_fatal=lambda m: None):
            clock.advance(3600)  # the job waits inside its open transaction
            execute(mysql_url, TAKE_LEASE, name="w")
            clock.advance(2)
        assert [str(exc) for exc in errors] == [
            "job 'w': lease lost: taken before the transaction committed"
        ]
        assert written(mysql_url) == []
        asyncio.run(engine.dispose())
