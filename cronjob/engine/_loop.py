"""The asyncio loop async rounds run on: the application's, or one of our own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading

__all__ = ["OwnLoop", "TASK_SETTLE_SECONDS"]

#: Real seconds a stopping scheduler gives its async rounds to finish their bookkeeping.
TASK_SETTLE_SECONDS = 2.0


class OwnLoop:
    """An event loop of the scheduler's own, run by a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(started.set)
            self.loop.run_forever()

        self._thread = threading.Thread(target=serve, name="cronjob-asyncio", daemon=True)
        self._thread.start()
        started.wait()

    def settle(self) -> None:
        """Let the rounds that already ended finish their bookkeeping (a little, in real
        time); a round that ignored its cancellation is not waited for."""
        finishing = asyncio.run_coroutine_threadsafe(_settle_tasks(), self.loop)
        with contextlib.suppress(concurrent.futures.TimeoutError):
            finishing.result(timeout=TASK_SETTLE_SECONDS)

    def stop(self) -> None:
        """Stop the loop and wait (a little) for its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=TASK_SETTLE_SECONDS)


async def _settle_tasks() -> None:
    """Wait (a little, in real time) for the loop's other tasks to finish."""
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    if others:
        await asyncio.wait(others, timeout=TASK_SETTLE_SECONDS)
