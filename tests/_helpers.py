"""Plain helpers the test modules share (fixtures live in ``conftest.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import cronjob
from cronjob.testing import FakeClock


class JobBodies:
    """Job bodies that note each round they run, under a lock (rounds run on worker
    threads). A module's subclass says what it keeps of a round in :meth:`_record`."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._lock = threading.Lock()

    def _record(self, ctx: cronjob.Round) -> None:
        raise NotImplementedError

    def lasting(self, seconds: float) -> Callable[[cronjob.Round], None]:
        """A job that works ``seconds`` and stops early, cut short, when cancelled."""

        def job(ctx: cronjob.Round) -> None:
            self._record(ctx)
            if ctx.wait(seconds):
                ctx.check()

        return job

    def stubborn(self, seconds: float) -> Callable[[cronjob.Round], None]:
        """A job that works ``seconds`` and ignores its cancellation."""

        def job(ctx: cronjob.Round) -> None:
            self._record(ctx)
            self.clock.sleep(seconds)

        return job


def refuse_thread_starts(monkeypatch: pytest.MonkeyPatch, prefix: str) -> list[bool]:
    """While ``[0]`` of the list returned is true, starting a thread whose name starts
    with ``prefix`` fails as the OS limit does; other threads start as usual."""
    refusing = [False]
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if refusing[0] and self.name.startswith(prefix):
            raise RuntimeError("can't start new thread")
        original(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return refusing
