"""The ends of rounds, recorded in batches by one thread of their own.

A worker whose round ran to its end hands the end to `Finisher.finish_later` and
is free for the next round at once: what it hands in is the runner's own record of the
end, and the finisher thread builds the [lease.Ending][] to write from it (the
outcome, the error, the history row), so that work is not done while rounds wait for a
worker. It writes every end waiting with one [lease.LeaseStore.finish_many][]
transaction (one UPDATE per distinct ``ended`` second and outcome, usually one, and one
INSERT of their history rows), then tells the runner, once for the batch, which ends
were recorded. With one round ending at a time that is one or two statements per round;
when thousands of rounds of one instant end together, their ends share a few
statements, and the round workers never queue behind the database to record them.

While rounds still wait for a worker thread (the ``hold`` predicate: thousands of rounds
of one instant starting), the finisher holds the ends back, for at most
`HOLD_LIMIT` seconds on its clock or until `BATCH_LIMIT` wait: the workers
run the queued rounds without the finisher taking the interpreter from them for a
statement every dozen ends, and the instant's ends share a few large batches instead of
hundreds of small ones. A round that ends while no round waits is written at once.

A batch that fails (a deadlock with a renewal, say) is written again one end at a time,
so one bad batch does not leave rounds without their end on record.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import lease

from .._clock import Clock

__all__ = ["Finisher"]

log = logging.getLogger("cronjob")

#: The most ends written in one transaction.
BATCH_LIMIT = 5_000

#: The longest an end is held back while rounds wait for a worker thread (clock seconds).
HOLD_LIMIT = 0.1


#: What the finisher is handed: the runner's record of an end.
T = TypeVar("T")

#: What became of an end: ``True`` (recorded), ``False`` (another claim replaced the
#: token) or the `lease.LeaseError` raised.
Result = bool | BaseException


class Finisher(Generic[T]):
    """Records the ends of rounds on ``store`` from a daemon thread of its own.

    Args:
        store: The lease store.
        ending: Builds the end to write from an item handed in (on the thread).
        done: Called on the thread once per batch written, with each item and its
            `Result`, in the order they were handed in.
        name: The thread's name.
        after_batch: Called on the thread after each batch is written, before ``done``
            (the history's pruning, see `cronjob._history.Pruner`).
        hold: While it returns ``True`` (rounds wait for a worker thread), ends are held
            back, up to `HOLD_LIMIT` on ``clock``; `poke` when it turns
            ``False``. ``None`` writes every end at once (a clock that counts work in
            progress: a fake clock's ``advance`` must never wait on a hold).
        clock: The clock ``hold`` waits on; needed with ``hold``.
    """

    def __init__(
        self,
        store: lease.LeaseStore,
        *,
        ending: Callable[[T], lease.Ending],
        done: Callable[[list[tuple[T, Result]]], None],
        name: str = "cronjob-finisher",
        after_batch: Callable[[], None] | None = None,
        hold: Callable[[], bool] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if hold is not None and clock is None:
            raise ValueError("a finisher that holds ends back needs a clock")
        self._store = store
        self._ending = ending
        self._done = done
        self._hold = hold
        self._clock = clock
        #: Set when a held batch should go now: nothing waits for a thread any more, the
        #: batch is full, or the finisher closes.
        self._release = None if clock is None else clock.event()
        self._after_batch = after_batch
        self._name = name
        self._cond = threading.Condition()
        self._pending: collections.deque[T] = collections.deque()
        self._closed = False
        #: Whether the thread waits (or is about to) for an end to write.
        self._idle = False
        # Started now, not on the first end: a scheduler's threads are all there at start.
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def finish_later(self, item: T) -> None:
        """Record the end of a round soon (as [lease.LeaseStore.finish][], with the
        [lease.Ending][] that ``ending`` builds from ``item``): its outcome, and its
        history row if it carries one. ``done`` is told what became of it.

        Raises:
            RuntimeError: the finisher is closed; ``item`` will not be written.
        """
        # No lock on the way in (every round that ends passes here, thousands a second
        # at scale): a deque's append is atomic, and the thread is woken only when it
        # waits for work. It says so (``_idle``) before it looks at the queue, under the
        # condition's lock, so an end appended after its look finds it idle and wakes it.
        if self._closed:
            raise RuntimeError(f"{self._name}: the finisher is closed")
        self._pending.append(item)
        if self._closed:  # closed meanwhile: the thread may be gone without this end
            with self._cond:  # the thread takes ends under it: one of us has this one
                if any(pending is item for pending in self._pending):
                    self._pending.remove(item)
                    raise RuntimeError(f"{self._name}: the finisher is closed")
        if self._idle:
            with self._cond:
                self._cond.notify()
        if len(self._pending) >= BATCH_LIMIT:
            self.poke()

    def poke(self) -> None:
        """Write the ends held back now (``hold`` has turned ``False``)."""
        if self._release is not None:
            self._release.set()

    def close(self) -> None:
        """Refuse new ends; the thread ends once those waiting are written."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self.poke()

    def _held(self) -> None:
        """Wait, while ``hold`` says so, for more ends to join the batch (bounded)."""
        if self._hold is None or self._release is None or self._clock is None:
            return
        deadline = self._clock.monotonic() + HOLD_LIMIT
        while not self._closed and len(self._pending) < BATCH_LIMIT:
            self._release.clear()
            if not self._hold():  # after the clear: a poke from now on is seen
                return
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0 or not self._release.wait(remaining):
                return

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._idle = True  # before the look at the queue: see finish_later
                while not self._pending and not self._closed:
                    self._cond.wait()
                self._idle = False
                if not self._pending:
                    return
            self._held()
            with self._cond:
                count = min(len(self._pending), BATCH_LIMIT)
                batch = [self._pending.popleft() for _ in range(count)]
            outcomes = self._write(batch)
            if self._after_batch is not None:
                # Before ``done``: the rounds' ends still count as work in progress on a
                # fake clock, so a test's advance() waits for this too.
                self._after_batch()
            try:
                self._done(list(zip(batch, outcomes, strict=True)))
            except Exception:  # the thread goes on with the next batch
                log.exception("handing on the ends of a batch of rounds failed")

    def _write(self, batch: list[T]) -> list[Result]:
        endings = [self._build(item) for item in batch]
        built = [e for e in endings if isinstance(e, lease.Ending)]
        try:
            written = self._store.finish_many(built) if built else set()
        except lease.LeaseError as exc:
            if len(built) == 1:
                return [exc if isinstance(e, lease.Ending) else e for e in endings]
            # The batch failed: one at a time, each its own outcome.
            return [self._finish_one(e) if isinstance(e, lease.Ending) else e for e in endings]
        return [(e.name, e.token) in written if isinstance(e, lease.Ending) else e for e in endings]

    def _build(self, item: T) -> lease.Ending | Exception:
        try:
            return self._ending(item)
        except Exception as exc:  # an end that cannot be built fails alone
            log.exception("building the record of a round's end failed")
            return exc

    def _finish_one(self, e: lease.Ending) -> Result:
        try:
            return bool(self._store.finish_many([e]))
        except lease.LeaseError as exc:
            return exc
