"""The worker pool: threads that never die of their work, and work never run unaccounted."""

from __future__ import annotations

import threading

import pytest

from cronjob.engine._workers import NoWorkerThread, Workers, WorkersClosed
from tests._helpers import refuse_thread_starts


@pytest.fixture
def refuse_threads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """While ``[0]`` is true, starting a ``pool-*`` thread fails as the OS limit does."""
    return refuse_thread_starts(monkeypatch, "pool")


class TestWorkers:
    def test_work_that_no_thread_can_run_is_withdrawn_and_the_caller_told(self, refuse_threads):
        pool = Workers(2, "pool")
        ran: list[str] = []
        refuse_threads[0] = True
        with pytest.raises(NoWorkerThread, match=r"^pool: no worker thread could be started"):
            pool.submit(lambda: ran.append("late"))
        refuse_threads[0] = False
        done = threading.Event()
        pool.submit(done.set)
        assert done.wait(10)
        assert pool.shutdown(wait=10)
        assert ran == []  # the withdrawn work never ran

    def test_work_without_a_new_thread_waits_for_a_running_one(self, refuse_threads, caplog):
        pool = Workers(2, "pool")
        release, done = threading.Event(), threading.Event()
        pool.submit(lambda: release.wait(10))
        refuse_threads[0] = True
        pool.submit(done.set)  # no second thread: it waits for the first
        assert "can't start new thread" in caplog.text
        assert not done.is_set()
        release.set()
        assert done.wait(10)
        assert pool.shutdown(wait=10)

    def test_a_worker_survives_its_work_raising(self):
        pool = Workers(1, "pool")
        done = threading.Event()

        def bad() -> None:
            raise RuntimeError("boom")

        pool.submit(bad)
        pool.submit(done.set)
        assert done.wait(10)
        assert pool.shutdown(wait=10)

    def test_submit_after_shutdown_raises_workers_closed(self):
        pool = Workers(1, "pool")
        pool.shutdown()
        with pytest.raises(WorkersClosed, match=r"^pool: the worker pool is shut down$"):
            pool.submit(lambda: None)
        assert not issubclass(NoWorkerThread, RuntimeError)


class TestTakingWithoutTheLock:
    """Without work accounting (the system clock), a thread that finished an item takes
    the next without the pool's lock: every item still runs exactly once."""

    def test_thousands_of_items_from_two_submitters_each_run_once(self):
        drained: list[bool] = []
        pool = Workers(8, "pool", drained=lambda: drained.append(True))
        ran: list[int] = []
        lock = threading.Lock()

        def item(i: int) -> None:
            with lock:
                ran.append(i)

        def submit(part: range) -> None:
            for first in range(part.start, part.stop, 128):
                pool.submit_many(
                    [lambda i=i: item(i) for i in range(first, min(first + 128, part.stop))]
                )

        submitters = [
            threading.Thread(target=submit, args=(range(0, 10_000),)),
            threading.Thread(target=submit, args=(range(10_000, 20_000),)),
        ]
        for submitter in submitters:
            submitter.start()
        for submitter in submitters:
            submitter.join()
        assert pool.shutdown(wait=10)
        assert sorted(ran) == list(range(20_000))
        assert drained  # told when the queue emptied

    def test_items_taken_by_a_busy_thread_that_raise_do_not_stop_it(self, caplog):
        pool = Workers(1, "pool")
        release, done = threading.Event(), threading.Event()
        ran: list[int] = []

        def bad() -> None:
            raise RuntimeError("boom")

        pool.submit(lambda: release.wait(10))  # the one thread is busy: the rest queue
        pool.submit_many([bad, lambda: ran.append(1), bad, lambda: ran.append(2), done.set])
        release.set()
        assert done.wait(10)
        assert ran == [1, 2]
        assert caplog.text.count("a work item raised; the worker goes on") == 2
        assert pool.shutdown(wait=10)

    def test_a_shutdown_lets_the_queued_items_run_then_stops_the_threads(self):
        pool = Workers(2, "pool")
        release = threading.Event()
        ran: list[int] = []
        pool.submit_many([lambda: release.wait(10)] * 2)
        pool.submit_many([lambda i=i: ran.append(i) for i in range(100)])
        assert not pool.shutdown()  # refuses new work; the threads are still busy
        release.set()
        assert pool.shutdown(wait=10)
        assert sorted(ran) == list(range(100))


class TestParking:
    """With work accounting (a fake clock): an item queued while every thread is busy is
    parked (its accounting suspended) until a thread takes it, unless a thread has handed
    over and is on its way back for it."""

    @staticmethod
    def _pool(calls: list[str]) -> Workers:
        return Workers(
            1, "pool", park=lambda: calls.append("park"), unpark=lambda: calls.append("unpark")
        )

    def test_an_item_queued_behind_a_busy_thread_is_parked_until_taken(self):
        calls: list[str] = []
        pool = self._pool(calls)
        release, ran = threading.Event(), threading.Event()
        pool.submit(lambda: release.wait(10))  # busy, and not handing over
        pool.submit(ran.set)
        assert calls == ["park"]
        release.set()
        assert ran.wait(10)
        assert calls == ["park", "unpark"]
        assert pool.shutdown(wait=10)

    def test_an_item_queued_after_the_running_one_handed_over_is_not_parked(self):
        # The running item has handed over: its thread's next look at the queue takes
        # the new item. Parked, the item would not count while the thread finishes the
        # rest of its item, and a fake clock could move past it (a round started late).
        calls: list[str] = []
        pool = self._pool(calls)
        handed, release, ran = threading.Event(), threading.Event(), threading.Event()

        def first() -> None:
            pool.hand_over()
            handed.set()
            release.wait(10)  # the rest of the item, after it stopped being counted

        pool.submit(first)
        assert handed.wait(10)
        pool.submit(ran.set)
        release.set()
        assert ran.wait(10)
        assert calls == []
        assert pool.shutdown(wait=10)
