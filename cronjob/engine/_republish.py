"""The outbox's sweep: sends again the occurrences a round recorded and could not send.

A job that hands its instants to a task queue (``cronjob.contrib.handoff``) records each
occurrence in the outbox before it sends it. A round that ended first (the broker down
past its retries, a drain, a lease lost, a replica killed between the send and the mark)
leaves the row unsent. On the sweep's cadence (every `SWEEP_EVERY` seconds, with the
sweep for rounds cut short) each replica reads the due unsent rows of the names it can
send (its jobs that hand their instants on), all in one statement, and hands each to
the job function of that name in its registry (the function carries its publisher:
``Handoff.resend``), which claims the row by a conditional update of its next try time
before it sends: one replica at a time sends a given row, and every replica may.

The statements and the sends run on one thread of this part's own (``cronjob-outbox``),
not on the control thread: a broker that hangs until its client's timeout must never hold
a claim of the next instant back. Only a replica with such a job starts it. The rows are
read there, handed to the job functions on the dispatcher thread (which owns the job
states), and sent back there. Each send waits for the broker at most its
``send_timeout``, so a broker that never answers holds this thread for that long, not
forever. A send that fails defers the other due rows of its publisher by `DEFER_REFUSED`
(one statement, no try counted): a broker that is down costs one timeout per sweep, not
one per row, and its rows never fill the sweep's `REPUBLISH_LIMIT` ahead of the rows of
a broker that is up.

A schedule made of data records its task with each occurrence. Once the schedule is
removed no replica has a job of its name, and the row is paired with the task's function
instead (any replica that registers the task sends it: the publisher comes from the task).
A row due for `ORPHAN_AFTER` seconds whose name is no schedule on record and whose task
(or, recorded without one, whose job) no live replica registers is resolved obsolete on
record: never sent, and not counted unsent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import lease

from .._clock import Clock
from ._control import Control
from ._sweep import SWEEP_EVERY
from ._wings import Wing

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .._registry import Task
    from ._state import JobState

__all__ = [
    "DEFER_REFUSED",
    "LIVE_WITHIN",
    "ORPHAN_AFTER",
    "REPUBLISH_LIMIT",
    "Republisher",
    "Resender",
]

log = logging.getLogger("cronjob")

#: The most unsent rows one sweep reads (the longest due first); more wait for the next.
REPUBLISH_LIMIT: Final = 500
#: Seconds the due rows of a publisher that refused a send are put off, untried: the
#: longest back-off of a send (``cronjob.contrib.RETRY_LONGEST``), so the next sweeps
#: read the rows behind them.
DEFER_REFUSED: Final = 60.0
#: Seconds a row must have been due, nobody sending it, before it may be resolved
#: obsolete: a replica that can send it would have within a few sweeps.
ORPHAN_AFTER: Final = 60.0
#: A replica seen within these seconds is live (as ``cronjob status`` counts them).
LIVE_WITHIN: Final = 60.0


@runtime_checkable
class Resender(Protocol):
    """A job function that can send an outbox row again (``cronjob.contrib.Handoff``)."""

    publisher: Any

    def resend(self, engine: Engine, row: lease.OutboxRow, *, now: datetime) -> bool | None:
        """Send ``row`` again: ``True`` sent, ``False`` refused, ``None`` not claimed."""
        ...

    def keep_held(self, engine: Engine, *, now: datetime) -> None:
        """Keep held the rows whose send this replica gave up on and may still be
        accepted, so that no other replica sends them meanwhile."""
        ...


def is_resender(fn: object) -> bool:
    """Whether ``fn`` hands its instants on (has an outbox to sweep)."""
    return isinstance(fn, Resender)


class Republisher(Wing):
    """Sweeps the outbox of the jobs in ``states`` that hand their instants on (a wing,
    see ``_wings``).

    Args:
        clock: The scheduler's clock.
        store: The lease store (its engine runs the statements).
        control: The scheduler's control thread; this part gets a sibling of its own.
        states: The dispatcher's job states by name (read on the dispatcher thread only).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        states: Mapping[str, JobState],
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._states = states
        self._thread: Control | None = None
        #: The functions of the tasks that hand their instants on, by task name: they
        #: send the rows of their removed schedules.
        self._tasks: dict[str, Resender] = {}
        self._sweep_at: float | None = None
        self._sweeping = False
        #: The database is ready and start-up's catch-up sent (as for the sweep): until
        #: then no sweep is due, or the dispatcher would wake for it without end.
        self._begun = False
        self.notice(states.values())

    def begin(self) -> None:
        """The database is ready (and start-up's catch-up sent): sweep now, if any job
        hands its instants on."""
        self._begun = True
        if self._thread is not None:
            self._sweep_at = self._clock.monotonic()

    def notice(self, states: Iterable[JobState]) -> None:
        """Jobs came (schedules made of data): start sweeping if one hands its instants on."""
        if self._thread is None and any(is_resender(s.job.fn) for s in states):
            self._thread = self._control.sibling("cronjob-outbox")
            if self._begun:
                self._sweep_at = self._clock.monotonic()

    def follow_tasks(self, tasks: Mapping[str, Task]) -> None:
        """This replica registers ``tasks``: the rows of their schedules, removed ones
        included, are its to send when the task hands its instants on."""
        self._tasks = {}
        for name, task in tasks.items():
            if isinstance(task.fn, Resender):
                self._tasks[name] = task.fn
        if self._thread is None and self._tasks:
            self._thread = self._control.sibling("cronjob-outbox")
            if self._begun:
                self._sweep_at = self._clock.monotonic()

    def names_changed(self, added: list[JobState], dropped: list[str]) -> None:
        """Leased jobs came or went: see `notice`."""
        self.notice(added)

    def next_wake(self, *, draining: bool) -> float | None:
        """When the next sweep of the outbox is due (monotonic), or ``None``."""
        if self._sweep_at is None or self._sweeping or draining:
            return None
        return self._sweep_at

    def sweep(self, now: float) -> None:
        """Read the due unsent rows if it is time, and send each again."""
        thread, sweep_at = self._thread, self._sweep_at
        if thread is None or self._sweeping or sweep_at is None or now < sweep_at:
            return
        self._sweeping = True
        store, clock = self._store, self._clock
        # Read here, on the dispatcher thread that owns the states.
        fns: dict[str, Resender] = {}
        for name, state in self._states.items():
            if isinstance(state.job.fn, Resender):
                fns[name] = state.job.fn

        tasks = dict(self._tasks)

        def read() -> list[lease.OutboxRow]:
            for fn in {id(fn): fn for fn in [*fns.values(), *tasks.values()]}.values():
                fn.keep_held(store.engine, now=clock.now())
            now_ms = round(clock.now().timestamp() * 1000)
            _resolve_orphans(store, now_ms, fns, tasks)
            with store.engine.connect() as conn:
                return lease.due_publications(
                    conn, now_ms=now_ms, limit=REPUBLISH_LIMIT, names=list(fns), tasks=list(tasks)
                )

        thread.run(read, self._send)

    def _send(self, rows: list[lease.OutboxRow] | BaseException) -> None:
        """On the dispatcher thread: pair each row with its job's function, send them."""
        if isinstance(rows, BaseException):
            log.warning("reading the outbox failed: %s", rows)
            self._done(None)
            return
        pairs: list[tuple[lease.OutboxRow, Resender]] = []
        for row in rows:
            state = self._states.get(row.name)
            fn: object = None if state is None else state.job.fn
            if not isinstance(fn, Resender) and row.task is not None:
                fn = self._tasks.get(row.task)  # a removed schedule's: its task sends it
            if isinstance(fn, Resender):  # else a replica that registers it sends it
                pairs.append((row, fn))
        if not pairs:
            self._done(None)
            return
        engine, clock = self._store.engine, self._clock
        assert self._thread is not None
        self._thread.run(lambda: _resend_all(engine, clock, pairs), self._done)

    def _done(self, result: object) -> None:
        if isinstance(result, BaseException):
            log.warning("sending the outbox again failed: %s", result)
        self._sweeping = False
        self._sweep_at = self._clock.monotonic() + SWEEP_EVERY

    def close(self) -> None:
        """Stop the thread: a send in flight ends with the process (its row is retried)."""
        if self._thread is not None:
            self._thread.shutdown(wait=0)


def _resend_all(engine: Engine, clock: Clock, pairs: list[tuple[lease.OutboxRow, Resender]]) -> int:
    """Send each row again; after a failure, defer the rest of that publisher's rows."""
    failed: dict[int, list[str]] = {}  # publisher -> the ids it was not asked to send
    sent = 0
    try:
        for row, fn in pairs:
            skipped = failed.get(id(fn.publisher))
            if skipped is not None:
                skipped.append(row.id)
                continue
            done = fn.resend(engine, row, now=clock.now())
            if done:
                sent += 1
            elif done is not None:  # refused: the broker is down, try its other rows later
                failed[id(fn.publisher)] = []
        skipped_ids = [id_ for ids in failed.values() for id_ in ids]
        if skipped_ids:
            now_ms = round(clock.now().timestamp() * 1000)
            later = now_ms + round(DEFER_REFUSED * 1000)
            with engine.begin() as conn:
                lease.defer_publications(conn, skipped_ids, now_ms=now_ms, next_try_ms=later)
    except lease.LeaseError as exc:
        log.warning("outbox: %s", exc)
    return sent


def _resolve_orphans(
    store: lease.LeaseStore, now_ms: int, names: Mapping[str, object], tasks: Mapping[str, object]
) -> int:
    """Resolve obsolete the rows due for `ORPHAN_AFTER` whose name is no schedule on
    record and whose task (or job, for a row recorded without a task) neither this
    replica nor any live one registers; returns how many. The replicas' records are read
    only when such a row is found."""
    engine = store.engine
    with engine.connect() as conn:
        found = lease.orphaned_publications(
            conn, now_ms=now_ms - round(ORPHAN_AFTER * 1000), limit=REPUBLISH_LIMIT
        )
    orphans = [
        row for row in found if row.name not in names and (row.task or row.name) not in tasks
    ]
    if not orphans:
        return 0
    live_jobs: set[str] = set()
    live_tasks: set[str] = set()
    for replica in store.replicas(seen_since_ms=now_ms - round(LIVE_WITHIN * 1000)):
        live_jobs.update(name for name, (_spec, leased) in replica.jobs.items() if leased)
        live_tasks.update(replica.tasks)
    resolved = 0
    for row in orphans:
        sendable = row.name in live_jobs if row.task is None else row.task in live_tasks
        if sendable:
            continue  # a live replica that registers it sends it
        with engine.begin() as conn:
            if lease.resolve_obsolete(
                conn, row.id, seen_next_try_ms=row.next_try_ms, now_ms=now_ms
            ):
                resolved += 1
                log.warning(
                    "job %r: occurrence %s resolved obsolete: %s, and no live replica "
                    "registers it; it will not be sent",
                    row.name,
                    row.id,
                    "its schedule is gone and its task"
                    if row.task is not None
                    else "no schedule bears its name and its job",
                )
    return resolved
