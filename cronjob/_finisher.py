"""The ends of rounds, recorded in batches by one thread of their own.

A worker whose round ran to its end hands the end to :meth:`Finisher.finish_later` and
is free for the next round at once; the finisher thread writes every end waiting with
one :meth:`lease.LeaseStore.finish_many` transaction (one UPDATE per distinct ``ended``
second, usually one), then calls each end's callback with whether it was recorded. With
one round ending at a time that is one statement per round, as before; when thousands of
rounds of one instant end together, their ends share a few statements, and the round
workers never queue behind the database to record them.

A batch that fails (a deadlock with a renewal, say) is written again one end at a time,
so one bad batch does not leave rounds without their end on record.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import lease

__all__ = ["Finisher"]

log = logging.getLogger("cronjob")

#: The most ends written in one transaction.
BATCH_LIMIT = 5_000


@dataclass(eq=False)
class _End:
    name: str
    token: int
    ended: datetime
    then: Callable[[bool | BaseException], None]


class Finisher:
    """Records the ends of rounds on ``store`` from a daemon thread of its own.

    Args:
        store: The lease store.
        name: The thread's name.
    """

    def __init__(self, store: lease.LeaseStore, name: str = "cronjob-finisher") -> None:
        self._store = store
        self._name = name
        self._cond = threading.Condition()
        self._pending: collections.deque[_End] = collections.deque()
        self._closed = False
        # Started now, not on the first end: a scheduler's threads are all there at start.
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def finish_later(
        self, name: str, token: int, ended: datetime, then: Callable[[bool | BaseException], None]
    ) -> None:
        """Record the end of ``name``'s round (as :meth:`lease.LeaseStore.finish`) soon.

        ``then`` is called on the finisher thread with ``True`` (recorded), ``False``
        (another claim replaced the token) or the :class:`lease.LeaseError` raised.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self._name}: the finisher is closed")
            self._pending.append(_End(name, token, ended, then))
            self._cond.notify()

    def close(self) -> None:
        """Refuse new ends; the thread ends once those waiting are written."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                count = min(len(self._pending), BATCH_LIMIT)
                batch = [self._pending.popleft() for _ in range(count)]
            for end, outcome in zip(batch, self._write(batch), strict=True):
                try:
                    end.then(outcome)
                except Exception:  # a callback's failure must not stop the others
                    log.exception("recording the end of job %r's round: callback failed", end.name)

    def _write(self, batch: list[_End]) -> list[bool | BaseException]:
        try:
            if len(batch) == 1:
                (one,) = batch
                return [self._store.finish(one.name, one.token, ended=one.ended)]
            written = self._store.finish_many([(e.name, e.token, e.ended) for e in batch])
            return [(end.name, end.token) in written for end in batch]
        except lease.LeaseError as exc:
            if len(batch) == 1:
                return [exc]
        outcomes: list[bool | BaseException] = []
        for end in batch:  # the batch failed: one at a time, each its own outcome
            try:
                outcomes.append(self._store.finish(end.name, end.token, ended=end.ended))
            except lease.LeaseError as single:
                outcomes.append(single)
        return outcomes
