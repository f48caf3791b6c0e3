"""Schedules made of data, run: every rule of a leased job holds per schedule, across
replicas on a fake clock, on each database; changes reach running replicas.

The calls' own checks (bad input, transactions at the API) are in test_schedules_api.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import admin, schedules
from cronjob.testing import FakeClock, crash

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = "0 * * * * *"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = lease.create_engine(db_url)
    lease.migrate(engine)
    yield engine
    engine.dispose()


class Seen:
    """What the task's rounds saw: (id, instant, attempt, replica, task, args)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rounds: list[tuple[str, datetime, int, str, str, dict[str, object]]] = []

    def note(self, ctx: cronjob.Round) -> None:
        with self.lock:
            self.rounds.append(
                (ctx.name, ctx.instant, ctx.attempt, ctx.replica, ctx.task, ctx.args)
            )

    def instants(self, id_: str) -> list[datetime]:
        return sorted(instant for name, instant, *_ in self.rounds if name == id_)

    def clear(self) -> None:
        with self.lock:
            self.rounds.clear()


def registry_with(
    body: Callable[[cronjob.Round], object], name: str = "report", **policy: object
) -> cronjob.Registry:
    registry = cronjob.Registry()
    registry.register_task(body, name, **policy)  # type: ignore[arg-type]
    return registry


def at(minute: int, second: int = 0) -> datetime:
    return START + timedelta(minutes=minute, seconds=second)


class TestOncePerInstant:
    def test_each_schedule_runs_once_per_instant_across_replicas_with_its_args(
        self, engine, replicas, clock
    ):
        seen = Seen()
        registry = registry_with(seen.note)
        for replica in ("a", "b", "c"):
            replicas(registry, replica)
        with engine.begin() as conn:
            for tenant in range(6):
                schedules.add(
                    conn, f"report:{tenant}", task="report", spec=MINUTELY, args={"t": tenant}
                )
        clock.advance(180.5)
        for tenant in range(6):
            assert seen.instants(f"report:{tenant}") == [at(1), at(2), at(3)]
        for name, _instant, attempt, _replica, task, args in seen.rounds:
            assert (attempt, task, args) == (1, "report", {"t": int(name.split(":")[1])})
        # Shared out: more than one replica ran some.
        assert len({replica for *_, replica, _task, _args in seen.rounds}) > 1

    def test_a_replica_without_the_task_runs_none_of_its_schedules(self, engine, replicas, clock):
        seen, other = Seen(), Seen()
        replicas(registry_with(seen.note), "a")
        replicas(registry_with(other.note, name="other"), "old")  # another release's set
        schedules.add(engine, "report:1", task="report", spec=MINUTELY)
        clock.advance(120.5)
        assert seen.instants("report:1") == [at(1), at(2)]
        assert other.rounds == []


class TestTransactions:
    def test_no_replica_runs_a_schedule_before_its_commit_nor_after_a_rollback(
        self, engine, replicas, clock
    ):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        replicas(registry_with(seen.note), "b")
        with pytest.raises(RuntimeError), engine.begin() as conn:
            schedules.add(conn, "rolled-back", task="report", spec=MINUTELY)
            raise RuntimeError("the application's transaction fails")
        conn = engine.connect()
        transaction = conn.begin()
        schedules.add(conn, "late", task="report", spec="*/10 * * * * *")
        if engine.dialect.name == "sqlite":
            transaction.commit()  # SQLite's writer would hold the other replicas out
            committed_at = clock.now()
        else:
            clock.advance(30.5)  # open: seen by no replica
            assert seen.rounds == []
            transaction.commit()
            committed_at = clock.now()
        conn.close()
        clock.advance(30)
        assert seen.instants("rolled-back") == []
        late = seen.instants("late")
        assert late and late[0] > committed_at
        assert len(late) == len(set(late))


class TestChanges:
    def test_a_changed_spec_governs_from_its_first_instant_after_the_change(
        self, engine, replicas, clock
    ):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        replicas(registry_with(seen.note), "b")
        schedules.add(engine, "r", task="report", spec=MINUTELY, args={"v": 1})
        clock.advance(90)  # 09:01:30: 09:01 ran
        schedules.update(engine, "r", spec="*/20 * * * * *", args={"v": 2})
        clock.advance(60)
        assert seen.instants("r") == [at(1), at(1, 40), at(2), at(2, 20)]
        assert [args for name, *_, args in seen.rounds] == [{"v": 1}, {"v": 2}, {"v": 2}, {"v": 2}]

    def test_a_removed_schedule_finishes_its_round_and_starts_no_instant_after(
        self, engine, replicas, clock, db_url
    ):
        seen = Seen()

        def slow(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            ctx.wait(20)

        replicas(registry_with(slow), "a")
        replicas(registry_with(slow), "b")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(65)  # its 09:01 round runs until 09:01:20
        assert schedules.remove(engine, "r")
        clock.advance(180)
        assert seen.instants("r") == [at(1)]
        [record] = admin.history(db_url, "r")
        assert record.outcome is admin.Outcome.SUCCEEDED

    def test_a_schedule_added_again_after_removal_runs_again(self, engine, replicas, clock):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(60.5)
        schedules.remove(engine, "r")
        clock.advance(60)
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(60)
        assert seen.instants("r") == [at(1), at(3)]


class TestOneOffAndWindows:
    def test_a_one_off_runs_once_at_its_instant(self, engine, replicas, clock):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        replicas(registry_with(seen.note), "b")
        schedules.add(engine, "remind", task="report", at=at(2, 30), args={"user": 991})
        clock.advance(600)
        assert seen.instants("remind") == [at(2, 30)]

    def test_a_one_off_whose_instant_passed_within_the_day_runs_once_at_once(
        self, engine, replicas, clock
    ):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        replicas(registry_with(seen.note), "b")
        schedules.add(engine, "late", task="report", at=START - timedelta(hours=3))
        schedules.add(engine, "stale", task="report", at=START - timedelta(days=2))
        clock.advance(30)
        assert seen.instants("late") == [START - timedelta(hours=3)]
        assert seen.instants("stale") == []

    def test_start_and_end_bound_the_instants(self, engine, replicas, clock):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        schedules.add(engine, "w", task="report", spec=MINUTELY, start=at(2), end=at(4))
        clock.advance(400)
        assert seen.instants("w") == [at(2), at(3), at(4)]


class TestLeaseRules:
    def test_a_round_cut_short_by_a_crash_runs_a_second_time_elsewhere(
        self, engine, replicas, clock
    ):
        seen = Seen()

        def slow(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.wait(30):
                ctx.check()

        registry = registry_with(slow)
        running = {name: replicas(registry, name) for name in ("a", "b")}
        schedules.add(engine, "r", task="report", spec="0 0 * * * *")
        clock.advance(3605)
        [(_name, _instant, _attempt, first, *_)] = seen.rounds
        crash(running[first])
        clock.advance(60)
        attempts = [(r[1], r[2], r[3] != first) for r in seen.rounds]
        hour = START + timedelta(hours=1)
        assert attempts == [(hour, 1, False), (hour, 2, True)]

    def test_the_tasks_policies_hold_per_schedule(self, engine, replicas, clock, db_url):
        failures: list[str] = []
        tries: list[tuple[str, int]] = []

        def flaky(ctx: cronjob.Round) -> None:
            tries.append((ctx.name, ctx.attempt))
            raise RuntimeError("down")

        registry = registry_with(
            flaky, retries=1, retry_backoff=5, on_failure=lambda r: failures.append(r.job)
        )
        running = [replicas(registry, "a"), replicas(registry, "b")]
        schedules.add(engine, "r:1", task="report", spec=MINUTELY)
        clock.advance(80)
        for scheduler in running:
            scheduler.stop()  # the hooks thread is joined
        assert tries == [("r:1", 1), ("r:1", 2)]
        assert failures == ["r:1"]
        outcomes = [str(r.outcome) for r in reversed(admin.history(db_url, "r:1"))]
        assert outcomes == ["retrying", "failed"]

    def test_a_fenced_transaction_commits_under_the_schedules_lease(self, engine, replicas, clock):
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE sent (id VARCHAR(50), tenant INTEGER)"))

        def send(ctx: cronjob.Round) -> None:
            with ctx.transaction() as conn:
                conn.execute(
                    sa.text("INSERT INTO sent VALUES (:id, :tenant)"),
                    {"id": ctx.name, "tenant": ctx.args["tenant"]},
                )

        replicas(registry_with(send), "a")
        replicas(registry_with(send), "b")
        schedules.add(engine, "r:7", task="report", spec=MINUTELY, args={"tenant": 7})
        clock.advance(60.5)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT id, tenant FROM sent")).all() == [("r:7", 7)]

    def test_a_paused_schedule_runs_nothing_until_resumed(self, engine, replicas, clock, db_url):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY, paused=True)
        clock.advance(120.5)
        assert seen.rounds == []
        admin.resume(db_url, "r", by="ops", now=clock.now())
        clock.advance(60)
        assert seen.instants("r") == [at(3)]


class TestRestart:
    def test_a_schedule_that_ran_before_catches_up_its_missed_instant_once(
        self, engine, replicas, clock
    ):
        seen = Seen()
        registry = registry_with(seen.note)
        first = replicas(registry, "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(60.5)
        first.stop()
        clock.advance(150)  # 09:02 and 09:03 pass with no replica
        replicas(registry_with(seen.note), "b")
        replicas(registry_with(seen.note), "c")
        clock.advance(1)
        assert seen.instants("r") == [at(1), at(3)]

    def test_a_schedule_that_never_ran_catches_up_its_latest_instant_since_its_commit(
        self, engine, replicas, clock
    ):
        """Committed while no replica runs, it is owed its instants from the commit (the
        policies' cases are in test_schedules_commit.py)."""
        seen = Seen()
        schedules.add(engine, "r", task="report", spec=MINUTELY, now=clock.now())
        clock.advance(150)  # 09:01 and 09:02 pass with no replica
        replicas(registry_with(seen.note), "a")
        clock.advance(1)
        assert seen.instants("r") == [at(2)]
        clock.advance(60)
        assert seen.instants("r") == [at(2), at(3)]


class TestStatus:
    def test_status_names_the_task_and_a_schedule_no_running_replica_can_run(
        self, engine, replicas, clock, db_url
    ):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        schedules.add(engine, "report:1", task="report", spec="*/10 * * * * *")
        schedules.add(engine, "orphan:1", task="gone", spec="*/10 * * * * *")
        # Within a minute of the replica's record (an idle fake clock does not refresh it).
        clock.advance(20.5)
        report = admin.status(db_url, now=clock.now())
        jobs = {job.name: job for job in report.jobs}
        assert jobs["report:1"].task == "report" and jobs["report:1"].problems == ()
        assert jobs["report:1"].last_outcome is admin.Outcome.SUCCEEDED
        assert jobs["orphan:1"].problems == ("no replica runs task gone",)
        assert not report.healthy
        # Never silently dropped: its row stays, and a replica with the task runs it.
        assert schedules.get(engine, "orphan:1") is not None
        other = cronjob.Registry()
        other.register_task(seen.note, "gone")
        replicas(other, "b")
        clock.advance(10)
        assert seen.instants("orphan:1") == [at(0, 30)]


class TestLaterReleases:
    def test_a_schedule_of_a_later_format_is_left_alone_never_run_without_what_it_asks(
        self, engine, replicas, clock, caplog
    ):
        seen = Seen()
        replicas(registry_with(seen.note), "a")
        with engine.begin() as conn:
            schedules.add(conn, "later", task="report", spec=MINUTELY)
            # As a later release would write it: with something this release lacks.
            conn.execute(
                sa.text("UPDATE cronjob_schedule SET format = :f WHERE id = 'later'"),
                {"f": lease.SCHEDULE_FORMAT + 1},
            )
        schedules.add(engine, "known", task="report", spec=MINUTELY)
        clock.advance(60.5)
        assert seen.instants("later") == []
        assert seen.instants("known") == [at(1)]
        later = lease.SCHEDULE_FORMAT + 1
        assert f"schedule 'later' is written in format {later}" in caplog.text


class TestRemovedWhileRunning:
    def test_the_last_round_of_a_removed_schedule_still_tells_its_tasks_hook(
        self, engine, replicas, clock
    ):
        failures: list[str] = []

        def failing(ctx: cronjob.Round) -> None:
            ctx.wait(20)
            raise RuntimeError("down")

        registry = registry_with(failing, on_failure=lambda r: failures.append(r.job))
        running = replicas(registry, "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(65)  # its 09:01 round runs until 09:01:20
        schedules.remove(engine, "r")
        clock.advance(60)
        running.stop()  # the hooks thread is joined
        assert failures == ["r"]
