"""Nothing doubled, nothing silently dropped: rounds whose worker, job or tracing misbehaves.

Each test runs schedulers on one fake clock and one database (SQLite, PostgreSQL,
MariaDB), as tests/test_scheduler.py does, and makes one thing go wrong where a round
meets its thread: no thread can be started (the OS limit, injected by making
``Thread.start`` raise for the round pool's threads), a job or span processor whose
failure cannot even be printed, every worker thread busy on a hung job, a sync callable
that hands back a coroutine. Nothing sleeps in real time.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from conftest import lease_row
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

import cronjob
import lease
from cronjob import Registry
from cronjob.testing import FakeClock
from tests._helpers import refuse_thread_starts, statements

#: A Monday, on the hour: the first every-minute instant is 09:01:00.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(minutes: int = 0, seconds: int = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


def epoch_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


class Rounds:
    """Job bodies that record the rounds they run (thread-safe)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.ran: list[tuple[str, datetime, int, str]] = []
        self._lock = threading.Lock()

    def record(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.ran.append((ctx.name, ctx.instant, ctx.attempt, ctx.replica))

    def of(self, name: str) -> list[tuple[datetime, int, str]]:
        return sorted((i, a, r) for n, i, a, r in self.ran if n == name)


@pytest.fixture
def rounds(clock: FakeClock) -> Rounds:
    return Rounds(clock)


@pytest.fixture
def no_round_threads(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Make starting a round worker thread fail as the OS limit does; ``(False)`` lifts it.

    Only the round pool's threads (``cronjob-round-*``) are refused: the dispatcher, the
    control thread and the finisher start as usual.
    """
    refusing = refuse_thread_starts(monkeypatch, "cronjob-round")

    def refuse(on: bool) -> None:
        refusing[0] = on

    return refuse


class TestNoThreadForARound:
    """Item 4: a round that cannot get a thread never runs later unaccounted."""

    def test_a_round_no_thread_can_run_is_given_back_and_runs_a_second_time(
        self, db_url, replicas, clock, rounds, no_round_threads, caplog
    ):
        registry = Registry()
        registry.register(rounds.record, "0 * * * * *", "tick")
        replicas(registry, "a")
        no_round_threads(True)
        with caplog.at_level(logging.ERROR, logger="cronjob"):
            clock.advance_to(at(1))
        assert rounds.of("tick") == []
        row = lease_row(db_url, "tick")
        assert (row.instant, row.state, row.expires_ms) == (at(1), lease.LeaseState.CUT, None)
        assert any(
            "job 'tick'" in r.getMessage() and "no worker thread could be started" in r.getMessage()
            for r in caplog.records
        )
        no_round_threads(False)
        clock.advance_to(at(2, 5))  # the sweep (every ~15 s) re-runs it; then 09:02 runs
        assert rounds.of("tick") == [(at(1), 2, "a"), (at(2), 1, "a")]

    def test_the_rounds_of_a_claim_no_thread_can_run_are_given_back_in_one_statement(
        self, db_url, replicas, clock, rounds, no_round_threads
    ):
        registry = Registry()
        names = [f"tick-{i}" for i in range(6)]
        for name in names:
            registry.register(rounds.record, "0 * * * * *", name)
        engine = lease.create_engine(db_url)
        # A give-back of rounds never started: state cut, attempt 1 (give_back_all).
        give_backs = statements(engine, keep=lambda s: "last_outcome=" in s and "attempt=" in s)
        replicas(registry, "a", database=engine)
        no_round_threads(True)
        with give_backs as sent:
            clock.advance_to(at(1))
        engine.dispose()
        assert all(rounds.of(name) == [] for name in names)
        for name in names:
            assert lease_row(db_url, name).state is lease.LeaseState.CUT
        assert len(sent) == 1, sent

    def test_a_round_without_a_new_thread_waits_for_a_busy_one_with_its_lease_renewed(
        self, db_url, replicas, clock, rounds, no_round_threads, caplog
    ):
        def long(ctx: cronjob.Round) -> None:
            rounds.record(ctx)
            ctx.wait(60)

        registry = Registry()
        registry.register(long, "0 1 9 * * *", "long")
        registry.register(rounds.record, "30 1 9 * * *", "late")
        replicas(registry, "a", max_workers=2)
        clock.advance_to(at(1))  # "long" takes the pool's first thread
        no_round_threads(True)
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            clock.advance_to(at(1, 30))  # "late": no second thread; it waits in the queue
        assert rounds.of("late") == []
        assert any("can't start new thread" in r.getMessage() for r in caplog.records)
        clock.advance_to(at(1, 55))
        row = lease_row(db_url, "late")
        assert row.holder == "a" and row.state is lease.LeaseState.RUNNING
        assert row.expires_ms is not None and row.expires_ms > epoch_ms(at(1, 55))  # renewed
        clock.advance_to(at(2, 5))  # "long" ends: its thread takes "late"
        assert rounds.of("late") == [(at(1, 30), 1, "a")]
        assert lease_row(db_url, "late").state is lease.LeaseState.DONE


class Unprintable(Exception):
    """A job's failure whose ``str()`` itself raises."""

    def __str__(self) -> str:
        raise ValueError("cannot describe this failure")


class RaisingOnEnd(SpanProcessor):
    """A span processor that fails every time a span ends."""

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("exporter exploded")


class RaisingOnStart(SpanProcessor):
    """A span processor that fails every time a span starts."""

    def on_start(self, span: object, parent_context: object = None) -> None:
        raise RuntimeError("processor exploded")


class TestWorkersNeverDie:
    """Item 7a: whatever a job or the bookkeeping raises, the worker thread lives on."""

    def test_a_job_whose_failure_cannot_be_printed_leaves_its_worker_alive(
        self, db_url, replicas, clock, rounds
    ):
        def bad(ctx: cronjob.Round) -> None:
            rounds.record(ctx)
            raise Unprintable

        registry = Registry()
        registry.register(bad, "0 * * * * *", "bad")
        registry.register(rounds.record, "30 * * * * *", "tick")
        scheduler = replicas(registry, "a", max_workers=1)
        clock.advance_to(at(3, 35))
        assert rounds.of("bad") == [(at(m), 1, "a") for m in (1, 2, 3)]
        assert rounds.of("tick") == [(at(m, 30), 1, "a") for m in (0, 1, 2, 3)]
        assert lease_row(db_url, "bad").state is lease.LeaseState.DONE
        assert scheduler.drain(timeout=1)

    def test_a_span_processor_that_raises_leaves_the_workers_alive(
        self, db_url, replicas, clock, rounds
    ):
        provider = TracerProvider()
        provider.add_span_processor(RaisingOnEnd())
        registry = Registry()
        registry.register(rounds.record, "0 * * * * *", "tick")
        registry.register(rounds.record, "30 * * * * *", "tock")
        scheduler = replicas(registry, "a", max_workers=1, tracer_provider=provider)
        clock.advance_to(at(3, 35))
        assert [i for i, _, _ in rounds.of("tick")] == [at(1), at(2), at(3)]
        assert [i for i, _, _ in rounds.of("tock")] == [at(m, 30) for m in (0, 1, 2, 3)]
        assert scheduler.drain(timeout=1)

    def test_a_round_whose_span_cannot_start_fails_and_keeps_its_schedule(
        self, db_url, replicas, clock, rounds, caplog
    ):
        provider = TracerProvider()
        provider.add_span_processor(RaisingOnStart())
        registry = Registry()
        registry.register(rounds.record, "0 * * * * *", "tick")
        scheduler = replicas(registry, "a", max_workers=1, tracer_provider=provider)
        with caplog.at_level(logging.ERROR, logger="cronjob"):
            clock.advance_to(at(3, 5))
        assert rounds.of("tick") == []  # the job never ran outside its unit of work
        assert sum("the job did not run" in r.getMessage() for r in caplog.records) == 3
        assert lease_row(db_url, "tick").instant == at(3)  # each instant was claimed, ended
        assert lease_row(db_url, "tick").state is lease.LeaseState.DONE
        assert scheduler.drain(timeout=1)


class TestSaturatedWorkers:
    """Item 7b: a replica whose worker threads are all busy claims no sync job."""

    def test_a_saturated_replica_leaves_the_instant_unclaimed_and_says_so(
        self, db_url, replicas, clock, rounds, caplog
    ):
        def hung(ctx: cronjob.Round) -> None:
            rounds.record(ctx)
            clock.sleep(300)  # ignores its cancellation

        registry = Registry()
        registry.register(hung, "30 0 9 * * *", "hung")
        registry.register(rounds.record, "0 * * * * *", "tick")
        replicas(registry, "a", max_workers=1)
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            clock.advance_to(at(1, 5))
        assert rounds.of("hung") == [(at(0, 30), 1, "a")]
        row = lease_row(db_url, "tick")
        assert row.instant is None  # 09:01 was not claimed: nothing holds it
        assert any(
            "'tick'" in r.getMessage() and "all 1 worker thread(s) are busy" in r.getMessage()
            for r in caplog.records
        )
        clock.advance_to(at(6, 5))  # "hung" ended at 09:05:30: 09:06 runs
        assert rounds.of("tick") == [(at(6), 1, "a")]

    def test_another_replica_runs_what_a_saturated_one_does_not_claim(
        self, replicas, clock, rounds
    ):
        def hung(ctx: cronjob.Round) -> None:
            rounds.record(ctx)
            clock.sleep(300)

        busy = Registry()
        busy.register(hung, "30 0 9 * * *", "hung")
        busy.register(rounds.record, "0 * * * * *", "tick")
        free = Registry()
        free.register(rounds.record, "0 * * * * *", "tick")
        replicas(busy, "a", max_workers=1)
        # b starts after a's last wake before 09:01, so a's timer fires first and claims first.
        clock.advance_to(at(0, 57))  # "hung" holds a's only thread until 09:05:30
        replicas(free, "b")
        clock.advance_to(at(5, 45))  # past the end of "hung", so that a can drain
        assert rounds.of("tick") == [(at(m), 1, "b") for m in range(1, 6)]

    def test_per_instance_and_async_rounds(self, db_url, replicas, clock, rounds):
        """A per-instance round is never refused but takes a slot; async rounds take none."""

        def hung(ctx: cronjob.Round) -> None:
            rounds.record(ctx)
            clock.sleep(300)

        async def tick_async(ctx: cronjob.Round) -> None:
            rounds.record(ctx)

        registry = Registry()
        registry.register_per_instance(hung, "30 0 9 * * *", "local-hung")
        registry.register_per_instance(rounds.record, "0 * * * * *", "local")
        registry.register(rounds.record, "0 * * * * *", "tick")
        registry.register(tick_async, "0 * * * * *", "tick-async")
        replicas(registry, "a", max_workers=1)
        clock.advance_to(at(2, 5))
        assert rounds.of("local-hung") == [(at(0, 30), 1, "a")]
        assert rounds.of("tick") == []  # every thread is taken by the per-instance round
        assert lease_row(db_url, "tick").instant is None  # and no instant was claimed
        assert rounds.of("tick-async") == [(at(1), 1, "a"), (at(2), 1, "a")]
        clock.advance_to(at(6, 5))
        # The per-instance rounds of 09:01..09:05 queued behind "local-hung" and ran
        # (late) once it ended; none was refused.
        assert [i for i, _, _ in rounds.of("local")][:1] == [at(1)]
        assert (at(6), 1, "a") in rounds.of("tick")


class TestShortRoundsQueued:
    """A share larger than the pool is not saturation: short rounds queued behind each
    other are through within the second (the design point, many jobs on few threads)."""

    def test_an_instant_due_while_short_rounds_still_queue_is_claimed_and_runs(
        self, db_url, replicas, clock, rounds, caplog
    ):
        def short(ctx: cronjob.Round) -> None:
            rounds.record(ctx)
            ctx.wait(0.4)

        registry = Registry()
        for name in ("a", "b", "c"):  # 1.2 s of work at each even second, on one thread
            registry.register(short, "*/2 * * * * *", name)
        registry.register(rounds.record, "1/2 * * * * *", "odd")
        replicas(registry, "a", max_workers=1)
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            clock.advance_to(at(0, 10) + timedelta(seconds=0.5))
        # At each odd second "c" still runs (0.2 s in): "odd" is claimed, queued, run.
        assert [i for i, _, _ in rounds.of("odd")] == [at(0, s) for s in (1, 3, 5, 7, 9)]
        # (09:00 is the replica's start, not an instant it runs; "c" of 09:00:10 starts
        # at 10.8 s.)
        assert [i for i, _, _ in rounds.of("c")] == [at(0, s) for s in (2, 4, 6, 8)]
        assert not [r for r in caplog.records if "busy" in r.getMessage()]

    def test_rounds_waiting_a_second_for_a_thread_make_the_replica_saturated(
        self, db_url, replicas, clock, rounds, caplog
    ):
        def short(ctx: cronjob.Round) -> None:
            rounds.record(ctx)
            ctx.wait(0.5)

        registry = Registry()
        for i in range(6):  # 3 s of rounds at each :x0, on one thread
            registry.register(short, "*/10 * * * * *", f"q{i}")
        registry.register(rounds.record, "2/10 * * * * *", "t")
        replicas(registry, "a", max_workers=1)
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            clock.advance_to(at(0, 25))
        # At :12 and :22 the rounds of :10 and :20 still queued have waited 2 s: "t" is
        # left to others. (At :02 nothing queued: 09:00 was the replica's start.)
        assert rounds.of("t") == [(at(0, 2), 1, "a")]
        busy = [r.getMessage() for r in caplog.records if "busy" in r.getMessage()]
        assert len(busy) == 2 and all("'t'" in message for message in busy)
        assert [i for i, _, _ in rounds.of("q5")] == [at(0, 10), at(0, 20)]


class TestCoroutineFromASyncJob:
    """Item 13: a sync callable that returns a coroutine fails loudly, never "ran"."""

    def test_a_lambda_returning_a_coroutine_fails_the_round(
        self, db_url, replicas, clock, rounds, caplog
    ):
        async def body(ctx: cronjob.Round) -> None:
            rounds.record(ctx)

        registry = Registry()
        registry.register(lambda ctx: body(ctx), "0 * * * * *", "wrapped")
        replicas(registry, "a")
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
            warnings.simplefilter("always")
            clock.advance_to(at(1, 5))
            gc.collect()
        assert rounds.of("wrapped") == []  # the coroutine never ran
        assert not [w for w in caught if "never awaited" in str(w.message)]
        failed = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
        assert any(
            "job 'wrapped'" in r.getMessage()
            and "register an `async def` function" in str(r.exc_info[1])
            for r in failed
        )
        assert not any("ran to its end" in r.getMessage() for r in caplog.records)

    def test_a_sync_job_returning_a_future_fails_the_round(self, replicas, clock, caplog):
        loop = asyncio.new_event_loop()
        try:
            registry = Registry()
            registry.register(lambda ctx: loop.create_future(), "0 * * * * *", "future")
            replicas(registry, "a")
            with caplog.at_level(logging.INFO, logger="cronjob"):
                clock.advance_to(at(1, 5))
        finally:
            loop.close()
        assert any(r.levelno == logging.ERROR for r in caplog.records)
        assert not any("ran to its end" in r.getMessage() for r in caplog.records)
