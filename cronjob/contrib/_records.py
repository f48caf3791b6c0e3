"""Recording hand-off occurrences by the group: one transaction, one lease check and one
multi-row insert for the records of every hand-off round waiting to write one (a group
commit, as `cronjob.contrib._marks` does for the marks).

The contract, for a round that calls `record`:

- It returns once its occurrences are on record (new, or found on record already: a
  second run of an instant finds what the first recorded, sent or not), with those rows,
  in its order, and, if it takes over from a round of its job that died holding the
  lease (``ctx._takes_over``), the rows that round recorded and still held
  (`lease.held_publications`, read before any record of the group is written).
- Or it raises what its own fenced transaction would have raised, and nothing of it is
  on record: `LeaseLost` when its lease is gone (or its round is over, or the replica
  crashed), `TimedOut` when its timeout cancelled it, or the database error that failed
  the group's transaction.
- The rounds of one scheduler (they share ``ctx._writes``) that call it while a group is
  being written wait; the first of them then writes the next group for all (its
  *leader*). No thread of its own; the groups of one scheduler are written one at a
  time. Under load the records of the rounds due at one instant share one transaction
  and one pooled connection instead of one each.
- The group's transaction (`cronjob.engine._fencing.Fencing.write_many`): one statement
  checks the leases of all its rounds, each as its own transaction's check would
  (its lease row still has its token and has not expired), and locks their rows until
  the commit, so no claim can take one in between; then the held rows of those that take
  over, one read each; then the records of every round whose lease holds, in one
  multi-row insert-if-new (`lease.record_publications`: one statement on PostgreSQL and
  SQLite, a read of the ids on record and an insert on MariaDB/MySQL); then one commit.
  A round whose lease is gone is left out of the writes and the others are unaffected.
  A database error fails every round of the group that held its lease, with that error.
- A round no scheduler made (``cronjob.testing.make_round``) or that runs in a child
  process has no ``ctx._writes``: it writes its own records alone, in its
  ``ctx.transaction()`` (checked as it opens and before it commits), with the same
  statements.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import lease

from .._occurrence import occurrence_id
from ..engine import OWED_LIMIT
from ._sender import Occurrence

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

    from .._round import GroupWrites, Round

__all__ = ["Recorded", "occurrence", "record"]


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a round's record found: the engine it was written on, each occurrence with
    its row and whether the record wrote it, and the rows a dead round held."""

    engine: Engine
    rows: list[tuple[Occurrence, lease.OutboxRow, bool]]
    dead: list[lease.OutboxRow]


def occurrence(
    ctx: Round,
    instant: datetime,
    headers: dict[str, str],
    *,
    target: str,
    describe: dict[str, object],
    now_ms: int,
    hold_ms: int,
) -> tuple[Occurrence, lease.Publication]:
    """The occurrence of ``ctx``'s job at ``instant`` and the publication that records
    it (its payload: the headers, the publisher's description, and the app, the args and
    the trigger where they are not the default)."""
    found = Occurrence(
        id=occurrence_id(ctx.name, instant, app=ctx.app),
        name=ctx.name,
        instant=instant,
        headers=headers,
        app=ctx.app,
        args="{}" if ctx._data is None else ctx._data[1],
        trigger=str(ctx.trigger) if instant == ctx.instant else "schedule",
    )
    publication = lease.Publication(
        id=found.id,
        name=found.name,
        instant=instant,
        target=target,
        payload={
            "headers": headers,
            "publisher": describe,
            **({"app": ctx.app} if ctx.app else {}),
            **({"args": found.args} if found.args != "{}" else {}),
            **({"trigger": found.trigger} if found.trigger != "schedule" else {}),
        },
        now_ms=now_ms,
        hold_ms=hold_ms,
        # A schedule's task: its publisher sends the row once the schedule is gone.
        task=ctx.task if ctx.task != ctx.name else None,
    )
    return found, publication


@dataclass(eq=False)
class _Request:
    """One round's record, waiting to be written."""

    ctx: Round
    occurrences: list[tuple[Occurrence, lease.Publication]]
    now_ms: int
    hold_ms: int
    done: threading.Event = field(default_factory=threading.Event)
    #: Set with ``done``: this waiter writes the next group.
    lead: bool = False
    error: BaseException | None = None
    recorded: Recorded | None = None


class _Group:
    """The records of one scheduler's rounds waiting to be written, and whether a group
    is underway."""

    def __init__(self, writes: GroupWrites) -> None:
        self._writes = writes
        self._lock = threading.Lock()
        self._pending: list[_Request] = []
        self._writing = False

    def record(self, mine: _Request) -> Recorded:
        with self._lock:
            self._pending.append(mine)
            lead = not self._writing
            self._writing = True
        if not lead:
            mine.done.wait()
        if lead or mine.lead:
            self._write()
        if mine.error is not None:
            raise mine.error
        assert mine.recorded is not None
        return mine.recorded

    def _write(self) -> None:
        """Write every record waiting, in one fenced transaction; then hand the writing
        to the first of those that came meanwhile, or end it."""
        with self._lock:
            batch, self._pending = self._pending, []
        fates: list[BaseException | None]
        try:
            fates = list(
                self._writes([item.ctx for item in batch], lambda c, h: _work(batch, c, h))
            )
        except BaseException as exc:  # not an Exception (those are fates): each raises it
            fates = [exc] * len(batch)
        with self._lock:
            following = self._pending[0] if self._pending else None
            if following is None:
                self._writing = False
            else:
                following.lead = True
        for item, fate in zip(batch, fates, strict=True):
            if fate is not None:
                item.error, item.recorded = fate, None
            item.done.set()
        if following is not None:
            following.done.set()


def _work(batch: list[_Request], conn: Connection, holding: list[bool]) -> None:
    """The group's writes, in its fenced transaction: the dead rounds' held rows, then
    every record of the rounds whose lease holds in one insert-if-new."""
    writing = [item for item, held in zip(batch, holding, strict=True) if held]
    dead = {
        id(item): (
            lease.held_publications(
                conn, item.ctx.name, now_ms=item.now_ms, hold_ms=item.hold_ms, limit=OWED_LIMIT
            )
            if item.ctx._takes_over
            else []
        )
        for item in writing
    }
    rows = lease.record_publications(
        conn, [publication for item in writing for _, publication in item.occurrences]
    )
    at = 0
    for item in writing:
        mine = rows[at : at + len(item.occurrences)]
        at += len(item.occurrences)
        item.recorded = Recorded(
            engine=conn.engine,
            rows=[(o, row, new) for (o, _), (row, new) in zip(item.occurrences, mine, strict=True)],
            dead=dead[id(item)],
        )


_lock = threading.Lock()
_by_writes: weakref.WeakKeyDictionary[GroupWrites, _Group] = weakref.WeakKeyDictionary()


def record(
    ctx: Round,
    occurrences: list[tuple[Occurrence, lease.Publication]],
    *,
    now_ms: int,
    hold_ms: int,
) -> Recorded:
    """Put ``ctx``'s ``occurrences`` on record, in a group with the records other rounds
    of its scheduler are writing (see the module's contract); ``now_ms`` and ``hold_ms``
    read the held rows of a dead round when the round takes over (``ctx._takes_over``).

    Raises:
        LeaseLost: the round's lease is gone (nothing of it recorded).
        TimedOut: the round's timeout cancelled it.
        Exception: what failed the group's transaction (a database error).
    """
    mine = _Request(ctx, occurrences, now_ms, hold_ms)
    writes = ctx._writes
    if writes is None:  # its own transaction: a round no scheduler made, or a child's
        with ctx.transaction() as conn:
            _work([mine], conn, [True])
        assert mine.recorded is not None
        return mine.recorded
    with _lock:
        group = _by_writes.get(writes)
        if group is None:
            group = _by_writes[writes] = _Group(writes)
    return group.record(mine)
