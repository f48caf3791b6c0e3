"""A pool of daemon threads for rounds and lease statements.

Not :class:`concurrent.futures.ThreadPoolExecutor`: the interpreter joins its threads at
exit, so one job that ignores its cancellation would keep the process from ever exiting
after a drain. These threads are daemons: the process ends when it means to.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["Workers"]


class Workers:
    """Up to ``max_workers`` daemon threads, started on demand and reused.

    Args:
        max_workers: The most threads that run submitted work at once.
        name: Prefix of the threads' names.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self._max = max_workers
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._waiting = 0
        self._closed = False

    def submit(self, work: Callable[[], None]) -> None:
        """Queue ``work`` to run on a worker thread.

        Raises:
            RuntimeError: the pool has been shut down.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: the worker pool is shut down")
            self._queue.put(work)
            self._waiting += 1
            if self._waiting > self._idle and len(self._threads) < self._max:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def shutdown(self, *, wait: float | None = None) -> bool:
        """Refuse new work; let queued work finish; stop the threads once idle.

        Args:
            wait: Real seconds to wait for the threads to end; ``None`` does not wait.

        Returns:
            ``True`` if every thread ended within ``wait`` (always ``True`` when not
            waiting and nothing is running).
        """
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        if wait is None:
            return not any(thread.is_alive() for thread in threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(wait)
        return not any(t.is_alive() for t in threads if t is not threading.current_thread())

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            work = self._queue.get()
            with self._lock:
                self._idle -= 1
            if work is None:
                return
            with self._lock:
                self._waiting -= 1
            work()
