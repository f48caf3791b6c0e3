"""What the replicas leave on record, read back with cronjob.admin: job state, history.

Replicas are schedulers on one fake clock and one database (each of the three); the
tests read the record with ``admin.status`` / ``admin.history``, as an operator would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import History, Registry, admin
from cronjob.admin import Activity, Outcome, Why
from cronjob.testing import FakeClock

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(hours: int = 0, minutes: int = 0, seconds: int = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes, seconds=seconds)


def job_status(url: str, clock: FakeClock, name: str) -> admin.JobStatus:
    [found] = [job for job in admin.status(url, now=clock.now()).jobs if job.name == name]
    return found


class Flaky:
    """A job that fails while ``failing`` is set, with ``message``."""

    def __init__(self) -> None:
        self.failing = True
        self.message = "boom"

    def __call__(self, ctx: cronjob.Round) -> None:
        if self.failing:
            raise RuntimeError(self.message)


def lasting(seconds: float) -> Callable[[cronjob.Round], None]:
    def job(ctx: cronjob.Round) -> None:
        if ctx.wait(seconds):
            ctx.check()

    return job


class TestJobState:
    def test_a_success_is_on_record_with_its_replica_times_and_spec(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lasting(7), "CRON_TZ=Europe/Berlin 0 * * * * *", "tick")
        replicas(registry, "a")
        clock.advance(60 + 3)  # the 09:01 round runs until 09:01:07
        running = job_status(db_url, clock, "tick")
        assert (running.activity, running.running_on) == (Activity.RUNNING, "a")
        assert running.running_since == at(minutes=1)
        clock.advance(10)
        job = job_status(db_url, clock, "tick")
        assert job.spec == "CRON_TZ=Europe/Berlin 0 * * * * *"
        assert job.zone == "Europe/Berlin"
        assert job.per_instance is False
        assert job.activity is Activity.IDLE and job.running_on is None
        assert job.last_outcome is Outcome.SUCCEEDED
        assert (job.instant, job.attempt) == (at(minutes=1), 1)
        assert job.last_start == at(minutes=1)
        assert job.last_end == job.last_success == at(minutes=1, seconds=7)
        assert job.last_duration == timedelta(seconds=7)
        assert job.next_instant == at(minutes=2)
        assert (job.consecutive_failures, job.last_error, job.problems) == (0, None, ())
        assert job.skipped_through is None

    def test_failures_in_a_row_are_counted_and_a_success_resets_them(self, db_url, replicas, clock):
        flaky = Flaky()
        registry = Registry()
        registry.register(flaky, "0 * * * * *", "flaky")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(2 * 60)
        job = job_status(db_url, clock, "flaky")
        assert job.last_outcome is Outcome.FAILED
        assert job.consecutive_failures == 2
        assert job.last_error == "RuntimeError: boom"
        assert job.last_success is None
        assert job.problems == ("failing: 2 rounds in a row failed",)
        status = admin.status(db_url, now=clock.now())
        assert not status.healthy
        assert status.problems == ("flaky: failing: 2 rounds in a row failed",)
        flaky.failing = False
        clock.advance(60)
        job = job_status(db_url, clock, "flaky")
        assert (job.last_outcome, job.consecutive_failures, job.last_error) == (
            Outcome.SUCCEEDED,
            0,
            None,
        )
        assert job.last_success == at(minutes=3)
        assert admin.status(db_url, now=clock.now()).healthy

    def test_a_round_cut_short_then_given_up_is_on_record(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lasting(100), "0 0 * * * *", "hourly")
        a = replicas(registry, "a")
        clock.advance(3600)
        b = replicas(registry, "b")
        a.stop()  # cut short: b runs it a second time
        job = job_status(db_url, clock, "hourly")
        assert (job.last_outcome, job.consecutive_failures) == (Outcome.CUT_SHORT, 0)
        clock.advance(15)
        job = job_status(db_url, clock, "hourly")
        assert (job.activity, job.running_on, job.attempt) == (Activity.RUNNING, "b", 2)
        b.stop()  # cut short again: given up
        job = job_status(db_url, clock, "hourly")
        assert (job.last_outcome, job.consecutive_failures) == (Outcome.GAVE_UP, 1)
        assert job.problems == ("failing: 1 round in a row given up",)
        rounds = admin.history(db_url, "hourly")
        assert [(r.attempt, r.replica, r.why, r.outcome) for r in rounds] == [
            (2, "b", Why.RERUN, Outcome.GAVE_UP),
            (1, "a", Why.SCHEDULE, Outcome.CUT_SHORT),
        ]
        assert all(r.instant == at(hours=1) for r in rounds)

    def test_the_instants_an_overrun_skipped_are_on_record(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lasting(150), "0 * * * * *", "slow")
        replicas(registry, "a")
        clock.advance(3 * 60 + 40)  # 09:01 runs until 09:03:30: 09:02 and 09:03 skipped
        job = job_status(db_url, clock, "slow")
        assert job.instant == at(minutes=1)
        assert job.skipped_through == at(minutes=3, seconds=30)
        assert job.last_duration == timedelta(seconds=150)
        clock.advance(20)  # 09:04 runs: the skip stays on record
        job = job_status(db_url, clock, "slow")
        assert (job.instant, job.activity) == (at(minutes=4), Activity.RUNNING)
        assert job.skipped_through == at(minutes=3, seconds=30)

    def test_a_job_without_a_success_for_two_periods_and_the_slack_is_stale(
        self, db_url, replicas, clock
    ):
        registry = Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        a = replicas(registry, "a")
        clock.advance(3600)
        a.stop()  # no replica runs it any more
        assert job_status(db_url, clock, "hourly").problems == ()
        clock.advance(2 * 3600 + 60)  # 12:01: two periods and the slack since 10:00
        missed = "missed: 2 instants of the last day did not run"  # 11:00, 12:00 (60 s ago)
        assert job_status(db_url, clock, "hourly").problems == (missed,)
        clock.advance(1)
        assert job_status(db_url, clock, "hourly").problems == (
            "stale: no successful end within 2h1m (last at 2026-03-02T10:00:00+00:00)",
            "missed: 2 instants of the last day did not run",
        )


class TestHistory:
    def test_each_round_is_a_row_newest_first_with_its_trace_id(self, db_url, replicas, clock):
        contexts: list[cronjob.Round] = []
        lock = threading.Lock()

        def job(ctx: cronjob.Round) -> None:
            with lock:
                contexts.append(ctx)

        registry = Registry()
        registry.register(job, "0 * * * * *", "tick")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(3 * 60)
        rounds = admin.history(db_url, "tick")
        assert [r.instant for r in rounds] == [at(minutes=m) for m in (3, 2, 1)]
        by_instant = {ctx.instant: ctx for ctx in contexts}
        for record in rounds:
            ctx = by_instant[record.instant]
            assert (record.job, record.attempt, record.replica) == ("tick", 1, ctx.replica)
            assert record.trace_id == ctx.trace_id
            assert (record.why, record.outcome, record.error) == (
                Why.SCHEDULE,
                Outcome.SUCCEEDED,
                None,
            )
            assert record.started == record.ended == record.instant

    def test_limit_failed_and_since_select_rounds(self, db_url, replicas, clock):
        flaky = Flaky()
        registry = Registry()
        registry.register(flaky, "0 * * * * *", "flaky")
        replicas(registry, "a")
        clock.advance(2 * 60)  # 09:01 and 09:02 fail
        flaky.failing = False
        clock.advance(2 * 60)  # 09:03 and 09:04 succeed
        assert [r.instant for r in admin.history(db_url, "flaky", limit=3)] == [
            at(minutes=4),
            at(minutes=3),
            at(minutes=2),
        ]
        failed = admin.history(db_url, "flaky", failed=True)
        assert [(r.instant, r.outcome) for r in failed] == [
            (at(minutes=2), Outcome.FAILED),
            (at(minutes=1), Outcome.FAILED),
        ]
        since = admin.history(db_url, "flaky", since=at(minutes=3))
        assert [r.instant for r in since] == [at(minutes=4), at(minutes=3)]

    def test_a_catch_up_is_marked_so(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        first = replicas(registry, "a")
        clock.advance(3600)
        first.stop()
        clock.advance(3 * 3600 + 60)  # 13:01: 11:00 to 13:00 were missed
        replicas(registry, "b")
        clock.advance(1)
        latest = admin.history(db_url, "hourly")[0]
        assert (latest.instant, latest.why, latest.replica) == (at(hours=4), Why.CATCH_UP, "b")

    def test_an_error_is_stored_bounded_and_as_text(self, db_url, replicas, clock):
        flaky = Flaky()
        flaky.message = "<script>alert('x')</script>" + "é" * 5000
        registry = Registry()
        registry.register(flaky, "0 * * * * *", "flaky")
        replicas(registry, "a")
        clock.advance(60)
        [record] = admin.history(db_url, "flaky")
        assert record.error is not None
        assert record.error.startswith("RuntimeError: <script>alert('x')</script>éé")
        assert record.error.endswith("é [...]")
        assert len(record.error) == 1000
        assert job_status(db_url, clock, "flaky").last_error == record.error

    def test_an_unknown_job_is_a_lookup_error(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 * * * * *", "tick")
        replicas(registry, "a")
        clock.advance(1)  # start-up writes the job's lease row on its control thread
        assert admin.history(db_url, "tick") == []  # known, nothing ran yet
        with pytest.raises(admin.UnknownJob, match=r"^no job named 'tock' is on record$"):
            admin.history(db_url, "tock")
        assert issubclass(admin.UnknownJob, LookupError)

    def test_history_can_be_turned_off(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 * * * * *", "tick")
        replicas(registry, "a", history=None)
        clock.advance(60)
        assert admin.history(db_url, "tick") == []
        assert job_status(db_url, clock, "tick").last_outcome is Outcome.SUCCEEDED

    def test_pruning_keeps_the_newest_rounds_of_each_job(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 */10 * * * *", "ten")
        registry.register(lambda ctx: None, "0 5 * * * *", "five-past")
        replicas(registry, "a", history=History(per_job=2))
        clock.advance(3600 - 1)  # 09:05 to 09:50: pruned at 09:05, the hour's turn
        assert len(admin.history(db_url, "ten")) == 5
        clock.advance(1)  # 10:00: the next hour's turn, after the end of 10:00
        assert [r.instant for r in admin.history(db_url, "ten")] == [at(1), at(0, 50)]
        assert [r.instant for r in admin.history(db_url, "five-past")] == [at(0, 5)]

    def test_pruning_deletes_rounds_older_than_the_days_kept(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        replicas(registry, "a", history=History(days=0.1))  # 2.4 h
        clock.advance(4 * 3600)
        assert [r.instant for r in admin.history(db_url, "hourly")] == [
            at(4),
            at(3),
            at(2),
        ]

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"days": 0}, r"^history days must be a positive number, not 0$"),
            ({"per_job": 0}, r"^history per_job must be a whole number >= 1, not 0$"),
            ({"per_job": 1.5}, r"^history per_job must be a whole number >= 1, not 1.5$"),
        ],
    )
    def test_bad_history_options_are_refused(self, options, message):
        with pytest.raises(ValueError, match=message):
            History(**options)


class TestBadDatabase:
    @pytest.mark.blank_database
    def test_a_database_without_tables_says_so_and_changes_nothing(self, db_url):
        with pytest.raises(admin.TablesMissing, match=r"^no cronjob tables.*nothing was changed"):
            admin.status(db_url)
        with pytest.raises(admin.TablesMissing):
            admin.history(db_url, "tick")
        assert tables(db_url) == set()

    @pytest.mark.blank_database
    def test_an_older_schema_says_which_and_changes_nothing(self, db_url):
        engine = lease.create_engine(db_url)
        try:
            with engine.connect() as conn:
                config = lease._migrate._config()
                config.attributes["connection"] = conn
                import alembic.command

                alembic.command.upgrade(config, "0001")
                conn.commit()
        finally:
            engine.dispose()
        before = tables(db_url)
        with pytest.raises(
            admin.SchemaOutdated,
            match=r"^the cronjob tables are at revision 0001, older than 0018, which this "
            r"release reads: start a replica of this release",
        ):
            admin.status(db_url)
        assert tables(db_url) == before == {"cronjob_lease", "cronjob_alembic_version"}
        assert lease.current_revision(lease.create_engine(db_url)) == "0001"


def tables(url: str) -> set[str]:
    engine = lease.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


class TestReplicas:
    def test_each_replica_is_on_record_with_its_jobs(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 * * * * *", "tick")
        registry.register_per_instance(lambda ctx: None, "@every 1h", "local")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(0)  # started: each swept once
        status = admin.status(db_url, now=clock.now())
        assert [r.id for r in status.replicas] == ["a", "b"]
        for replica in status.replicas:
            assert replica.jobs == ("local", "tick")
            assert replica.version == cronjob.__version__
            assert replica.pid > 0 and replica.host
            assert replica.started == replica.last_seen == START
        local = job_status(db_url, clock, "local")
        assert (local.per_instance, local.spec, local.next_instant) == (True, "@every 1h", at(1))
        assert local.last_outcome is None and local.problems == ()

    def test_a_replica_not_seen_for_a_minute_is_not_listed(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 0 0 * * *", "daily")
        a = replicas(registry, "a")
        clock.advance(0)  # its first sweep puts it on record
        cronjob.testing.crash(a)  # as a killed process: its record stays
        assert [r.id for r in admin.status(db_url, now=at(0, 1)).replicas] == ["a"]
        assert admin.status(db_url, now=at(0, 1, 1)).replicas == ()

    def test_a_replica_that_stops_cleanly_is_not_listed_at_once(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 0 0 * * *", "daily")
        a = replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(0)
        a.stop()  # drains, then takes its record off the replica table
        assert [r.id for r in admin.status(db_url, now=clock.now()).replicas] == ["b"]

    def test_replicas_that_disagree_on_a_spec_are_reported(self, db_url, replicas, clock):
        old, new = Registry(), Registry()
        old.register(lambda ctx: None, "0 0 * * * *", "report")
        new.register(lambda ctx: None, "0 30 * * * *", "report")
        replicas(old, "old")
        clock.advance(0)  # its start-up's ensure written (on its control thread) first
        replicas(new, "new")  # started last: its spec is the one on the lease row
        clock.advance(0)
        job = job_status(db_url, clock, "report")
        assert job.spec == "0 30 * * * *"
        assert job.specs_seen == ("0 0 * * * *", "0 30 * * * *")
        assert job.problems == ("replicas registered different specs: 0 0 * * * *, 0 30 * * * *",)


class TestReplicaStatements:
    def test_a_sweep_refreshes_the_replica_in_its_own_statement_on_postgres(
        self, migrated_engine, manual_clock
    ):
        store = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        store.ensure(["a"])
        replica = lease.ReplicaRow(
            holder="r1",
            host="h",
            pid=1,
            version="v",
            started=manual_clock.now(),
            seen=manual_clock.now(),
            jobs={"a": ("@every 5s", True)},
        )
        sent: list[str] = []

        def count(conn, cursor, statement, *args):
            if not statement.lstrip().upper().startswith(("SET", "BEGIN")):
                sent.append(statement)

        sa.event.listen(migrated_engine, "before_cursor_execute", count)
        store.survey(["a"], replica=replica)
        manual_clock.advance(15)
        store.survey(["a"], replica=replica)
        sa.event.remove(migrated_engine, "before_cursor_execute", count)
        per_sweep = 1 if migrated_engine.dialect.name == "postgresql" else 2
        assert len(sent) == 2 * per_sweep
        [row] = store.replicas(seen_since_ms=0)
        assert (row.holder, row.started, row.seen) == (
            "r1",
            manual_clock.now() - timedelta(seconds=15),
            manual_clock.now(),
        )
        assert row.jobs == {"a": ("@every 5s", True)}

    def test_pruning_deletes_replicas_gone_for_long(self, migrated_engine, manual_clock):
        store = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        for holder in ("gone", "here"):
            store.record_replica(
                lease.ReplicaRow(
                    holder=holder,
                    host="h",
                    pid=1,
                    version="v",
                    started=manual_clock.now(),
                    seen=manual_clock.now(),
                    jobs={},
                )
            )
            manual_clock.advance(3600)
        assert store.prune(days=14, per_name=10, replicas_gone=3600) == (0, 1)
        assert [r.holder for r in store.replicas(seen_since_ms=0)] == ["here"]
