"""The fake clock: time moves only when told, timers fire in order, work settles."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone

import pytest

from cronjob._clock import Clock
from cronjob.testing import FakeClock

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def tracked_thread(clock: Clock, target, *args) -> threading.Thread:
    """Start ``target`` as a unit of work the clock accounts for, as the scheduler does."""

    def body() -> None:
        with clock._tracked():
            target(*args)

    clock._work_started()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


class TestTime:
    def test_it_starts_where_told_in_utc(self):
        berlin = timezone(timedelta(hours=1))
        clock = FakeClock(datetime(2026, 1, 1, 1, 0, tzinfo=berlin))
        assert clock.now() == NOW
        assert clock.now().tzinfo is UTC

    def test_it_refuses_a_naive_start(self):
        with pytest.raises(ValueError, match=r"^FakeClock needs an aware start time"):
            FakeClock(datetime(2026, 1, 1))

    def test_advance_moves_time_forward(self):
        clock = FakeClock(NOW)
        clock.advance(90)
        assert clock.now() == NOW + timedelta(seconds=90)

    def test_it_refuses_to_go_backwards(self):
        clock = FakeClock(NOW)
        with pytest.raises(ValueError, match=r"^time can't go backwards$"):
            clock.advance(-1)
        with pytest.raises(ValueError, match=r"^time can't go backwards$"):
            clock.advance_to(NOW - timedelta(seconds=1))

    def test_advance_to_refuses_a_naive_time(self):
        with pytest.raises(ValueError, match=r"^advance_to needs an aware datetime"):
            FakeClock(NOW).advance_to(datetime(2026, 1, 2))


class TestWallSteps:
    def test_monotonic_time_counts_the_seconds_advanced(self):
        clock = FakeClock(NOW)
        start = clock.monotonic()
        clock.advance(90)
        assert clock.monotonic() - start == 90

    def test_step_wall_moves_now_alone(self):
        clock = FakeClock(NOW)
        lease_now = clock.lease_clock()
        assert lease_now is not None
        clock.step_wall(-20)
        assert clock.now() == NOW - timedelta(seconds=20)
        assert clock.monotonic() == 0
        assert lease_now() == NOW  # the database's clock is not this machine's
        clock.advance(30)
        assert clock.now() == NOW + timedelta(seconds=10)
        assert lease_now() == NOW + timedelta(seconds=30)

    def test_a_wall_step_fires_no_timer(self):
        clock = FakeClock(NOW)
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(clock.event().wait(10)))
        waiter.start()
        while not clock._timers:  # registered in fake time; no real sleep for a schedule
            threading.Event().wait(0.001)
        clock.step_wall(+3600)
        clock.advance(9)
        assert waiter.is_alive()
        clock.advance(1)
        waiter.join(5)
        assert woke == [False]

    def test_advance_to_reads_the_stepped_wall_clock(self):
        clock = FakeClock(NOW)
        clock.step_wall(+60)
        clock.advance_to(NOW + timedelta(seconds=90))
        assert clock.monotonic() == 30


class TestTimers:
    def test_each_timer_fires_at_its_own_time(self):
        clock = FakeClock(NOW)
        seen: list[tuple[str, datetime]] = []

        def sleeper(name: str, seconds: float) -> None:
            clock.sleep(seconds)
            seen.append((name, clock.now()))

        threads = [tracked_thread(clock, sleeper, n, s) for n, s in [("b", 20), ("a", 10)]]
        clock.advance(0)  # both are asleep now
        clock.advance(60)
        for thread in threads:
            thread.join(5)
        assert seen == [
            ("a", NOW + timedelta(seconds=10)),
            ("b", NOW + timedelta(seconds=20)),
        ]

    def test_advance_returns_only_after_the_work_a_timer_started_has_finished(self):
        clock = FakeClock(NOW)
        done = threading.Event()

        def sleeper() -> None:
            clock.sleep(5)
            sum(range(200_000))  # real work after waking, not on the clock
            done.set()

        tracked_thread(clock, sleeper)
        clock.advance(5)
        assert done.is_set()

    def test_work_that_waits_again_counts_as_settled(self):
        clock = FakeClock(NOW)
        wakes: list[datetime] = []

        def ticker() -> None:
            for _ in range(3):
                clock.sleep(10)
                wakes.append(clock.now())

        tracked_thread(clock, ticker)
        clock.advance(25)
        assert wakes == [NOW + timedelta(seconds=10), NOW + timedelta(seconds=20)]
        clock.advance(5)
        assert wakes[-1] == NOW + timedelta(seconds=30)

    def test_an_event_set_before_its_timer_wins_and_time_does_not_jump(self):
        clock = FakeClock(NOW)
        event = clock.event()
        result: list[bool] = []
        tracked_thread(clock, lambda: result.append(event.wait(100)))
        clock.advance(0)
        event.set()
        clock.advance(1)
        assert result == [True]
        assert clock.now() == NOW + timedelta(seconds=1)

    def test_an_event_wait_times_out_on_fake_time(self):
        clock = FakeClock(NOW)
        event = clock.event()
        result: list[tuple[bool, datetime]] = []
        tracked_thread(clock, lambda: result.append((event.wait(30), clock.now())))
        clock.advance(29)
        assert result == []
        clock.advance(1)
        assert result == [(False, NOW + timedelta(seconds=30))]

    def test_it_reports_work_that_never_settles(self):
        clock = FakeClock(NOW, settle_timeout=0.2)
        release = threading.Event()
        thread = tracked_thread(clock, release.wait)
        with pytest.raises(RuntimeError, match=r"^1 unit\(s\) of work still running"):
            clock.advance(1)
        release.set()
        thread.join(5)


class TestAsync:
    def test_an_async_wait_wakes_on_fake_time(self):
        import asyncio

        clock = FakeClock(NOW)
        result: list[tuple[bool, datetime]] = []

        async def main() -> None:
            with clock._tracked():
                result.append((await clock.event().wait_async(15), clock.now()))

        clock._work_started()
        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        clock.advance(15)
        thread.join(5)
        assert result == [(False, NOW + timedelta(seconds=15))]


class TestShortWaits:
    def test_a_wait_shorter_than_a_microsecond_lets_time_move_on(self):
        """A caller waiting until a monotonic deadline a fraction of a microsecond away
        must see time pass, not be woken at the same moment forever."""
        clock = FakeClock(NOW)
        deadline = clock.monotonic() + 1e-7
        waits: list[float] = []

        def until_deadline() -> None:
            event = clock.event()
            while (left := deadline - clock.monotonic()) > 0:
                waits.append(left)
                event.wait(left)

        thread = tracked_thread(clock, until_deadline)
        advancing = threading.Thread(target=clock.advance, args=(1,), daemon=True)
        advancing.start()
        advancing.join(10)
        assert not advancing.is_alive(), "advance(1) never returned"
        thread.join(5)
        assert len(waits) == 1
