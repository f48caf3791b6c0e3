"""Rounds pinned at their claim: a schedule made of data changed or removed while its
round is claimed never changes what that round runs — its run, its retry, its second run,
the instant buffered or superseding after it, a jittered start — nor cuts it short; the
change governs only the instants not yet claimed.

Replicas on a fake clock, on each database; nothing sleeps in real time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import Trigger, admin, schedules
from cronjob._jitter import jitter_delay
from cronjob.testing import FakeClock

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


def at(minute: int, second: int = 0) -> datetime:
    return START + timedelta(minutes=minute, seconds=second)


class Seen:
    """What the task's rounds saw: (instant, attempt, args, replica, trigger)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rounds: list[tuple[datetime, int, dict[str, object], str, Trigger]] = []

    def note(self, ctx: cronjob.Round) -> None:
        with self.lock:
            self.rounds.append((ctx.instant, ctx.attempt, ctx.args, ctx.replica, ctx.trigger))

    def runs(self) -> list[tuple[datetime, int, dict[str, object]]]:
        """(instant, attempt, args) of each round begun, in order."""
        return [(instant, attempt, args) for instant, attempt, args, *_ in self.rounds]

    def instants(self) -> list[datetime]:
        return [instant for instant, *_ in self.rounds]


def registry_with(body: Callable[[cronjob.Round], object], **policy: object) -> cronjob.Registry:
    registry = cronjob.Registry()
    registry.register_task(body, "report", **policy)  # type: ignore[arg-type]
    return registry


def outcomes(url: str, name: str = "r") -> list[tuple[datetime, int, str]]:
    """(instant, attempt, outcome) of the schedule's rounds on record, oldest first."""
    return sorted((r.instant, r.attempt, str(r.outcome)) for r in admin.history(url, name))


class TestRun:
    def test_a_round_runs_the_task_and_args_it_was_claimed_with_to_its_end(
        self, engine, replicas, clock, db_url
    ):
        seen, other = Seen(), Seen()
        registry = registry_with(lambda ctx: (seen.note(ctx), ctx.wait(30), seen.note(ctx)))
        registry.register_task(other.note, "other")
        replicas(registry, "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY, args={"v": 1})
        clock.advance(65)  # 09:01 runs until 09:01:30
        schedules.update(engine, "r", task="other", args={"v": 2})
        clock.advance(60)
        assert seen.runs() == [(at(1), 1, {"v": 1}), (at(1), 1, {"v": 1})]
        assert other.runs() == [(at(2), 1, {"v": 2})]
        assert outcomes(db_url)[0] == (at(1), 1, "succeeded")


class TestRetry:
    def test_a_retry_runs_the_args_its_round_was_claimed_with(self, engine, replicas, clock):
        seen = Seen()

        def flaky(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.attempt == 1 and ctx.instant == at(1):
                raise cronjob.Retry(delay=20)

        replicas(registry_with(flaky, retries=1), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY, args={"v": 1})
        clock.advance(65)  # 09:01 failed; its retry waits until 09:01:20
        schedules.update(engine, "r", args={"v": 2})
        clock.advance(60)
        assert seen.runs() == [(at(1), 1, {"v": 1}), (at(1), 2, {"v": 1}), (at(2), 1, {"v": 2})]

    def test_a_schedule_removed_during_the_backoff_still_retries_and_ends_on_record(
        self, engine, replicas, clock, db_url
    ):
        seen = Seen()

        def flaky(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.attempt == 1 and ctx.instant == at(1):
                raise cronjob.Retry(delay=20)

        replicas(registry_with(flaky, retries=1), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY, args={"v": 1})
        clock.advance(65)  # 09:01 failed; its retry waits until 09:01:20
        assert schedules.remove(engine, "r")
        clock.advance(120)
        assert seen.runs() == [(at(1), 1, {"v": 1}), (at(1), 2, {"v": 1})]
        assert outcomes(db_url) == [(at(1), 1, "retrying"), (at(1), 2, "succeeded")]


class TestSecondRun:
    def test_a_second_run_here_runs_the_args_its_round_was_claimed_with(
        self, engine, replicas, clock, db_url
    ):
        seen = Seen()

        def cut(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.attempt == 1 and ctx.instant == at(1):
                ctx.wait(10)
                raise cronjob.Cancelled("cut short by the job itself")

        replicas(registry_with(cut), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY, args={"v": 1})
        clock.advance(65)  # 09:01 runs until 09:01:10, then is cut short
        schedules.update(engine, "r", args={"v": 2})
        clock.advance(50)  # the sweep runs it a second time, before 09:02
        assert seen.runs()[:2] == [(at(1), 1, {"v": 1}), (at(1), 2, {"v": 1})]
        assert (at(1), 2, "succeeded") in outcomes(db_url)


class TestAddedAgain:
    def test_a_schedule_added_again_is_owed_no_second_run_of_its_former_life(
        self, engine, replicas, clock, db_url
    ):
        """Removed while its round ran, that round cut short by a drain, then added
        again: the old instant is not run a second time."""
        seen = Seen()

        def slow(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.wait(30):
                ctx.check()

        first = replicas(registry_with(slow), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(65)  # 09:01 runs until 09:01:30
        assert schedules.remove(engine, "r")
        clock.advance(1)
        first.stop()  # the drain cuts 09:01 short
        assert outcomes(db_url) == [(at(1), 1, "cut short")]
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        replicas(registry_with(slow), "b")  # its first sweep finds 09:01 cut short
        clock.advance(120)
        assert [(instant, attempt) for instant, attempt, _ in seen.runs()] == [
            (at(1), 1),
            (at(2), 1),
            (at(3), 1),
        ]


class TestCancelOther:
    def test_a_removed_schedules_round_is_never_superseded(self, engine, replicas, clock, db_url):
        seen = Seen()

        def slow(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.wait(90):
                ctx.check()

        replicas(registry_with(slow, overlap="cancel_other"), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(70)  # 09:01 runs until 09:02:30
        assert schedules.remove(engine, "r")
        clock.advance(180)
        assert seen.instants() == [at(1)]
        assert outcomes(db_url) == [(at(1), 1, "succeeded")]

    def test_a_respecced_schedules_round_is_superseded_only_by_an_instant_it_has(
        self, engine, replicas, clock, db_url
    ):
        seen = Seen()

        def slow(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.instant == at(1) and ctx.wait(90):
                ctx.check()

        replicas(registry_with(slow, overlap="cancel_other"), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(70)  # 09:01 runs until 09:02:30
        schedules.update(engine, "r", spec="0 */5 * * * *")  # no 09:02 any more
        clock.advance(300)
        assert seen.instants() == [at(1), at(5)]
        assert outcomes(db_url) == [(at(1), 1, "succeeded"), (at(5), 1, "succeeded")]

    def test_the_new_timings_first_instant_after_the_change_supersedes_it(
        self, engine, replicas, clock, db_url
    ):
        seen = Seen()

        def slow(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.instant == at(1) and ctx.wait(90):
                ctx.check()

        replicas(registry_with(slow, overlap="cancel_other"), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(70)  # 09:01 runs until 09:02:30
        schedules.update(engine, "r", spec="30 * * * * *")  # 09:01:30 first after it
        clock.advance(21)
        assert seen.instants() == [at(1), at(1, 30)]  # superseded at 09:01:30, not 09:02
        clock.advance(40)
        assert seen.instants()[:2] == [at(1), at(1, 30)]
        assert outcomes(db_url)[:2] == [(at(1), 1, "superseded"), (at(1, 30), 1, "succeeded")]


class TestBufferOne:
    def test_after_a_spec_change_the_first_instant_after_it_waits(
        self, engine, replicas, clock, db_url
    ):
        seen = Seen()

        def slow(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.instant == at(1):
                ctx.wait(100)

        replicas(registry_with(slow, overlap="buffer_one"), "a")
        schedules.add(engine, "r", task="report", spec=MINUTELY)
        clock.advance(90)  # 09:01 runs until 09:02:40
        schedules.update(engine, "r", spec="*/20 * * * * *")  # 09:01:20 came before it
        clock.advance(80)
        assert seen.instants() == [at(1), at(1, 40)]  # buffered, started as 09:01 ended
        clock.advance(20)
        assert seen.instants() == [at(1), at(1, 40), at(3)]


class TestJitter:
    def test_an_instant_come_before_an_args_update_starts_at_its_jittered_start(
        self, engine, replicas, clock
    ):
        jitter = timedelta(seconds=40)
        # A schedule whose 09:01 round starts late enough to change it before.
        name = next(
            f"r{i}" for i in range(100) if jitter_delay(f"r{i}", at(1), jitter, at(2)).seconds > 5
        )
        delay = jitter_delay(name, at(1), jitter, at(2))
        seen = Seen()
        replicas(registry_with(seen.note, jitter=40), "a")
        replicas(registry_with(seen.note, jitter=40), "b")
        schedules.add(engine, name, task="report", spec=MINUTELY, args={"v": 1})
        clock.advance(61)  # 09:01 came; its round starts at 09:01 + delay
        schedules.update(engine, name, args={"v": 2})
        clock.advance(delay.total_seconds())
        assert seen.runs() == [(at(1), 1, {"v": 1})]
        clock.advance(60)
        assert [(i, args) for i, _a, args in seen.runs()] == [(at(1), {"v": 1}), (at(2), {"v": 2})]


class TestBackfillCancel:
    def test_a_cancel_leaves_the_second_run_a_drain_made_owed(self, db_url, replicas, clock):
        seen = Seen()

        def slow(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.wait(30):
                ctx.check()

        registry = cronjob.Registry()
        registry.register(slow, "0 0 * * * *", "report")
        first = replicas(registry, "a")
        clock.advance(3600 + 45)  # 10:00 ran until 10:00:30
        admin.backfill(
            db_url, "report", start=START - timedelta(hours=2), end=START, now=clock.now()
        )
        clock.advance(15)  # a took 07:00
        replicas(registry, "b")
        admin.pause(db_url, "report", now=clock.now())  # b waits to take anything
        first.stop()  # the drain cuts 07:00 short; b queues it again, owed its second run
        clock.advance(30)
        done = admin.cancel_backfill(db_url, "report", by="ops@laptop", now=clock.now())
        assert done.cancelled == (START - timedelta(hours=1),)
        admin.resume(db_url, "report", now=clock.now())
        clock.advance(120)
        backfills = [(i, r) for i, _a, _args, r, t in seen.rounds if t is Trigger.BACKFILL]
        seven = START - timedelta(hours=2)
        assert backfills == [(seven, "a"), (seven, "b")]
