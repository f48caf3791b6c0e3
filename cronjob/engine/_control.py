"""The two channels between the scheduler's threads: the inbox and the control thread.

- `Inbox`: any thread posts a message (a callable) for the dispatcher thread,
  which runs it next time it wakes. This is the only way other threads change the
  scheduling state.
- `Control`: the dispatcher hands a database statement to the one control
  thread, which runs it and posts ``done(result or exception)`` back through the inbox.
  The dispatcher itself never waits on the database. A result that arrives once the
  dispatcher has gone (the inbox is closed) goes to ``orphaned`` instead, on the control
  thread: a claim that returns after ``stop()`` gives its leases back there.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .._clock import Clock
from ._workers import Workers

__all__ = ["Control", "Inbox"]

log = logging.getLogger("cronjob")

T = TypeVar("T")


class Inbox:
    """Messages for the dispatcher thread, and the event that wakes it."""

    def __init__(self, clock: Clock) -> None:
        self._messages: collections.deque[Callable[[], None]] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False
        #: Set on every post; the dispatcher waits on it until its next deadline.
        self.wake = clock.event()

    def post(self, message: Callable[[], None]) -> bool:
        """Hand ``message`` to the dispatcher thread and wake it. Safe from any thread.

        Returns:
            ``False`` if the inbox is closed (the dispatcher has gone): nobody will run
            ``message``.
        """
        with self._lock:
            if self._closed:
                return False
            # A message already waiting has woken the dispatcher (or is about to): it
            # runs every message until none is left. Thousands of rounds ending at
            # once set the event once, not once each.
            first = not self._messages
            self._messages.append(message)
        if first:
            self.wake.set()
        return True

    def run_pending(self) -> None:
        """Run every message posted so far (the dispatcher thread only)."""
        while self._messages:
            self._messages.popleft()()

    def close(self) -> None:
        """Refuse new messages, then run those already posted (the dispatcher, last)."""
        with self._lock:
            self._closed = True
        self.run_pending()


class Control:
    """The control thread: runs lease statements one at a time, in the order given."""

    def __init__(self, clock: Clock, inbox: Inbox, *, name: str = "cronjob-control") -> None:
        self._clock = clock
        self._inbox = inbox
        self._thread = Workers(1, name)

    def sibling(self, name: str) -> Control:
        """Another thread of its own (``name``) that posts to the same inbox."""
        return Control(self._clock, self._inbox, name=name)

    def run(
        self,
        work: Callable[[], T],
        done: Callable[[T | BaseException], None],
        orphaned: Callable[[T], None] | None = None,
    ) -> None:
        """Run ``work`` on the control thread; post ``done(result or exception)`` back.

        If the inbox is closed by the time ``work`` returns, ``orphaned(result)`` runs
        instead, on the control thread (not for an exception). After `shutdown`
        the work is dropped and neither is called.
        """

        def task() -> None:
            with self._clock._tracked():
                result: Any
                try:
                    result = work()
                except Exception as exc:
                    result = exc
                if self._inbox.post(lambda: done(result)):
                    return
                if orphaned is not None and not isinstance(result, BaseException):
                    try:
                        orphaned(result)
                    except Exception:
                        log.exception("after stop: handling a late result failed")

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
