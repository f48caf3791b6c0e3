"""The finisher: ends held back while rounds wait for a thread, and never for long."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import lease
from cronjob.engine._finisher import HOLD_LIMIT, Finisher
from cronjob.engine._workers import Workers
from cronjob.testing import FakeClock

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def store(sqlite_url: str) -> Iterator[lease.LeaseStore]:
    engine = lease.create_engine(sqlite_url)
    lease.migrate(engine)
    yield lease.LeaseStore(engine, clock=lambda: T0, claim_ahead=None)
    engine.dispose()


class Ends:
    """Ends handed to a finisher (by name), and the outcomes it reports."""

    def __init__(self, store: lease.LeaseStore, names: list[str]) -> None:
        store.ensure(names)
        self.claims = {c.name: c for c in store.claim(names, T0, "r1")}
        self.outcomes: dict[str, bool | BaseException] = {}
        self.done = threading.Event()
        self._lock = threading.Lock()

    def finisher(self, store: lease.LeaseStore, **options: Any) -> Finisher[str]:
        return Finisher(store, ending=self.ending, done=self.written, **options)

    def hand(self, finisher: Finisher[str], name: str) -> None:
        finisher.finish_later(name)

    def ending(self, name: str) -> lease.Ending:
        return lease.Ending(
            name=name, token=self.claims[name].token, ended=T0 + timedelta(seconds=1)
        )

    def written(self, results: list[tuple[str, bool | BaseException]]) -> None:
        with self._lock:
            self.outcomes.update(results)
            if len(self.outcomes) == len(self.claims):
                self.done.set()


def held(clock: FakeClock) -> None:
    """Wait (real time, bounded) until the finisher waits on the clock: it holds ends."""
    deadline = time.monotonic() + 10
    while not clock._timers:
        assert time.monotonic() < deadline, "the finisher never held the ends back"
        time.sleep(0.001)


def holding(
    store: lease.LeaseStore, names: list[str], hold: list[bool] | None = None
) -> tuple[FakeClock, Ends, Finisher[str]]:
    """A finisher told rounds wait (while ``hold[0]``, default always), handed the end
    of ``names[0]``, once it holds it back."""
    clock = FakeClock(T0)
    ends = Ends(store, names)
    waiting = [True] if hold is None else hold
    finisher = ends.finisher(store, hold=lambda: waiting[0], clock=clock)
    ends.hand(finisher, names[0])
    held(clock)
    return clock, ends, finisher


class TestHold:
    def test_ends_are_written_at_once_when_no_round_waits(self, store):
        clock = FakeClock(T0)
        ends = Ends(store, ["a", "b"])
        finisher = ends.finisher(store, hold=lambda: False, clock=clock)
        ends.hand(finisher, "a")
        ends.hand(finisher, "b")
        assert ends.done.wait(10)  # fake time never moved
        assert ends.outcomes == {"a": True, "b": True}
        assert clock._timers == []
        finisher.close()

    def test_ends_wait_while_rounds_wait_and_go_when_poked(self, store):
        waiting = [True]
        _, ends, finisher = holding(store, ["a", "b", "c"], waiting)
        ends.hand(finisher, "b")
        ends.hand(finisher, "c")
        assert ends.outcomes == {}
        assert store.read(["a"])["a"].state is lease.LeaseState.RUNNING
        waiting[0] = False
        finisher.poke()  # the workers took the last queued round
        assert ends.done.wait(10)
        assert ends.outcomes == {"a": True, "b": True, "c": True}
        rows = store.read(["a", "b", "c"])
        assert {row.state for row in rows.values()} == {lease.LeaseState.DONE}
        finisher.close()

    def test_a_held_end_is_written_after_the_hold_limit_even_if_rounds_still_wait(self, store):
        clock, ends, finisher = holding(store, ["a"])
        clock.advance(HOLD_LIMIT / 2)
        assert ends.outcomes == {}
        clock.advance(HOLD_LIMIT / 2)
        assert ends.done.wait(10)
        assert ends.outcomes == {"a": True}
        finisher.close()

    def test_a_full_batch_is_not_held(self, store, monkeypatch):
        monkeypatch.setattr("cronjob.engine._finisher.BATCH_LIMIT", 2)
        _, ends, finisher = holding(store, ["a", "b"])
        ends.hand(finisher, "b")  # the second end fills the batch
        assert ends.done.wait(10)
        assert ends.outcomes == {"a": True, "b": True}
        finisher.close()

    def test_closing_writes_the_held_ends(self, store):
        _, ends, finisher = holding(store, ["a"])
        finisher.close()
        assert ends.done.wait(10)
        assert ends.outcomes == {"a": True}

    def test_a_hold_needs_a_clock(self, store):
        with pytest.raises(ValueError, match="needs a clock"):
            Ends(store, ["a"]).finisher(store, hold=lambda: True)


class TestHandIn:
    """Ends come in without a lock: none is lost, whatever the threads' order."""

    def test_ends_from_many_threads_are_all_written(self, store):
        names = [f"job-{i:03d}" for i in range(200)]
        ends = Ends(store, names)
        finisher = ends.finisher(store)
        threads = [
            threading.Thread(target=lambda part=part: [ends.hand(finisher, n) for n in part])
            for part in (names[i::8] for i in range(8))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert ends.done.wait(10)
        assert ends.outcomes == dict.fromkeys(names, True)
        finisher.close()

    def test_an_end_handed_in_as_the_finisher_closes_is_refused_not_dropped(self, store):
        """The close lands between the hand-in's look at ``closed`` and its append, and
        the thread ends first: the end is taken back and refused, so the caller knows
        it is not recorded (``done`` never reports it)."""
        ends = Ends(store, ["a"])
        finisher = ends.finisher(store)

        class ClosingDeque(collections.deque[object]):
            def append(self, item: object) -> None:
                finisher.close()
                finisher._thread.join(10)
                assert not finisher._thread.is_alive()
                super().append(item)

        finisher._pending = ClosingDeque()  # type: ignore[assignment]
        with pytest.raises(RuntimeError, match="closed"):
            ends.hand(finisher, "a")
        assert ends.outcomes == {}
        assert not finisher._pending


def test_the_pool_says_when_nothing_waits_for_a_thread_any_more():
    """``drained`` is called each time a thread takes the last queued item."""
    seen: list[bool] = []  # pool.queued as each call found it
    running, release = threading.Event(), threading.Event()

    def first() -> None:
        running.set()
        release.wait(10)

    pool = Workers(1, "pool", drained=lambda: seen.append(pool.queued))
    pool.submit(first)
    assert running.wait(10)
    assert seen == [False]  # the thread took the only queued item
    pool.submit(lambda: None)  # waits for the one thread
    assert pool.queued
    assert seen == [False]
    release.set()
    assert pool.shutdown(wait=10)
    assert seen == [False, False]
