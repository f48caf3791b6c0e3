"""The ends of rounds, recorded in batches by one thread of their own.

A worker whose round ran to its end hands the end to :meth:`Finisher.finish_later` and
is free for the next round at once; the finisher thread writes every end waiting with
one :meth:`lease.LeaseStore.finish_many` transaction (one UPDATE per distinct ``ended``
second and outcome, usually one, and one INSERT of their history rows), then calls each
end's callback with whether it was recorded. With one round ending at a time that is one
or two statements per round; when thousands of
rounds of one instant end together, their ends share a few statements, and the round
workers never queue behind the database to record them.

While rounds still wait for a worker thread (the ``hold`` predicate: thousands of rounds
of one instant starting), the finisher holds the ends back, for at most
:data:`HOLD_LIMIT` seconds on its clock or until :data:`BATCH_LIMIT` wait: the workers
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
from dataclasses import dataclass

import lease

from ._clock import Clock

__all__ = ["Finisher"]

log = logging.getLogger("cronjob")

#: The most ends written in one transaction.
BATCH_LIMIT = 5_000

#: The longest an end is held back while rounds wait for a worker thread (clock seconds).
HOLD_LIMIT = 0.1


@dataclass(eq=False)
class _End:
    ending: lease.Ending
    then: Callable[[bool | BaseException], None]


class Finisher:
    """Records the ends of rounds on ``store`` from a daemon thread of its own.

    Args:
        store: The lease store.
        name: The thread's name.
        after_batch: Called on the thread after each batch is written, before its callbacks (the
            history's pruning, see :class:`cronjob._history.Pruner`).
        after_callbacks: Called on the thread once every callback of a batch ran (to hand
            their results on together).
        hold: While it returns ``True`` (rounds wait for a worker thread), ends are held
            back, up to :data:`HOLD_LIMIT` on ``clock``; :meth:`poke` when it turns
            ``False``. ``None`` writes every end at once (a clock that counts work in
            progress: a fake clock's ``advance`` must never wait on a hold).
        clock: The clock ``hold`` waits on; needed with ``hold``.
    """

    def __init__(
        self,
        store: lease.LeaseStore,
        name: str = "cronjob-finisher",
        *,
        after_batch: Callable[[], None] | None = None,
        after_callbacks: Callable[[], None] | None = None,
        hold: Callable[[], bool] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if hold is not None and clock is None:
            raise ValueError("a finisher that holds ends back needs a clock")
        self._store = store
        self._hold = hold
        self._clock = clock
        #: Set when a held batch should go now: nothing waits for a thread any more, the
        #: batch is full, or the finisher closes.
        self._release = None if clock is None else clock.event()
        self._after_batch = after_batch
        self._after_callbacks = after_callbacks
        self._name = name
        self._cond = threading.Condition()
        self._pending: collections.deque[_End] = collections.deque()
        self._closed = False
        #: Whether the thread waits (or is about to) for an end to write.
        self._idle = False
        # Started now, not on the first end: a scheduler's threads are all there at start.
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def finish_later(
        self, ending: lease.Ending, then: Callable[[bool | BaseException], None]
    ) -> None:
        """Record the end of a round (as :meth:`lease.LeaseStore.finish`) soon: its
        outcome, and its history row if it carries one.

        ``then`` is called on the finisher thread with ``True`` (recorded), ``False``
        (another claim replaced the token) or the :class:`lease.LeaseError` raised.
        """
        # No lock on the way in (every round that ends passes here, thousands a second
        # at scale): a deque's append is atomic, and the thread is woken only when it
        # waits for work. It says so (``_idle``) before it looks at the queue, under the
        # condition's lock, so an end appended after its look finds it idle and wakes it.
        if self._closed:
            raise RuntimeError(f"{self._name}: the finisher is closed")
        end = _End(ending, then)
        self._pending.append(end)
        if self._closed:  # closed meanwhile: the thread may be gone without this end
            with self._cond:  # the thread takes ends under it: one of us has this one
                if end in self._pending:
                    self._pending.remove(end)
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
                # Before the callbacks: the rounds' ends still count as work in progress
                # on a fake clock, so a test's advance() waits for this too.
                self._after_batch()
            for end, outcome in zip(batch, outcomes, strict=True):
                try:
                    end.then(outcome)
                except Exception:  # a callback's failure must not stop the others
                    log.exception(
                        "recording the end of job %r's round: callback failed", end.ending.name
                    )
            if self._after_callbacks is not None:
                try:
                    self._after_callbacks()
                except Exception:
                    log.exception("handing on the ends of a batch of rounds failed")

    def _write(self, batch: list[_End]) -> list[bool | BaseException]:
        try:
            if len(batch) == 1:
                return [self._finish(batch[0].ending)]
            written = self._store.finish_many([end.ending for end in batch])
            return [(end.ending.name, end.ending.token) in written for end in batch]
        except lease.LeaseError as exc:
            if len(batch) == 1:
                return [exc]
        outcomes: list[bool | BaseException] = []
        for end in batch:  # the batch failed: one at a time, each its own outcome
            try:
                outcomes.append(self._finish(end.ending))
            except lease.LeaseError as single:
                outcomes.append(single)
        return outcomes

    def _finish(self, e: lease.Ending) -> bool:
        return self._store.finish(
            e.name, e.token, ended=e.ended, succeeded=e.succeeded, error=e.error, record=e.record
        )
