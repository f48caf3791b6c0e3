"""``ctx.why`` tells a job why its round runs, in its history row's words: a catch-up, a
second run, a retry, a manual round, each apart from a scheduled round, while
``ctx.trigger`` keeps its values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import cronjob
from cronjob import Registry, Trigger, admin
from cronjob.admin import Why
from cronjob.testing import FakeClock, crash, make_round
from tests._helpers import JobBodies

#: A Monday, on the hour (the conftest's clock starts here).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(hours: int = 0, minutes: int = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes)


class Seen(JobBodies[tuple[datetime, int, Trigger, Why]]):
    """Notes each round: (instant, attempt, trigger, why)."""

    def _noted(self, ctx: cronjob.Round) -> tuple[datetime, int, Trigger, Why]:
        return (ctx.instant, ctx.attempt, ctx.trigger, ctx.why)

    def note(self, ctx: cronjob.Round) -> None:
        self._record(ctx)


class TestWhyARoundRuns:
    def test_a_catch_up_at_start_is_told_apart_from_the_scheduled_rounds(
        self, url, replicas, clock: FakeClock
    ):
        seen = Seen(clock)
        registry = Registry()
        registry.register(seen.note, "0 0 * * * *", "hourly")
        a = replicas(registry, "a")
        clock.advance(3600 + 5)  # 10:00 runs on schedule
        a.stop()
        clock.advance(2 * 3600)  # 11:00 and 12:00 pass with no replica
        replicas(registry, "b")  # start-up catches 12:00 up
        clock.advance(3600)  # 13:00 on schedule
        assert seen.seen == [
            (at(hours=1), 1, Trigger.SCHEDULE, Why.SCHEDULE),
            (at(hours=3), 1, Trigger.SCHEDULE, Why.CATCH_UP),
            (at(hours=4), 1, Trigger.SCHEDULE, Why.SCHEDULE),
        ]
        # The round's word is its history row's (11:00, passed over by catch_up="latest",
        # is on record as a note beside them).
        assert [r.why for r in reversed(admin.history(url, "hourly"))] == [
            Why.SCHEDULE,
            Why.SKIPPED,
            Why.CATCH_UP,
            Why.SCHEDULE,
        ]

    def test_a_retry_and_a_second_run_say_so(self, url, replicas, clock: FakeClock):
        seen = Seen(clock)

        def flaky(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.attempt == 1:
                ctx.retry_in(10)

        def long(ctx: cronjob.Round) -> None:
            seen.note(ctx)
            if ctx.attempt == 1 and ctx.wait(600):
                ctx.check()

        registry = Registry()
        registry.register(flaky, "0 0 * * * *", "flaky", retries=1)
        registry.register(long, "0 0 * * * *", "long")
        a = replicas(registry, "a")
        clock.advance(3600 + 15)  # 10:00: flaky's retry runs at 10:00:10; long runs on
        crash(a)
        replicas(registry, "b")
        clock.advance(60)  # long's lease expires: b runs its second run
        assert sorted(seen.seen) == [
            (at(hours=1), 1, Trigger.SCHEDULE, Why.SCHEDULE),
            (at(hours=1), 1, Trigger.SCHEDULE, Why.SCHEDULE),
            (at(hours=1), 2, Trigger.SCHEDULE, Why.RERUN),
            (at(hours=1), 2, Trigger.SCHEDULE, Why.RETRY),
        ]

    def test_a_manual_round_says_so(self, url, replicas, clock: FakeClock):
        seen = Seen(clock)
        registry = Registry()
        registry.register(seen.note, "0 0 * * * *", "hourly")
        replicas(registry, "a")
        clock.advance(1)  # the replica's start is on record (its first sweep)
        admin.trigger(url, "hourly", by="ops", now=clock.now())
        clock.advance(20)  # within a sweep
        assert [(trigger, why) for _, _, trigger, why in seen.seen] == [
            (Trigger.MANUAL, Why.MANUAL)
        ]


class TestMakeRound:
    def test_it_builds_a_catch_up_round_for_a_unit_test(self):
        ctx = make_round("job", START, why=Why.CATCH_UP)
        assert (ctx.trigger, ctx.why) == (Trigger.SCHEDULE, Why.CATCH_UP)
        assert make_round("job", START).why is Why.SCHEDULE
        assert make_round("job", START, why=Why.BACKFILL).trigger is Trigger.BACKFILL
