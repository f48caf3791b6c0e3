"""The two channels between the scheduler's threads: the inbox and the control thread.

- :class:`Inbox`: any thread posts a message (a callable) for the dispatcher thread,
  which runs it next time it wakes. This is the only way other threads change the
  scheduling state.
- :class:`Control`: the dispatcher hands a database statement to the one control
  thread, which runs it and posts ``done(result or exception)`` back through the inbox.
  The dispatcher itself never waits on the database.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, TypeVar

from ._clock import Clock
from ._workers import Workers

__all__ = ["Control", "Inbox"]

T = TypeVar("T")


class Inbox:
    """Messages for the dispatcher thread, and the event that wakes it."""

    def __init__(self, clock: Clock) -> None:
        self._messages: collections.deque[Callable[[], None]] = collections.deque()
        #: Set on every post; the dispatcher waits on it until its next deadline.
        self.wake = clock.event()

    def post(self, message: Callable[[], None]) -> None:
        """Hand ``message`` to the dispatcher thread and wake it. Safe from any thread."""
        self._messages.append(message)
        self.wake.set()

    def run_pending(self) -> None:
        """Run every message posted so far (the dispatcher thread only)."""
        while self._messages:
            self._messages.popleft()()


class Control:
    """The control thread: runs lease statements one at a time, in the order given."""

    def __init__(self, clock: Clock, inbox: Inbox) -> None:
        self._clock = clock
        self._inbox = inbox
        self._thread = Workers(1, "cronjob-control")

    def run(self, work: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
        """Run ``work`` on the control thread; post ``done(result or exception)`` back.

        After :meth:`shutdown` the work is dropped and ``done`` is never called.
        """

        def task() -> None:
            with self._clock._tracked():
                result: Any
                try:
                    result = work()
                except Exception as exc:
                    result = exc
                self._inbox.post(lambda: done(result))

        self._clock._work_started()
        try:
            self._thread.submit(task)
        except RuntimeError:  # shut down meanwhile
            self._clock._work_finished()

    def shutdown(self, wait: float | None) -> bool:
        """Refuse new work; let queued statements finish within ``wait`` real seconds.

        Returns:
            ``True`` if the thread ended in time.
        """
        return self._thread.shutdown(wait=wait)
