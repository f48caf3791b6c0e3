"""Group commit of the ends of rounds: many rounds ending together, one statement.

A worker thread whose round ran to its end calls :meth:`Finisher.finish` and gets back,
as before, whether its end was recorded. If no batch is being written, that worker
writes every end waiting (its own among them) with :meth:`lease.LeaseStore.finish_many`;
otherwise it waits for the batch in flight and then for its own. With one round ending
at a time this is one statement per round, as before; when thousands of rounds of one
instant end together, their ends share a few statements instead of one each.

A batch that fails (a deadlock with a renewal, say) is written again one end at a time,
so one bad batch does not leave rounds without their end on record.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime

import lease

__all__ = ["Finisher"]


@dataclass(eq=False)
class _End:
    name: str
    token: int
    ended: datetime
    done: bool = False
    recorded: bool = False
    error: BaseException | None = None


class Finisher:
    """Records the ends of rounds in batches on ``store``."""

    def __init__(self, store: lease.LeaseStore) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._pending: list[_End] = []
        self._writing = False

    def finish(self, name: str, token: int, ended: datetime) -> bool:
        """Like :meth:`lease.LeaseStore.finish`; may write other rounds' ends too."""
        end = _End(name, token, ended)
        with self._cond:
            self._pending.append(end)
            while self._writing and not end.done:
                self._cond.wait()
            if not end.done:
                batch, self._pending = self._pending, []
                self._writing = True
        if not end.done:
            self._write(batch)
        if end.error is not None:
            raise end.error
        return end.recorded

    def _write(self, batch: list[_End]) -> None:
        try:
            try:
                if len(batch) == 1:
                    (one,) = batch
                    one.recorded = self._store.finish(one.name, one.token, ended=one.ended)
                else:
                    written = self._store.finish_many([(e.name, e.token, e.ended) for e in batch])
                    for end in batch:
                        end.recorded = (end.name, end.token) in written
            except lease.LeaseError as exc:
                if len(batch) == 1:
                    batch[0].error = exc
                else:
                    for end in batch:  # one at a time: each its own outcome
                        try:
                            end.recorded = self._store.finish(end.name, end.token, ended=end.ended)
                        except lease.LeaseError as single:
                            end.error = single
        finally:
            with self._cond:
                for end in batch:
                    end.done = True
                self._writing = False
                self._cond.notify_all()
