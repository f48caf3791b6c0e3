"""The clock: every place the scheduler reads the time or waits goes through one.

Library code never reads the wall clock or sleeps directly. A [Clock][cronjob.Clock] gives the
wall time (``now``: instants, and what people read), a monotonic time (``monotonic``:
every deadline the process keeps for itself — renewal, lease loss, the forced exit,
sweeps — so that a wall clock stepped by NTP or a resumed VM cannot move them),
blocking and async sleeps, and *events*: flags a thread or a task can
wait on with a timeout measured on that clock. The system clock maps them onto
`threading`; [cronjob.testing.FakeClock][] maps them onto fake time and counts
the work in progress, so that ``advance`` can return only once everything its timers
started has finished or waits on the clock again.

Work accounting (``_work_started``/``_work_finished``/``_tracked``) is private: the
scheduler calls it around each unit of work it starts (its dispatcher, each round, each
database task). The system clock ignores it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType

__all__ = ["Clock", "ClockEvent", "SystemClock"]

#: True while the running thread or task executes a unit of work the clock accounts for.
_in_unit: contextvars.ContextVar[bool] = contextvars.ContextVar("cronjob_in_unit", default=False)


class ClockEvent(ABC):
    """A flag that threads and tasks can wait on, with timeouts on the owning clock."""

    @abstractmethod
    def set(self) -> None:
        """Set the flag and wake every waiter."""

    @abstractmethod
    def clear(self) -> None:
        """Reset the flag; later waits block again."""

    @abstractmethod
    def is_set(self) -> bool:
        """Return whether the flag is set."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set or ``timeout`` seconds of clock time have passed.

        Returns:
            The flag's value when the wait ended: ``True`` if it was set.
        """

    @abstractmethod
    async def wait_async(self, timeout: float | None = None) -> bool:
        """Like `wait`, for a coroutine running on an asyncio loop."""


class Clock(ABC):
    """Where the scheduler reads the time and waits.

    Implementations: [SystemClock][cronjob.SystemClock] (the default) and
    [cronjob.testing.FakeClock][].
    """

    @abstractmethod
    def now(self) -> datetime:
        """Return the current time as an aware UTC datetime."""

    @abstractmethod
    def monotonic(self) -> float:
        """Return seconds on a clock that never steps: only differences are meaningful.

        Waits (``sleep``, an event's timeout) run on this time, not on the wall clock.
        """

    @abstractmethod
    def event(self) -> ClockEvent:
        """Return a new, unset event whose timeouts run on this clock."""

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` of this clock's time."""
        self.event().wait(max(0.0, seconds))

    async def sleep_async(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` of this clock's time."""
        await self.event().wait_async(max(0.0, seconds))

    @property
    def in_process(self) -> bool:
        """Whether every replica whose leases this clock times lives in this process.

        True of a fake clock (lease times follow it, and no other process can share it):
        the scheduler then sees every write to the lease table and skips the sweeps that
        nothing could have changed. False of the system clock.
        """
        return False

    def lease_clock(self) -> Callable[[], datetime] | None:
        """Return the clock lease times follow, or ``None`` for the database's own clock.

        A fake clock returns its ``now`` so that lease expiry plays out in fake time; the
        system clock returns ``None``: lease times are read from the database, the one
        clock all replicas share.
        """
        return self.now

    # -- work accounting, used by the scheduler; no-ops unless a clock needs it --------

    def _work_started(self) -> None:  # noqa: B027 - a no-op unless a clock counts work
        """Count one more unit of work as running (called before handing it off)."""

    def _work_finished(self) -> None:  # noqa: B027 - a no-op unless a clock counts work
        """Count one unit of work as finished (called by the unit itself, last)."""

    def _tracked(self) -> contextlib.AbstractContextManager[None]:
        """Run the body as the unit of work announced by `_work_started`."""
        return _Tracked(self)


class _Tracked:
    """What `Clock._tracked` returns: an object, not a generator (once per round)."""

    __slots__ = ("_clock", "_token")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def __enter__(self) -> None:
        self._token = _in_unit.set(True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _in_unit.reset(self._token)
        self._clock._work_finished()


class _SystemEvent(ClockEvent):
    """An event on real time: a `threading.Event`, with an async wait on top."""

    __slots__ = ("_event", "_loops")

    def __init__(self) -> None:
        self._event = threading.Event()
        # Futures of async waiters, woken thread-safely on their own loops.
        self._loops: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def set(self) -> None:
        self._event.set()
        waiters, self._loops = self._loops, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(_resolve, fut)

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    async def wait_async(self, timeout: float | None = None) -> bool:
        if self._event.is_set():
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        entry = (loop, fut)
        self._loops.append(entry)
        if self._event.is_set():  # set() ran between the check and the append
            _resolve(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass
        finally:
            with contextlib.suppress(ValueError):
                self._loops.remove(entry)
        return self._event.is_set()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class SystemClock(Clock):
    """The real clock: UTC wall time for instants, monotonic waits for timeouts.

    Lease times are left to the database's clock (`lease_clock` is ``None``).
    """

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def event(self) -> ClockEvent:
        return _SystemEvent()

    def lease_clock(self) -> Callable[[], datetime] | None:
        return None

    def __repr__(self) -> str:
        return "SystemClock()"
