"""``isolation="process"``: each round in a child process, which a timeout or a lost lease
ends (SIGTERM, then SIGKILL) while the replica lives on.

Replicas on one fake clock and one database (each of the three in turn), as in
``test_policies.py``. The child itself runs in real time: a test waits for what it does
with a bounded poll (`until`), then moves the fake clock. The jobs are in
``isolated_jobs.py`` (a child imports them by name) and note what they saw in a table of
the test's database, through the round's fenced transaction.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import isolated_jobs as jobs
import pytest
import sqlalchemy as sa
from conftest import lease_row

import cronjob
import execctx
import lease
from cronjob import Registry, admin, schedules
from cronjob._policy import DEFAULT_POLICY, make_policy, policy_text
from cronjob.engine._isolated import KILL_GRACE

#: A Monday, on the hour (the ``clock`` fixture's start).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

T = TypeVar("T")


def at(minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


def until(check: Callable[[], T], what: str, seconds: float = 60.0) -> T:
    """Poll ``check`` (a real child's doing) until it gives something true, at most
    ``seconds`` real seconds."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        time.sleep(0.05)


def ended(url: str, name: str) -> list[tuple[datetime, int, str, str, str | None]]:
    """The job's history, oldest first: (instant, attempt, why, outcome, error)."""
    return [
        (r.instant, r.attempt, str(r.why), str(r.outcome), r.error)
        for r in reversed(admin.history(url, name))
    ]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def url(db_url: str) -> str:
    jobs.create_marks(db_url)
    return db_url


def isolated(fn: Callable[[cronjob.Round], object], name: str, **policy: object) -> Registry:
    registry = Registry()
    registry.register(fn, "0 * * * * *", name, isolation="process", **policy)  # type: ignore[arg-type]
    return registry


class TestRegistration:
    def test_a_lambda_is_refused_naming_the_job(self):
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^job 'report': isolation='process' runs each round in a child process",
        ):
            Registry().register(lambda ctx: None, "0 * * * * *", "report", isolation="process")

    def test_a_closure_and_a_partial_are_refused(self):
        def inner(ctx: cronjob.Round) -> None:
            pass

        registry = Registry()
        for fn in (inner, functools.partial(jobs.mark, note="x")):
            with pytest.raises(cronjob.RegistrationError, match="define it at the top level"):
                registry.register(fn, "0 * * * * *", "report", isolation="process")
        with pytest.raises(cronjob.RegistrationError, match=r"^job 'tenant-report': "):
            registry.register_task(inner, "tenant-report", isolation="process")

    def test_a_replacement_in_a_derived_registry_is_checked_too(self):
        registry = isolated(jobs.works, "report")
        with pytest.raises(cronjob.RegistrationError, match="define it at the top level"):
            registry.derive(replace={"report": lambda ctx: None})

    def test_a_closure_runs_on_a_thread_as_ever(self):
        Registry().register(lambda ctx: None, "0 * * * * *", "report", isolation="thread")

    def test_an_unknown_isolation_is_refused(self):
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^job 'report': isolation must be 'thread' or 'process', got 'fork'$",
        ):
            Registry().register(jobs.works, "0 * * * * *", "report", isolation="fork")  # type: ignore[arg-type]

    def test_the_policy_describes_it_and_the_default_says_nothing(self):
        policy = make_policy("report", leased=True, options={"isolation": "process"})
        assert policy.isolated and policy.describe() == {"isolation": "process"}
        assert policy_text(policy.describe()) == "isolation process"
        thread = make_policy("report", leased=True, options={"isolation": "thread"})
        assert thread is DEFAULT_POLICY
        assert not thread.isolated and thread.describe() == {}


class TestRounds:
    def test_a_round_runs_once_per_instant_in_a_child_with_its_identity(
        self, url, replicas, clock, caplog
    ):
        caplog.set_level(logging.WARNING)
        registry = isolated(jobs.works, "report")
        replicas(registry, "a")
        replicas(registry, "b")
        for minute in (1, 2):
            clock.advance(60)
            until(lambda m=minute: len(ended(url, "report")) == m, f"round {minute} on record")
        clock.advance(0)
        history = ended(url, "report")
        assert [(i, a, w, o) for i, a, w, o, _ in history] == [
            (at(1), 1, "schedule", "succeeded"),
            (at(2), 1, "schedule", "succeeded"),
        ]
        seen = jobs.marks(url, "report")
        assert [m["instant"] for m in seen] == [at(1).isoformat(), at(2).isoformat()]
        for m in seen:
            assert m["pid"] != os.getpid() and m["attempt"] == 1
            assert m["replica"] in ("a", "b") and m["task"] == "report" and m["args"] == {}
            assert re.fullmatch("[0-9a-f]{32}", m["trace_id"])
            instant = datetime.fromisoformat(m["instant"])
            assert m["occurrence_id"] == cronjob.occurrence_id("report", instant)
        # The child's log line is handled by this process's loggers, inside the round.
        [line] = [r for r in caplog.records if r.name == "app.isolated"][:1]
        assert line.getMessage().startswith("working in pid") and line.process != os.getpid()

    def test_the_childs_log_records_carry_the_rounds_trace_id_and_status_shows_it(
        self, url, replicas, clock
    ):
        seen: list[logging.LogRecord] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append(record)

        handler = Keep(level=logging.WARNING)
        execctx.install_log_filter(handler)
        logger = logging.getLogger("app.isolated")
        logger.addHandler(handler)
        try:
            replicas(isolated(jobs.works, "report"), "a")
            clock.advance(60)
            until(lambda: ended(url, "report"), "the round on record")
        finally:
            logger.removeHandler(handler)
        [mark] = jobs.marks(url)
        [record] = seen
        assert record.getMessage() == f"working in pid {mark['pid']}"
        assert (record.work_name, record.trace_id) == ("report", mark["trace_id"])  # type: ignore[attr-defined]
        [job] = [j for j in admin.status(url, now=clock.now()).jobs if j.name == "report"]
        assert job.policies == {"isolation": "process"}

    def test_a_tasks_data_schedules_run_in_children_with_their_args(self, url, replicas, clock):
        registry = Registry()
        registry.register_task(jobs.works, "report", isolation="process")
        replicas(registry, "a")
        replicas(registry, "b")
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            for tenant in (1, 2):
                schedules.add(
                    engine,
                    f"report:{tenant}",
                    task="report",
                    spec="0 * * * * *",
                    args={"t": tenant},
                )
        finally:
            engine.dispose()
        clock.advance(60)
        until(lambda: len(jobs.marks(url)) == 2, "both schedules' rounds")
        seen = sorted((m["name"], m["task"], m["args"]["t"]) for m in jobs.marks(url))
        assert seen == [("report:1", "report", 1), ("report:2", "report", 2)]
        assert all(m["pid"] != os.getpid() for m in jobs.marks(url))

    def test_a_per_instance_job_runs_in_a_child_on_each_replica(self, url, replicas, clock):
        registry = Registry()
        registry.register_per_instance(jobs.works, "0 * * * * *", "local", isolation="process")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(60)
        until(lambda: len(jobs.marks(url)) == 2, "a round on each replica")
        assert sorted(m["replica"] for m in jobs.marks(url)) == ["a", "b"]

    def test_an_async_job_runs_with_asyncio_run_in_the_child(self, url, replicas, clock):
        replicas(isolated(jobs.works_async, "report"), "a")
        clock.advance(60)
        until(lambda: ended(url, "report"), "the round on record")
        assert ended(url, "report")[0][3] == "succeeded"
        assert [m["note"] for m in jobs.marks(url)] == ["ran async"]

    def test_what_the_child_raises_is_the_rounds_failure(self, url, replicas, clock):
        registry = isolated(jobs.fails, "fails")
        registry.register(jobs.fails_unpicklably, "0 * * * * *", "odd", isolation="process")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(60)
        until(lambda: ended(url, "fails") and ended(url, "odd"), "both ends on record")
        [(_, _, _, outcome, error)] = ended(url, "fails")
        assert outcome == "failed"
        assert error is not None and error.startswith(
            f"ValueError: no report for {at(1).isoformat()}"
        )
        [(_, _, _, outcome, error)] = ended(url, "odd")
        assert outcome == "failed" and error is not None
        assert error.startswith(
            "RuntimeError: job 'odd' raised isolated_jobs.Unpicklable: odd failure"
        )
        assert "could not be pickled" in error

    def test_a_child_that_dies_is_a_failure_with_its_exit_status(self, url, replicas, clock):
        replicas(isolated(jobs.dies, "dies"), "a")
        clock.advance(60)
        until(lambda: ended(url, "dies"), "the end on record")
        [(_, _, _, outcome, error)] = ended(url, "dies")
        assert outcome == "failed"
        assert error is not None and "died with exit status 3 before the round ended" in error

    def test_a_retry_asked_in_the_child_runs_another_attempt(self, url, replicas, clock):
        replicas(isolated(jobs.retries, "retries", retries=1), "a")
        clock.advance(60)
        until(lambda: ended(url, "retries"), "the first attempt on record")
        clock.advance(1)  # the delay it asked for
        until(lambda: len(ended(url, "retries")) == 2, "the second attempt on record")
        assert [(a, o) for _, a, _, o, _ in ended(url, "retries")] == [
            (1, "retrying"),
            (2, "succeeded"),
        ]
        assert [m["attempt"] for m in jobs.marks(url)] == [1, 2]


class TestEndingTheChild:
    def test_a_hung_child_is_killed_at_its_timeout_and_the_replica_lives_on(
        self, url, replicas, clock
    ):
        exits: list[str] = []
        a = replicas(isolated(jobs.hangs, "hangs", timeout=10), "a", on_fatal=exits.append)
        replicas(isolated(jobs.hangs, "hangs", timeout=10), "b", on_fatal=exits.append)
        clock.advance(60)
        [started] = until(lambda: jobs.marks(url), "the child started")
        pid = started["pid"]
        clock.advance(10)  # its timeout: SIGTERM, which it ignores
        assert alive(pid) and ended(url, "hangs") == []
        clock.advance(KILL_GRACE)  # SIGKILL
        until(lambda: ended(url, "hangs"), "the end on record")
        [(instant, attempt, _, outcome, error)] = ended(url, "hangs")
        assert (instant, attempt, outcome) == (at(1), 1, "timed_out")
        assert error is not None and error.startswith("TimedOut: job 'hangs'")
        until(lambda: not alive(pid), "the child gone")
        clock.advance(10)  # past the 5 s after which a thread's round ends the process
        assert exits == [] and not a._crashed
        assert lease_row(url, "hangs").last_outcome == "timed_out"
        clock.advance(60 - 10 - KILL_GRACE - 10)  # 09:02: the next instant runs, once
        until(lambda: len(jobs.marks(url)) == 2, "the next round started")
        clock.advance(10 + KILL_GRACE)
        until(lambda: len(ended(url, "hangs")) == 2, "the next end on record")
        assert [i for i, *_ in ended(url, "hangs")] == [at(1), at(2)]
        assert exits == []

    def test_a_lost_lease_ends_the_child_and_the_replica_lives_on(self, url, replicas, clock):
        exits: list[str] = []
        a = replicas(isolated(jobs.hangs, "hangs"), "a", on_fatal=exits.append)
        clock.advance(60)
        [started] = until(lambda: jobs.marks(url), "the child started")
        pid = started["pid"]
        # Another claim takes the lease: the fencing token changes under the round.
        _execute(url, "UPDATE cronjob_lease SET token = 12345 WHERE name = 'hangs'")
        clock.advance(5)  # the renewal finds it taken: SIGTERM, ignored
        assert alive(pid)
        clock.advance(KILL_GRACE)  # SIGKILL
        until(lambda: not alive(pid), "the child gone")
        clock.advance(10)  # past the 5 s after which a thread's round ends the process
        assert exits == [] and not a._crashed
        # Once the taken lease expires, the round runs again, on the replica that lives.
        clock.advance(15)
        until(lambda: len(jobs.marks(url)) == 2, "the second run")
        assert [(m["attempt"], m["note"]) for m in jobs.marks(url)] == [
            (1, "started"),
            (2, "again"),
        ]

    def test_a_drain_reaches_the_child_and_it_stops_cut_short(self, url, replicas, clock):
        a = replicas(isolated(jobs.waits, "waits"), "a")
        clock.advance(60)
        until(lambda: jobs.marks(url), "the child started")
        assert a.drain(timeout=60)
        assert [m["note"] for m in jobs.marks(url)] == ["started", "cancelled: Shutdown"]
        [(_, _, _, outcome, error)] = ended(url, "waits")
        assert outcome == "cut short" and error is not None and error.startswith("Shutdown")

    def test_a_cooperative_child_sees_its_timeout_and_its_transaction_is_refused(
        self, url, replicas, clock
    ):
        replicas(isolated(jobs.waits, "waits", timeout=10), "a")
        clock.advance(60)
        until(lambda: jobs.marks(url), "the child started")
        clock.advance(10)
        until(lambda: ended(url, "waits"), "the end on record")
        assert ended(url, "waits")[0][3] == "timed_out"
        assert [m["note"] for m in jobs.marks(url)] == ["started"]  # refused: TimedOut


class TestTheChildsConnection:
    """The child's fenced transaction reaches the database as the scheduler's engine
    does: its driver's arguments, its isolation level, the lease engine's settings."""

    def test_it_connects_with_the_engines_connect_args_and_isolation_level(
        self, url, replicas, clock
    ):
        backend = sa.make_url(url).get_backend_name()
        given: dict[str, object] = {
            "sqlite": {"connect_args": {"factory": jobs.MarkedConnection}},
            "postgresql": {
                "connect_args": {"application_name": "iso-child"},
                "isolation_level": "REPEATABLE READ",
            },
            "mysql": {
                "connect_args": {"init_command": "SET SESSION wait_timeout = 4321"},
                "isolation_level": "SERIALIZABLE",
            },
        }[backend]
        engine = lease.create_engine(url, **given)  # type: ignore[arg-type]
        try:
            with engine.connect() as conn:
                parents = jobs.settings(conn)
            registry = isolated(jobs.observes, "observes")
            replicas(registry, "a", database=engine)
            replicas(registry, "b", database=engine)
            clock.advance(60)
            until(lambda: ended(url, "observes"), "the round on record")
            assert ended(url, "observes")[0][3] == "succeeded"
        finally:
            engine.dispose()
        [seen] = jobs.marks(url, "observes")
        assert json.loads(seen["note"]) == parents
        assert (
            parents
            == {
                "sqlite": {"busy_timeout": 30000, "made": "MarkedConnection"},
                "postgresql": {"application_name": "iso-child", "isolation": "REPEATABLE READ"},
                "mysql": {"wait_timeout": 4321, "isolation": "SERIALIZABLE"},
            }[backend]
        )

    def test_a_url_gets_the_lease_engines_settings_and_its_query_in_the_child(
        self, url, replicas, clock
    ):
        """On SQLite the lease engine's 30 s busy timeout, on MariaDB its READ COMMITTED
        (the drivers' defaults are 5 s and REPEATABLE READ); on PostgreSQL the URL's
        ``pooler=transaction``, which the lease engine takes out before the driver (which
        would refuse it) and which makes it prepare no statement."""
        backend = sa.make_url(url).get_backend_name()
        database = url
        if backend == "postgresql":
            pooled = sa.make_url(url).update_query_dict({"pooler": "transaction"})
            database = pooled.render_as_string(hide_password=False)
        registry = isolated(jobs.observes, "observes")
        replicas(registry, "a", database=database)
        replicas(registry, "b", database=database)
        clock.advance(60)
        until(lambda: ended(url, "observes"), "the round on record")
        [(_, _, _, outcome, error)] = ended(url, "observes")
        assert (outcome, error) == ("succeeded", None)
        engine = lease.create_engine(database)  # as the scheduler's own
        try:
            with engine.connect() as conn:
                parents = jobs.settings(conn)
        finally:
            engine.dispose()
        [seen] = jobs.marks(url, "observes")
        assert json.loads(seen["note"]) == parents
        if backend == "sqlite":
            assert parents == {"busy_timeout": 30000, "made": "Connection"}
        else:
            assert parents["isolation"] == "READ COMMITTED"

    def test_an_argument_a_child_cannot_be_given_fails_its_transaction_naming_it(
        self, url, replicas, clock
    ):
        backend = sa.make_url(url).get_backend_name()

        if backend == "sqlite":
            import sqlite3

            class Local(sqlite3.Connection):  # defined here: cannot be pickled
                pass

            key = "factory"
        elif backend == "postgresql":
            import psycopg

            class Local(psycopg.Cursor):  # type: ignore[no-redef]
                pass

            key = "cursor_factory"
        else:
            import pymysql

            class Local(pymysql.cursors.Cursor):  # type: ignore[no-redef]
                pass

            key = "cursorclass"
        engine = lease.create_engine(url, connect_args={key: Local})
        try:
            replicas(isolated(jobs.observes, "observes"), "a", database=engine)
            clock.advance(60)
            until(lambda: ended(url, "observes"), "the round on record")
        finally:
            engine.dispose()
        [(_, _, _, outcome, error)] = ended(url, "observes")
        assert outcome == "failed" and error is not None
        assert error.startswith(
            "DatabaseError: ctx.transaction() in a child process (isolation='process'): "
            f"the scheduler's engine connects with {key}, which cannot be pickled"
        )


def _execute(url: str, statement: str) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement))
    finally:
        engine.dispose()
