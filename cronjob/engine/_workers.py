"""A pool of daemon threads for rounds and lease statements.

Not `concurrent.futures.ThreadPoolExecutor`: the interpreter joins its threads at
exit, so one job that ignores its cancellation would keep the process from ever exiting
after a drain. These threads are daemons: the process ends when it means to.

Two promises the executor does not make:

- **A worker never dies of its work.** Whatever a work item raises is logged and the
  thread takes the next one; otherwise a job whose failure cannot even be printed would
  take a thread with it, and once all were gone queued rounds would wait forever.
- **Work that cannot get a thread is never run later unaccounted.** When starting a
  thread fails (the OS limit: ``RuntimeError: can't start new thread``) and other
  threads are alive, the work stays queued for the first of them to free up, and the
  failure is logged; when no thread is alive to run it, the work is withdrawn and
  `NoWorkerThread` tells the caller, distinct from `WorkersClosed`.

Work accounting for a fake clock: a work item queued while every thread is busy is
*parked* (the ``park`` hook uncounts it), so a queued round behind a job waiting on the
clock does not keep fake time from moving; it is counted again (``unpark``) when a thread
is about to take it, before the thread's previous item stops being counted
(`Workers.hand_over`), so there is no moment when the pool looks idle. A thread
that has handed over is on its way back for more: until it is back, an item queued is
its to take, not parked (its item stops being counted before the thread reaches the
queue, and fake time must not move past an item a thread is about to run).

Without accounting (the system clock), a thread that finished an item takes the next
one without the pool's lock, and nothing is parked: with thousands of rounds of one
instant queued, dozens of threads otherwise queue on that lock one round after another,
and each that waits hands the interpreter to another (10,000 rounds on 64 threads: 49
against 26 µs of the workers' CPU per round). The lock is still taken to wait for work,
to start threads and to shut down.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

__all__ = ["NoWorkerThread", "Workers", "WorkersClosed"]

log = logging.getLogger("cronjob")


class WorkersClosed(RuntimeError):
    """Raised when work is submitted to a pool that has been shut down."""


class NoWorkerThread(Exception):
    """Raised when work cannot run because no thread could be started and none is alive.

    The work was withdrawn: it will never run. Not a `RuntimeError`, so it is
    never mistaken for a pool that was shut down.
    """


def _nothing() -> None:
    pass


class Workers:
    """Up to ``max_workers`` daemon threads, started on demand and reused.

    Args:
        max_workers: The most threads that run submitted work at once.
        name: Prefix of the threads' names.
        park: Called (under the pool's lock) when a submitted item is queued with no
            thread free to take it; its work accounting is suspended.
        unpark: Called (under the pool's lock) when a parked item is about to be taken.
        drained: Called (outside the pool's lock) by the thread that takes the last
            queued item: nothing waits for a thread any more (see `queued`).
    """

    def __init__(
        self,
        max_workers: int,
        name: str,
        *,
        park: Callable[[], None] = _nothing,
        unpark: Callable[[], None] = _nothing,
        drained: Callable[[], None] = _nothing,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self._max = max_workers
        self._name = name
        self._park = park
        self._unpark = unpark
        self._drained = drained
        #: Whether anyone counts work (a fake clock): without, `hand_over` has
        #: nothing to tell, so it skips the pool's lock (the thread's next look at the
        #: queue settles the count).
        self._accounting = park is not _nothing or unpark is not _nothing
        # A plain lock, not the default RLock: taken twice per round by every thread.
        self._cond = threading.Condition(threading.Lock())
        self._pending: collections.deque[Callable[[], None]] = collections.deque()
        self._threads: list[threading.Thread] = []
        #: Threads waiting for work.
        self._idle = 0
        #: Threads started that have not yet looked for work.
        self._starting = 0
        #: Queued items whose accounting is suspended (no thread was free for them).
        self._parked = 0
        #: Threads whose item has handed over (`hand_over`) and that have not yet
        #: come back to the queue: takers, as the idle ones (with accounting only).
        self._returning = 0
        self._local = threading.local()
        self._closed = False

    @property
    def max_workers(self) -> int:
        """The most threads that run submitted work at once."""
        return self._max

    @property
    def queued(self) -> bool:
        """Whether submitted work waits for a thread (read without the pool's lock)."""
        return bool(self._pending)

    def submit(self, work: Callable[[], None]) -> None:
        """Queue ``work`` to run on a worker thread.

        If no thread is free and the pool may grow, a thread is started. If that fails
        while other threads are alive, ``work`` waits for one of them (logged). If it
        fails and none is alive, ``work`` is withdrawn.

        Raises:
            WorkersClosed: the pool has been shut down.
            NoWorkerThread: no thread could be started and none is alive; ``work`` will
                not run.
        """
        with self._cond:
            self._queue(work)

    def submit_many(self, works: list[Callable[[], None]]) -> list[NoWorkerThread | None]:
        """`submit` each of ``works`` in order, taking the pool's lock once.

        Thousands of rounds of one instant are started together: one lock for all of them
        instead of one each, which the worker threads taking the first of them contend for.

        Returns:
            For each item, ``None`` (queued) or the `NoWorkerThread` that
            withdrew it.

        Raises:
            WorkersClosed: the pool has been shut down (none of ``works`` was queued).
        """
        outcomes: list[NoWorkerThread | None] = []
        with self._cond:
            if self._closed:
                raise WorkersClosed(f"{self._name}: the worker pool is shut down")
            for work in works:
                try:
                    self._queue(work)
                except NoWorkerThread as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
        return outcomes

    def _queue(self, work: Callable[[], None]) -> None:
        """`submit` with the pool's lock held."""
        if self._closed:
            raise WorkersClosed(f"{self._name}: the worker pool is shut down")
        self._pending.append(work)
        takers = self._idle + self._starting + self._returning
        if len(self._pending) - self._parked <= takers:
            self._cond.notify()
            return
        if len(self._threads) < self._max:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as exc:  # the OS refuses another thread
                self._threads = [t for t in self._threads if t.is_alive()]
                if not self._threads:
                    self._pending.remove(work)
                    raise NoWorkerThread(
                        f"{self._name}: no worker thread could be started ({exc}) "
                        "and none is running"
                    ) from exc
                log.error(
                    "%s: starting a worker thread failed (%s): the work waits for one of "
                    "the %d running",
                    self._name,
                    exc,
                    len(self._threads),
                )
            else:
                self._threads.append(thread)
                self._starting += 1
                return
        if self._accounting:  # a thread taking it settles the count (see _work)
            self._parked += 1
            self._park()

    def hand_over(self) -> None:
        """Count the item this worker thread takes next, before its current one ends.

        Called by a work item, on its worker thread, just before it stops counting
        itself: a parked item waiting for this thread is counted from now on, and until
        the thread is back at the queue an item queued meanwhile is its to take, not
        parked.
        """
        if not self._accounting:
            return
        local = self._local
        with self._cond:
            if self._pending and self._parked > len(self._pending) - 1:
                self._parked -= 1
                self._unpark()
            if getattr(local, "worker", False) and not getattr(local, "returning", False):
                local.returning = True  # a taker until _work looks at the queue again
                self._returning += 1

    def shutdown(self, *, wait: float | None = None) -> bool:
        """Refuse new work; let queued work finish; stop the threads once idle.

        Args:
            wait: Real seconds to wait for the threads to end; ``None`` does not wait.

        Returns:
            ``True`` if every thread ended within ``wait`` (always ``True`` when not
            waiting and nothing is running).
        """
        with self._cond:
            self._closed = True
            threads = list(self._threads)
            self._cond.notify_all()
        if wait is None:
            return not any(thread.is_alive() for thread in threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(wait)
        return not any(t.is_alive() for t in threads if t is not threading.current_thread())

    def _work(self) -> None:
        starting = True
        pending = self._pending
        local = self._local
        local.worker = True
        while True:
            if not self._accounting and not starting:
                # No accounting to keep: the next item without the pool's lock (a
                # deque's popleft is atomic). Dozens of threads taking thousands of
                # rounds one after another otherwise queue on that lock, and each one
                # that waits gives the interpreter to another.
                try:
                    work = pending.popleft()
                except IndexError:
                    pass
                else:
                    if not pending:
                        self._drained()
                    self._run(work)
                    continue
            with self._cond:
                if starting:
                    self._starting -= 1
                    starting = False
                if getattr(local, "returning", False):
                    local.returning = False
                    self._returning -= 1
                while not self._pending and not self._closed:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._pending:
                    return  # closed, and nothing left to do
                work = self._pending.popleft()
                if self._parked > len(self._pending):  # not counted by hand_over
                    self._parked -= 1
                    self._unpark()
                drained = not self._pending
            if drained:
                self._drained()
            self._run(work)

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:  # a worker never dies of its work: the next item waits
            log.exception("%s: a work item raised; the worker goes on", self._name)
