"""A database outage owes the job its instant, as a restart does.

Replicas on one fake clock lose their database across an instant and get it back; the
instant is then run once (the seed's catch-up rule, applied when the database answers
again), or not at all when another replica ran it meanwhile.

The outage is real, not a mock: on PostgreSQL and MariaDB the replicas reach the server
through a TCP proxy of the test's own that resets every connection and refuses new ones;
on SQLite another connection holds the file's exclusive lock while the replicas' busy
timeout is cut to 50 ms, so every write they try fails as "database is locked".

One test runs in real time (``slow``): a ``cronjob run`` process behind the fault suite's
proxy, cut off across its job's first instant. It restarts no server.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

import cronjob
import lease
from cronjob.testing import FakeClock
from tests._helpers import run_sql
from tests.faults.harness import JobSpec, Proxy, Scenario, wait_until, wall_now

#: 08:59:00 on a Monday; the daily job's instant is 09:00:00.
START = datetime(2026, 3, 2, 8, 59, tzinfo=UTC)
NINE = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@dataclass
class Outage:
    """Replicas' way to the database, and the switch that cuts it.

    ``database(name)`` is what a replica passes to :class:`cronjob.Scheduler`; with
    ``shared=False`` on a server each replica gets a path of its own, so ``cut(name)``
    can cut one replica while the others go on.
    """

    url: str
    kind: str
    proxies: dict[str, Proxy] = field(default_factory=dict)
    engines: list[sa.Engine] = field(default_factory=list)
    _lock_holder: sqlite3.Connection | None = None

    def database(self, name: str = "all") -> str | sa.Engine:
        if self.kind == "sqlite":
            engine = lease.create_engine(self.url)

            @event.listens_for(engine, "connect")
            def _short_busy_timeout(dbapi_connection: Any, record: Any) -> None:
                dbapi_connection.execute("PRAGMA busy_timeout=50")

            self.engines.append(engine)
            return engine
        if name not in self.proxies:
            url = sa.make_url(self.url)
            self.proxies[name] = Proxy(upstream=(url.host or "127.0.0.1", url.port or 0))
        port = self.proxies[name].port
        url = sa.make_url(self.url).set(host="127.0.0.1", port=port)
        return url.render_as_string(hide_password=False)

    def cut(self, name: str | None = None) -> None:
        """Cut replica ``name``'s path, or every path (on SQLite always every one)."""
        if self.kind == "sqlite":
            path = sa.make_url(self.url).database
            assert path
            holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            holder.execute("BEGIN EXCLUSIVE")
            self._lock_holder = holder
            return
        for key, proxy in self.proxies.items():
            if name is None or key == name:
                proxy.cut("reset")

    def heal(self) -> None:
        if self._lock_holder is not None:
            self._lock_holder.execute("ROLLBACK")
            self._lock_holder.close()
            self._lock_holder = None
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        self.heal()
        for proxy in self.proxies.values():
            proxy.close()
        for engine in self.engines:
            engine.dispose()


@pytest.fixture
def outage(db_url: str) -> Iterator[Outage]:
    kind = sa.make_url(db_url).get_backend_name()
    kind = {"postgresql": "postgres", "mysql": "mysql"}.get(kind, "sqlite")
    cut = Outage(db_url, kind)
    try:
        yield cut
    finally:
        cut.close()


@dataclass(frozen=True)
class Ran:
    instant: datetime
    replica: str
    started: datetime


class Rounds:
    """A job body recording its rounds (thread-safe)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.seen: list[Ran] = []
        self._lock = threading.Lock()

    def job(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.seen.append(Ran(ctx.instant, ctx.replica, self.clock.now()))

    def instants(self) -> list[datetime]:
        return sorted(ran.instant for ran in self.seen)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def replicas(clock: FakeClock) -> Iterator[Callable[..., cronjob.Scheduler]]:
    with ExitStack() as stack:

        def start(database: str | sa.Engine, registry: cronjob.Registry, replica: str):
            scheduler = cronjob.Scheduler(
                database, registry=registry, clock=clock, replica_id=replica
            )
            return stack.enter_context(scheduler)

        yield start


def run_day_one(outage: Outage, registry: cronjob.Registry, clock: FakeClock) -> None:
    """Run the daily job's first instant, then leave the database alone until 08:59:30 the
    next day (no day of sweeps to wait)."""
    with cronjob.Scheduler(outage.database(), registry=registry, clock=clock, replica_id="0"):
        clock.advance_to(NINE + timedelta(seconds=1))
    clock.advance_to(NINE + DAY - timedelta(seconds=30))


class TestOutage:
    def test_a_daily_instant_missed_in_a_20_s_outage_runs_once_when_the_database_answers(
        self, outage, replicas, clock, caplog
    ):
        """The issue's case: down from 08:59:56 to 09:00:16; 09:00 is owed and run once."""
        rounds = Rounds(clock)
        registry = cronjob.Registry()
        registry.register(rounds.job, "0 0 9 * * *", "digest")
        run_day_one(outage, registry, clock)
        assert rounds.instants() == [NINE]
        replicas(outage.database(), registry, "a")
        replicas(outage.database(), registry, "b")
        clock.advance_to(NINE + DAY - timedelta(seconds=4))
        outage.cut()
        with caplog.at_level(logging.INFO, logger="cronjob"):
            clock.advance_to(NINE + DAY + timedelta(seconds=16))
            assert rounds.instants() == [NINE]  # nothing runs while the database is away
            outage.heal()
            clock.advance(30)
        assert rounds.instants() == [NINE, NINE + DAY]
        caught_up = rounds.seen[-1]
        assert caught_up.started > NINE + DAY + timedelta(seconds=16)
        assert caught_up.started <= NINE + DAY + timedelta(seconds=16 + 8)  # next probe
        messages = [r.getMessage() for r in caplog.records]
        assert (
            sum(
                f"catching up instant {(NINE + DAY).isoformat()} after the database outage" in m
                for m in messages
            )
            == 1
        )
        assert any("(catch-up after an outage)" in m for m in messages)
        clock.advance(30)  # nothing more until tomorrow
        assert rounds.instants() == [NINE, NINE + DAY]

    def test_a_first_instant_missed_in_an_outage_runs_once_when_the_database_answers(
        self, outage, replicas, clock
    ):
        """Deployed at 08:59:00 (its rows written then), the daily job has never run when
        its first instant, 09:00, passes with the database away: it was the job's to run."""
        rounds = Rounds(clock)
        registry = cronjob.Registry()
        registry.register(rounds.job, "0 0 9 * * *", "digest")
        replicas(outage.database(), registry, "a")
        replicas(outage.database(), registry, "b")
        clock.advance_to(NINE - timedelta(seconds=4))
        outage.cut()
        clock.advance_to(NINE + timedelta(seconds=16))
        assert rounds.seen == []
        outage.heal()
        clock.advance(30)
        assert rounds.instants() == [NINE]
        assert NINE + timedelta(seconds=16) < rounds.seen[0].started
        assert rounds.seen[0].started <= NINE + timedelta(seconds=16 + 8)  # next probe
        clock.advance(60)
        assert rounds.instants() == [NINE]

    @pytest.mark.parametrize(
        "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
    )
    def test_an_instant_owed_at_start_is_caught_up_when_start_ups_write_failed(
        self, outage, replicas, clock, db_url
    ):
        """Restarted across 09:00, a replica whose start-up write fails (a new job's row;
        the migration passed) owes 09:00 as an outage would: caught up once the database
        takes the write. The write fails as a cancelled statement does (SQLSTATE 57014, a
        statement past its bound), raised by a trigger of the test's own on PostgreSQL."""
        rounds = Rounds(clock)
        day_one, deployed = cronjob.Registry(), cronjob.Registry()
        for registry in (day_one, deployed):
            registry.register(rounds.job, "0 0 9 * * *", "digest")
        deployed.register(rounds.job, "0 0 3 * * *", "fresh")  # its row: a write at start
        run_day_one(outage, day_one, clock)
        clock.advance_to(NINE + DAY + timedelta(seconds=30))
        refuse = (
            "CREATE FUNCTION refuse_fresh() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.name = 'fresh' THEN RAISE EXCEPTION 'refused' USING ERRCODE = '57014'; "
            "END IF; RETURN NEW; END $$",
            "CREATE TRIGGER refuse_fresh BEFORE INSERT ON cronjob_lease "
            "FOR EACH ROW EXECUTE FUNCTION refuse_fresh()",
        )
        run_sql(db_url, *refuse)
        replicas(outage.database(), deployed, "a")
        clock.advance(5)
        assert rounds.instants() == [NINE]
        run_sql(db_url, "DROP TRIGGER refuse_fresh ON cronjob_lease")
        clock.advance(10)
        assert rounds.instants() == [NINE, NINE + DAY]
        clock.advance(60)
        assert rounds.instants() == [NINE, NINE + DAY]

    def test_a_job_every_10_s_catches_up_once_then_resumes(self, outage, replicas, clock):
        rounds = Rounds(clock)
        registry = cronjob.Registry()
        registry.register(rounds.job, "@every 10s", "tick")
        replicas(outage.database(), registry, "a")
        replicas(outage.database(), registry, "b")
        clock.advance_to(NINE + timedelta(seconds=1))
        before = rounds.instants()
        assert before and before[-1] == NINE

        outage.cut()  # misses 09:00:10, :20, :30; probes at :11, :12, :14, :18, :26, :34
        clock.advance_to(NINE + timedelta(seconds=31))
        outage.heal()
        clock.advance_to(NINE + timedelta(seconds=39))
        assert rounds.instants() == [*before, NINE + timedelta(seconds=30)]
        assert rounds.seen[-1].started == NINE + timedelta(seconds=34)
        clock.advance_to(NINE + timedelta(seconds=61))
        resumed = [NINE + timedelta(seconds=s) for s in (40, 50, 60)]
        assert rounds.instants() == [*before, NINE + timedelta(seconds=30), *resumed]


@pytest.mark.parametrize(
    "db_url",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
    indirect=True,
)
class TestOneReplicaCutOff:
    """On a server one replica can lose its path alone (a SQLite file is local to all)."""

    def test_an_instant_another_replica_ran_is_not_run_again(self, outage, replicas, clock):
        rounds = Rounds(clock)
        registry = cronjob.Registry()
        registry.register(rounds.job, "0 0 9 * * *", "digest")
        run_day_one(outage, registry, clock)
        replicas(outage.database("a"), registry, "a")
        replicas(outage.database("b"), registry, "b")
        clock.advance_to(NINE + DAY - timedelta(seconds=4))
        outage.cut("a")
        clock.advance_to(NINE + DAY + timedelta(seconds=16))
        outage.heal()
        clock.advance(30)
        assert rounds.instants() == [NINE, NINE + DAY]
        assert rounds.seen[-1].replica == "b"


@pytest.mark.slow
@pytest.mark.postgres
def test_a_first_instant_cut_off_in_real_time_runs_once_when_postgres_answers():
    """A ``cronjob run`` process on PostgreSQL through a TCP proxy; its daily jobs, whose
    rows the start wrote, have never run. Every connection is reset, and new ones refused,
    from 1.5 s before one job's first instant to 2 s after: once the database answers,
    that instant runs, once, as a catch-up after the outage.

    The jobs' first instants are 4 s apart, from 6 s after the launch: the one cut across
    is the first that leaves room for the cut once the rows are written, however long
    the process took to start on a busy machine."""
    launched = wall_now().replace(microsecond=0)
    instants = {f"daily-{s}": launched + timedelta(seconds=s) for s in (6, 10, 14, 18)}
    jobs = [
        JobSpec(name, f"CRON_TZ=UTC {t.second} {t.minute} {t.hour} * * *", "work", 0.2)
        for name, t in instants.items()
    ]
    with Scenario("first_instant", jobs, db="postgres") as s:
        replica = s.replica("a", proxy=True)
        s.start()
        deployed = wait_until(
            lambda: s.sql("SELECT MAX(deployed_ms) AS d FROM cronjob_lease")[0]["d"],
            10,
            "the jobs' lease rows, with their first deployment",
        )
        room = wall_now() + timedelta(seconds=2)
        name, instant = next(
            ((n, t) for n, t in instants.items() if t > room),
            ("", launched),
        )
        assert name, "the replica took too long to start"
        assert deployed < instant.timestamp() * 1000
        time.sleep(max(0.0, (instant - timedelta(seconds=1.5) - wall_now()).total_seconds()))
        replica.cut("reset")
        time.sleep(max(0.0, (instant + timedelta(seconds=2) - wall_now()).total_seconds()))
        assert [r for r in s.rounds() if r.job == name] == []
        replica.heal()
        healed = time.monotonic()
        ran = s.wait_start(name, 10)
        assert ran["mono"] >= healed
        time.sleep(1.0)
        assert s.stop() == {"a": 0}
        assert [(r.instant, r.attempt) for r in s.rounds() if r.job == name] == [(instant, 1)]
        assert (
            f"job {name!r}: catching up instant {instant.isoformat()} after the database outage"
            in replica.output()
        )
