"""Job policies at run time: timeout, retries (and ``Retry``), start_deadline.

Replicas on one fake clock and one database (each of the three in turn), as in
``test_scheduler.py``; what a round ended as is read back from the history and the lease
row, as ``cronjob history`` and ``cronjob status`` read it. Nothing sleeps in real time.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest
from conftest import lease_row

import cronjob
from cronjob import Registry, admin
from cronjob.testing import FakeClock
from tests._helpers import JobBodies, run_then_stop

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(hours: int = 0, minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes, seconds=seconds)


class Rounds(JobBodies[tuple[cronjob.Round, datetime]]):
    """Job bodies that note each round they run: its ``ctx`` and when it started."""

    def _noted(self, ctx: cronjob.Round) -> tuple[cronjob.Round, datetime]:
        return (ctx, self.clock.now())

    def note(self, ctx: cronjob.Round) -> None:
        self._record(ctx)

    def attempts(self) -> list[tuple[datetime, int]]:
        return [(ctx.instant, ctx.attempt) for ctx, _ in self.seen]


@pytest.fixture
def rounds(clock: FakeClock) -> Rounds:
    return Rounds(clock)


def ended(url: str, name: str) -> list[tuple[datetime, int, str, str]]:
    """The job's history, oldest first: (instant, attempt, why, outcome)."""
    return [
        (r.instant, r.attempt, str(r.why), str(r.outcome))
        for r in reversed(admin.history(url, name))
    ]


class TestTimeout:
    def test_a_round_past_its_timeout_is_cancelled_recorded_timed_out_and_the_next_runs(
        self, url, replicas, clock, rounds, caplog
    ):
        refused: list[BaseException] = []

        def slow(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            if ctx.wait(30):
                try:
                    with ctx.transaction():
                        pass
                except cronjob.TimedOut as exc:
                    refused.append(exc)
                ctx.check()

        registry = Registry()
        registry.register(slow, "0 * * * * *", "slow", timeout=10)
        replicas(registry, "a")
        caplog.set_level(logging.WARNING, logger="cronjob")
        clock.advance(60 + 9.9)
        [(ctx, started)] = rounds.seen
        assert started == at(minutes=1) and not ctx.cancelled
        clock.advance(0.1)  # 10 s after it started
        assert isinstance(ctx.cause, cronjob.TimedOut)
        with pytest.raises(cronjob.TimedOut):
            ctx.check()
        assert len(refused) == 1  # the fenced transaction refused
        assert ended(url, "slow") == [(at(minutes=1), 1, "schedule", "timed_out")]
        row = lease_row(url, "slow")
        assert row.last_outcome == "timed_out" and row.failures == 1
        assert "TimedOut" in (row.last_error or "")
        assert any(
            r.levelno == logging.WARNING
            and "'slow'" in r.getMessage()
            and at(minutes=1).isoformat() in r.getMessage()
            and "timeout of 10 s" in r.getMessage()
            for r in caplog.records
        )
        clock.advance(50)  # 09:02: the next instant runs, as any after a round's end
        assert rounds.attempts() == [(at(minutes=1), 1), (at(minutes=2), 1)]

    def test_an_async_round_past_its_timeout_has_its_task_cancelled(
        self, url, replicas, clock, rounds
    ):
        cancelled: list[bool] = []

        async def slow(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            try:
                await ctx.wait_async(30)
            except BaseException:
                cancelled.append(True)
                raise

        registry = Registry()
        registry.register(slow, "0 * * * * *", "slow", timeout=10)
        replicas(registry, "a")
        clock.advance(70)
        assert cancelled == [True]
        assert ended(url, "slow") == [(at(minutes=1), 1, "schedule", "timed_out")]

    def test_a_round_ignoring_its_timeout_ends_the_process_and_never_overlaps_the_next(
        self, url, replicas, clock, rounds
    ):
        exits: list[str] = []
        stuck = threading.Event()

        def stubborn(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            if ctx.replica == "a":
                clock.sleep(3600)  # ignores its cancellation
                stuck.set()

        registry = Registry()
        registry.register(stubborn, "0 * * * * *", "stubborn", timeout=10)
        a = replicas(registry, "a", on_fatal=exits.append)
        clock.advance(60 + 10)  # 09:01 runs on a, cancelled at 09:01:10
        [(ctx, _)] = rounds.seen
        assert isinstance(ctx.cause, cronjob.TimedOut)
        clock.advance(4.9)
        assert exits == []
        clock.advance(0.1)  # 5 s after the timeout, the round still runs: the process ends
        assert len(exits) == 1
        assert "'stubborn'" in exits[0] and "after its timeout (10 s)" in exits[0]
        assert a._crashed
        # Another replica: it runs the job's next instant once the lease has expired, never
        # 09:01 again (a timed-out round is not run a second time), and never while the
        # ended process still held the lease.
        replicas(registry, "b")
        clock.advance(60)
        assert rounds.attempts() == [(at(minutes=1), 1), (at(minutes=2), 1)]
        _, b_started = rounds.seen[1]
        assert b_started == at(minutes=2) > at(minutes=1, seconds=15)
        assert not stuck.is_set()

    def test_a_per_instance_round_ignoring_its_timeout_is_left_to_its_thread(
        self, replicas, clock, rounds, caplog
    ):
        exits: list[str] = []

        def stubborn(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            if len(rounds.seen) == 1:
                clock.sleep(100)

        registry = Registry()
        registry.register_per_instance(stubborn, "0 * * * * *", "local", timeout=10)
        replicas(registry, "a", on_fatal=exits.append)
        caplog.set_level(logging.CRITICAL, logger="cronjob")
        clock.advance(60 + 15)
        assert exits == []
        assert any(
            r.levelno == logging.CRITICAL and "'local'" in r.getMessage() for r in caplog.records
        )
        clock.advance(60)  # 09:02 is due while the 09:01 round still runs: not started
        assert [i for i, _ in rounds.attempts()] == [at(minutes=1)]
        clock.advance(45)  # 09:02:40 it returns; 09:03, the next instant after its end, runs
        assert [i for i, _ in rounds.attempts()] == [at(minutes=1), at(minutes=3)]


class TestRetries:
    def test_a_failed_round_runs_again_for_the_same_instant_counting_attempts(
        self, url, replicas, clock, rounds
    ):
        def flaky(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            if ctx.attempt < 3:
                raise RuntimeError(f"boom {ctx.attempt}")

        registry = Registry()
        registry.register(flaky, "0 0 * * * *", "flaky", retries=3, retry_backoff=10)
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(3600)
        assert rounds.attempts()[0] == (at(hours=1), 1)
        row = lease_row(url, "flaky")
        assert row.state.value == "running"  # the lease is kept through the backoff
        clock.advance(10 + 20)  # the delays are at most 10 s, then 20 s (full jitter)
        assert rounds.attempts() == [(at(hours=1), 1), (at(hours=1), 2), (at(hours=1), 3)]
        assert len({ctx.replica for ctx, _ in rounds.seen}) == 1  # under the same lease
        assert ended(url, "flaky") == [
            (at(hours=1), 1, "schedule", "retrying"),
            (at(hours=1), 2, "retry", "retrying"),
            (at(hours=1), 3, "retry", "succeeded"),
        ]
        row = lease_row(url, "flaky")
        assert row.last_outcome == "succeeded" and row.failures == 0

    def test_the_last_attempt_that_fails_ends_failed(self, url, replicas, clock):
        def broken(ctx: cronjob.Round) -> None:
            raise RuntimeError("broken")

        registry = Registry()
        registry.register(broken, "0 0 * * * *", "broken", retries=1, retry_backoff=1)
        replicas(registry, "a")
        clock.advance(3600 + 2)
        assert [outcome for *_, outcome in ended(url, "broken")] == ["retrying", "failed"]
        row = lease_row(url, "broken")
        assert row.last_outcome == "failed" and row.failures == 1
        assert row.state.value == "done"

    def test_retry_with_a_delay_runs_after_exactly_that_delay(self, url, replicas, clock, rounds):
        def later(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            if ctx.attempt == 1:
                ctx.retry_in(30)

        registry = Registry()
        registry.register(later, "0 * * * * *", "later", retries=1)
        replicas(registry, "a")
        clock.advance(60 + 29.9)
        assert len(rounds.seen) == 1
        clock.advance(0.1)
        assert [started for _, started in rounds.seen] == [at(minutes=1), at(minutes=1, seconds=30)]
        assert [ctx.instant for ctx, _ in rounds.seen] == [at(minutes=1)] * 2
        assert [o for *_, o in ended(url, "later")] == ["retrying", "succeeded"]

    def test_retry_raised_without_retries_left_ends_failed(
        self, url, replicas, clock, rounds, caplog
    ):
        def asks(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            raise cronjob.Retry(1)

        registry = Registry()
        registry.register(asks, "0 0 * * * *", "asks", retries=1)
        replicas(registry, "a")
        caplog.set_level(logging.WARNING, logger="cronjob")
        clock.advance(3600 + 60)
        assert rounds.attempts() == [(at(hours=1), 1), (at(hours=1), 2)]
        assert [o for *_, o in ended(url, "asks")] == ["retrying", "failed"]
        assert any("has no attempt left" in r.getMessage() for r in caplog.records)

    def test_a_retry_that_would_start_at_the_next_instant_is_given_up_on_record(
        self, url, replicas, clock, rounds, caplog
    ):
        def racing(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            if ctx.instant == at(minutes=1):
                ctx.retry_in(60)  # 09:02:00: the job's next instant

        registry = Registry()
        registry.register(racing, "0 * * * * *", "racing", retries=2)
        replicas(registry, "a")
        caplog.set_level(logging.WARNING, logger="cronjob")
        clock.advance(120)
        assert rounds.attempts() == [(at(minutes=1), 1), (at(minutes=2), 1)]
        assert ended(url, "racing") == [
            (at(minutes=1), 1, "schedule", "failed"),
            (at(minutes=2), 1, "schedule", "succeeded"),
        ]
        assert any(
            "retry is given up" in r.getMessage() and "next instant" in r.getMessage()
            for r in caplog.records
        )

    def test_a_timeout_is_per_attempt_and_the_backoff_is_not_timed(
        self, url, replicas, clock, rounds
    ):
        cancelled_at: list[datetime] = []

        def job(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            if ctx.attempt == 1:
                ctx.retry_in(20)  # a backoff longer than the timeout: nothing times out
            if ctx.wait(8):
                cancelled_at.append(clock.now())
                ctx.check()

        registry = Registry()
        registry.register(job, "0 0 * * * *", "job", timeout=5, retries=1)
        replicas(registry, "a")
        clock.advance(3600 + 20 + 10)
        assert rounds.attempts() == [(at(hours=1), 1), (at(hours=1), 2)]
        # The second attempt started 10:00:20 and got its own full 5 s.
        assert cancelled_at == [at(hours=1, seconds=25)]
        assert [o for *_, o in ended(url, "job")] == ["retrying", "timed_out"]

    def test_a_drain_during_a_backoff_gives_the_round_up_and_frees_the_lease(
        self, url, replicas, clock, rounds
    ):
        def job(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            ctx.retry_in(600)

        registry = Registry()
        registry.register(job, "0 0 * * * *", "job", retries=1)
        a = replicas(registry, "a")
        clock.advance(3600 + 1)
        assert lease_row(url, "job").state.value == "running"
        assert a.drain()
        a.stop()
        row = lease_row(url, "job")
        assert row.last_outcome == "given up" and row.expires_ms is None
        b = replicas(registry, "b")
        clock.advance(60)  # b's sweep does not run the instant again
        assert rounds.attempts() == [(at(hours=1), 1)]
        b.stop()


class _Ceiling:
    """A jitter that always draws its ceiling: retry delays of exactly ``backoff * 2**(n-1)``."""

    def uniform(self, low: float, high: float) -> float:
        return high


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str | None]]:
    """The cronjob logger's records at WARNING and above: (level, message, exception type
    of the traceback logged with it, if any)."""
    return [
        (r.levelname, r.getMessage(), r.exc_info[0].__name__ if r.exc_info else None)
        for r in caplog.records
        if r.name == "cronjob" and r.levelno >= logging.WARNING
    ]


class TestRetryLogging:
    """Each failed attempt is one line; the traceback is logged once, when the round fails
    for good."""

    @pytest.fixture(autouse=True)
    def ceiling(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr("cronjob.engine._policies.JITTER", _Ceiling())

    def test_each_retry_is_one_line_and_the_last_failure_has_the_traceback(
        self, url, replicas, clock, caplog
    ):
        def broken(ctx: cronjob.Round) -> None:
            raise RuntimeError(f"boom {ctx.attempt}")

        registry = Registry()
        registry.register(broken, "0 0 * * * *", "broken", retries=2, retry_backoff=10)
        replicas(registry, "a")
        caplog.set_level(logging.WARNING, logger="cronjob")
        clock.advance(3600 + 10 + 20)
        instant = at(hours=1).isoformat()
        assert _lines(caplog) == [
            (
                "WARNING",
                f"round of job 'broken' instant {instant} attempt 1 of 3 failed "
                "(RuntimeError: boom 1); next try in 10 s",
                None,
            ),
            (
                "WARNING",
                f"round of job 'broken' instant {instant} attempt 2 of 3 failed "
                "(RuntimeError: boom 2); next try in 20 s",
                None,
            ),
            ("ERROR", f"round of job 'broken' instant {instant} attempt 3 failed", "RuntimeError"),
        ]

    def test_a_retry_given_up_at_a_drain_logs_the_last_failures_traceback_once(
        self, url, replicas, clock, caplog
    ):
        def broken(ctx: cronjob.Round) -> None:
            raise RuntimeError("boom")

        registry = Registry()
        registry.register(broken, "0 0 * * * *", "broken", retries=1, retry_backoff=600)
        a = replicas(registry, "a")
        caplog.set_level(logging.WARNING, logger="cronjob")
        clock.advance(3600 + 1)
        assert a.drain()
        a.stop()
        instant = at(hours=1).isoformat()
        assert [line for line in _lines(caplog) if "broken" in line[1]] == [
            (
                "WARNING",
                f"round of job 'broken' instant {instant} attempt 1 of 2 failed "
                "(RuntimeError: boom); next try in 600 s",
                None,
            ),
            (
                "WARNING",
                f"round of job 'broken' instant {instant}: its retry (attempt 2) is given up: "
                "the scheduler is draining",
                "RuntimeError",
            ),
        ]


class TestStartDeadline:
    def test_a_caught_up_round_past_its_deadline_is_not_run_and_on_record(
        self, url, replicas, clock, rounds, caplog
    ):
        registry = Registry()
        registry.register(rounds.lasting(1), "0 0 * * * *", "hourly", start_deadline=600)
        run_then_stop(replicas, registry, 3600 + 5)  # 10:00 runs
        clock.advance(3600 + 1800)  # down through 11:00; now 11:30:05
        caplog.set_level(logging.WARNING, logger="cronjob")
        replicas(registry, "b")
        clock.advance(0)
        assert rounds.attempts() == [(at(hours=1), 1)]
        assert ended(url, "hourly")[-1] == (at(hours=2), 1, "catch-up", "missed_deadline")
        row = lease_row(url, "hourly")
        assert row.last_outcome == "missed_deadline"
        assert any("start deadline of 600 s" in r.getMessage() for r in caplog.records)
        clock.advance(1800)  # 12:00 runs on time
        assert rounds.attempts()[-1] == (at(hours=3), 1)

    def test_the_deadline_is_met_exactly_at_its_boundary_and_missed_just_after(
        self, url, replicas, clock, rounds
    ):
        registry = Registry()
        registry.register(
            rounds.lasting(1), "0 0 * * * *", "hourly", start_deadline=timedelta(minutes=30)
        )
        run_then_stop(replicas, registry, 3600 + 5)  # 10:00 runs
        clock.advance(3600 - 5 + 1800)  # 11:30:00, exactly 30 min after 11:00
        b = replicas(registry, "b")
        clock.advance(5)
        assert rounds.attempts() == [(at(hours=1), 1), (at(hours=2), 1)]
        assert ended(url, "hourly")[-1] == (at(hours=2), 1, "catch-up", "succeeded")
        b.stop()
        clock.advance(3600 - 5 + 0.001)  # 12:30:00.001, just past 12:00's deadline
        replicas(registry, "c")
        clock.advance(0)
        assert rounds.attempts() == [(at(hours=1), 1), (at(hours=2), 1)]
        assert ended(url, "hourly")[-1] == (at(hours=3), 1, "catch-up", "missed_deadline")
