"""A clock for tests: time moves only when the test says so, and work settles in between."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ._clock import Clock, ClockEvent, _in_unit

__all__ = ["FakeClock"]

#: How long (real seconds) ``advance`` waits for started work to settle before it
#: reports which work is stuck instead of hanging the test run.
DEFAULT_SETTLE_TIMEOUT = 30.0


@dataclass(eq=False)
class _Waiter:
    """One blocked wait: woken by its event, its timer, or both (first wins)."""

    tracked: bool
    loop: asyncio.AbstractEventLoop | None = None
    fut: asyncio.Future[None] | None = None
    woken: bool = field(default=False)


class FakeClock(Clock):
    """A clock whose time moves only through [advance][cronjob.testing.FakeClock.advance]
    and [advance_to][cronjob.testing.FakeClock.advance_to].

    Every wait on the clock (``sleep``, an event's ``wait`` with a timeout, a round's
    ``ctx.wait``) registers a timer in fake time. ``advance`` moves time forward in
    order: each timer inside the interval fires at its own instant, and before firing the
    next one (and before returning) ``advance`` waits until all the work the scheduler
    started has finished or is waiting on the clock again. Nothing sleeps in real time
    for a schedule, so the same test gives the same result every time.

    Several schedulers may share one fake clock. Lease times follow it too.

    [step_wall][cronjob.testing.FakeClock.step_wall] steps the wall clock (``now``) without
    moving time itself, as NTP or a resumed VM does to a real machine: ``monotonic``, the
    timers and the lease times (the database's clock) are not moved.

    Args:
        start: The initial time, an aware datetime (converted to UTC).
        settle_timeout: Real seconds ``advance`` waits for running work (a job busy in
            real time, a database statement) before raising `RuntimeError`.

    Raises:
        ValueError: ``start`` is naive.
    """

    def __init__(self, start: datetime, *, settle_timeout: float = DEFAULT_SETTLE_TIMEOUT) -> None:
        if start.tzinfo is None or start.utcoffset() is None:
            raise ValueError(f"FakeClock needs an aware start time, got naive {start!r}")
        self._cond = threading.Condition()
        self._start = self._now = start.astimezone(UTC)  # time itself: timers, leases
        self._wall_offset = timedelta()  # what step_wall did to the wall clock
        self._timers: list[tuple[datetime, int, _Waiter]] = []
        self._seq = itertools.count()
        self._active = 0
        self._settle_timeout = settle_timeout

    def __repr__(self) -> str:
        return f"FakeClock({self.now().isoformat()})"

    def now(self) -> datetime:
        with self._cond:
            return self._now + self._wall_offset

    def monotonic(self) -> float:
        with self._cond:
            return (self._now - self._start).total_seconds()

    @property
    def in_process(self) -> bool:
        """True: every replica on a fake clock runs in this process (see [Clock][cronjob.Clock])."""
        return True

    def lease_clock(self) -> Callable[[], datetime]:
        """Lease times follow the fake time itself, which
        [step_wall][cronjob.testing.FakeClock.step_wall] leaves alone."""
        return self._time

    def _time(self) -> datetime:
        with self._cond:
            return self._now

    def event(self) -> ClockEvent:
        return _FakeEvent(self)

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock (`now`) by ``seconds``, backwards if negative.

        Nothing else moves: no timer fires, `monotonic` and the lease times are
        unchanged. Later ``advance`` calls move both on together.
        """
        with self._cond:
            self._wall_offset += timedelta(seconds=seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer on the way at its time.

        ``advance(0)`` fires what is due now and waits for the work in progress to settle.

        Raises:
            ValueError: ``seconds`` is negative.
            RuntimeError: started work did not settle within ``settle_timeout`` real
                seconds.
        """
        if seconds < 0:
            raise ValueError("time can't go backwards")
        with self._cond:
            target = self._now + self._wall_offset + timedelta(seconds=seconds)
        self.advance_to(target)

    def advance_to(self, when: datetime) -> None:
        """Move time forward until the wall clock (`now`) reads ``when``, as
        [advance][cronjob.testing.FakeClock.advance] does.

        Raises:
            ValueError: ``when`` is naive or earlier than the current time.
        """
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError(f"advance_to needs an aware datetime, got naive {when!r}")
        with self._cond:
            when = when.astimezone(UTC) - self._wall_offset
            if when < self._now:
                raise ValueError("time can't go backwards")
            self._settle()
            while self._timers and self._timers[0][0] <= when:
                due, _, waiter = heapq.heappop(self._timers)
                if waiter.woken:  # its event fired first: the timer is moot
                    continue
                self._now = max(self._now, due)
                self._wake(waiter)
                self._settle()
            self._now = when
            self._settle()

    # -- internals shared with _FakeEvent -------------------------------------------

    def _settle(self) -> None:
        deadline = time.monotonic() + self._settle_timeout
        while self._active > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"{self._active} unit(s) of work still running after "
                    f"{self._settle_timeout:g} real seconds: a job or a database statement "
                    "is busy without waiting on the clock"
                )
            self._cond.wait(left)

    def _wake(self, waiter: _Waiter) -> None:
        # Called with the lock held. The waker counts the waiter as running again
        # before it returns, so there is no moment when the work looks settled.
        if waiter.woken:
            return
        waiter.woken = True
        if waiter.tracked:
            self._active += 1
        if waiter.fut is not None and waiter.loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed: nobody to wake
                waiter.loop.call_soon_threadsafe(_resolve, waiter.fut)
        self._cond.notify_all()

    def _add_timer(self, seconds: float, waiter: _Waiter) -> None:
        # Rounded up to whole microseconds, the clock's resolution: a wait shorter than
        # one would otherwise be due at once, wake without time moving, and wait again
        # forever.
        due = self._now + timedelta(microseconds=math.ceil(seconds * 1_000_000))
        heapq.heappush(self._timers, (due, next(self._seq), waiter))

    def _idle(self, waiter: _Waiter) -> None:
        if waiter.tracked:
            self._active -= 1
            self._cond.notify_all()

    def _work_started(self) -> None:
        with self._cond:
            self._active += 1

    def _work_finished(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()


class _FakeEvent(ClockEvent):
    __slots__ = ("_clock", "_flag", "_waiters")

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._flag = False
        self._waiters: list[_Waiter] = []

    def set(self) -> None:
        with self._clock._cond:
            self._flag = True
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                self._clock._wake(waiter)

    def clear(self) -> None:
        with self._clock._cond:
            self._flag = False

    def is_set(self) -> bool:
        with self._clock._cond:
            return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        clock = self._clock
        with clock._cond:
            if self._flag:
                return True
            if timeout is not None and timeout <= 0:
                return False
            waiter = _Waiter(tracked=_in_unit.get())
            self._waiters.append(waiter)
            if timeout is not None:
                clock._add_timer(timeout, waiter)
            clock._idle(waiter)
            while not waiter.woken:
                clock._cond.wait()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            return self._flag

    async def wait_async(self, timeout: float | None = None) -> bool:
        clock = self._clock
        loop = asyncio.get_running_loop()
        with clock._cond:
            if self._flag:
                return True
            if timeout is not None and timeout <= 0:
                return False
            waiter = _Waiter(tracked=_in_unit.get(), loop=loop, fut=loop.create_future())
            self._waiters.append(waiter)
            if timeout is not None:
                clock._add_timer(timeout, waiter)
            clock._idle(waiter)
        assert waiter.fut is not None
        try:
            await waiter.fut
        except asyncio.CancelledError:
            # Cancelled while idle: count the task as running again unless a waker
            # already did.
            with clock._cond:
                clock._wake(waiter)
            raise
        finally:
            with clock._cond, contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        with clock._cond:
            return self._flag


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
