"""Marking sent occurrences by the batch: one transaction and one ``UPDATE`` for the
marks of every round that is waiting to write one (a group commit).

A round whose send the broker accepted calls `mark` and returns once its row is marked
(or raises what the write raised), as it did when each round wrote its own mark in a
transaction of its own. The marks of the rounds that finish sending while one batch is
written wait for the next, which one of them then writes for all (its *leader*): under
load a round's mark shares a transaction and a pooled connection with those of a few
milliseconds around it, instead of one each. No thread of its own: the writing is done
by a waiting round. The batches of one engine are written one at a time.

Each row gets the time its own send was accepted (``sent_ms``), never a later one, and
only after the acceptance: the guarantee of the mark is unchanged. A process that dies
before the batch is written leaves those rows unsent, as a death between a send and its
mark always did: the sweep sends them again with the same id.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

from sqlalchemy import Engine

import lease

__all__ = ["mark"]


@dataclass(eq=False)
class _Mark:
    id: str
    sent_ms: int
    done: threading.Event = field(default_factory=threading.Event)
    #: Set with ``done``: this waiter writes the next batch.
    lead: bool = False
    error: BaseException | None = None


class _Marks:
    """The marks of one engine waiting to be written, and whether a batch is underway."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._pending: list[_Mark] = []
        self._writing = False

    def mark(self, id: str, sent_ms: int) -> None:
        mine = _Mark(id, sent_ms)
        with self._lock:
            self._pending.append(mine)
            lead = not self._writing
            self._writing = True
        if not lead:
            mine.done.wait()
            if not mine.lead:
                if mine.error is not None:
                    raise mine.error
                return
        self._write()
        if mine.error is not None:
            raise mine.error

    def _write(self) -> None:
        """Write every mark waiting, in one transaction; then hand the writing to the
        first of those that came meanwhile, or end it."""
        with self._lock:
            batch, self._pending = self._pending, []
        error: BaseException | None = None
        try:
            marks: dict[str, int] = {}
            for item in batch:  # the same id twice (a late answer): its earliest time
                marks[item.id] = min(item.sent_ms, marks.get(item.id, item.sent_ms))
            with self._engine.begin() as conn:
                lease.mark_published_many(conn, marks)
        except BaseException as exc:  # each waiter raises it, as its own write would have
            error = exc
        with self._lock:
            following = self._pending[0] if self._pending else None
            if following is None:
                self._writing = False
            else:
                following.lead = True
        for item in batch:
            item.error = error
            item.done.set()
        if following is not None:
            following.done.set()


_lock = threading.Lock()
_by_engine: weakref.WeakKeyDictionary[Engine, _Marks] = weakref.WeakKeyDictionary()


def mark(engine: Engine, id: str, sent_ms: int) -> None:
    """Mark the occurrence ``id`` sent at ``sent_ms`` (epoch ms: when the broker accepted
    it), in a batch with the marks other threads are writing on ``engine``; return once
    it is written.

    Raises:
        Exception: what writing the batch raised (a database error): the row stays
            unsent, and the sweep sends it again with the same id.
    """
    with _lock:
        marks = _by_engine.get(engine)
        if marks is None:
            marks = _by_engine[engine] = _Marks(engine)
    marks.mark(id, sent_ms)
