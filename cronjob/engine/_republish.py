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
forever.

Each publisher's due rows are sent in order, the one due longest first: the *probe*. If
the broker refuses it, the publisher's other due rows are put off, untried (one
statement, no try counted), and so is the probe's next try: by `DEFER_FIRST` seconds,
doubling with each consecutive refused probe of that publisher up to `DEFER_REFUSED`. A
broker that is down costs one send per sweep, not one per row, and its rows never fill
the sweep's `REPUBLISH_LIMIT` ahead of the rows of a broker that is up. As soon as a
probe is accepted, the publisher's other due rows are sent in the same sweep, and its
count of refused probes starts again.

A row that cannot be sent as it is (it does not decode, or its id is not the occurrence
id of its name and instant: ``Handoff.resend`` checks before it sends) is logged at
ERROR with its id and why, kept unsent and put off as a refused send is; the sweep goes
on with the other rows.

The next sweep comes at the latest `SWEEP_EVERY` seconds after one ends (or the shortest
hold of the jobs it sweeps, if less: a row a replica recorded just after a read, then
died holding, is read by the next before its hold ends), and sooner when a row comes due
before then: the read also finds the earliest next try time of the
unsent rows of the names it sweeps (a hold that ends, a replica that died holding it, a
back-off), and the sends the end of the put-off they set; the sweep comes then
(`SWEEP_AHEAD` earlier, so that this replica keeps held the sends it gave up on before
another replica may take them), at most one every `SWEEP_SOONEST` seconds.

A schedule made of data records its task with each occurrence. Once the schedule is
removed no replica has a job of its name, and the row is paired with the task's function
instead (any replica that registers the task sends it: the publisher comes from the task).
A row due for `ORPHAN_AFTER` seconds whose name is no schedule on record and whose task
(or, recorded without one, whose job) no live replica registers is resolved obsolete on
record: never sent, and not counted unsent; a row that does not decode is kept for
repair instead.

The sweep measures what it does (``cronjob.outbox.*``, see ``_metrics``): the rows sent
again, refused, resolved obsolete, found invalid, the latency to each acceptance, and
the outbox's unsent rows as its read found them.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from opentelemetry.metrics import NoOpMeterProvider

import lease

from .._clock import Clock
from ._control import Control
from ._metrics import Meters, OutboxMeters
from ._sweep import SWEEP_EVERY
from ._wings import Wing

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .._registry import Task
    from ._state import JobState

__all__ = [
    "DEFER_FIRST",
    "DEFER_REFUSED",
    "LIVE_WITHIN",
    "ORPHAN_AFTER",
    "REPUBLISH_LIMIT",
    "SWEEP_AHEAD",
    "SWEEP_SOONEST",
    "Republisher",
    "Resender",
    "Resent",
    "defer_pause",
]

log = logging.getLogger("cronjob")

#: The most unsent rows one sweep reads (the longest due first); more wait for the next.
REPUBLISH_LIMIT: Final = 500
#: Seconds the due rows of a publisher whose probe was refused are put off, untried, the
#: first time; each consecutive refused probe of the publisher doubles it.
DEFER_FIRST: Final = 2.0
#: The longest put-off, in seconds: a broker that is back is probed within it (or within
#: it after a probe in flight at its return has waited out its send timeout, 5 s at the
#: default hold), and its rows are all sent by that sweep, within 10 s of its return.
DEFER_REFUSED: Final = 4.0
#: The shortest time between the end of a sweep and the next, in seconds.
SWEEP_SOONEST: Final = 1.0
#: Seconds before the earliest next try of an unsent row that the sweep comes: this
#: replica keeps held the sends it gave up on before their hold ends.
SWEEP_AHEAD: Final = 1.0
#: Seconds a row must have been due, nobody sending it, before it may be resolved
#: obsolete: a replica that can send it would have within a few sweeps.
ORPHAN_AFTER: Final = 60.0
#: A replica seen within these seconds is live (as ``cronjob status`` counts them).
LIVE_WITHIN: Final = 60.0


class Resent(enum.Enum):
    """What `Resender.resend` did with a row."""

    #: The broker accepted it; the row is marked sent.
    SENT = "sent"
    #: The broker refused it (or gave no answer in time); its next try is set.
    REFUSED = "refused"
    #: Not claimed: sent meanwhile, or another replica took it first.
    NOT_CLAIMED = "not claimed"
    #: It cannot be sent as it is (see ``Handoff.resend``): logged, kept, put off.
    INVALID = "invalid"


@runtime_checkable
class Resender(Protocol):
    """A job function that can send an outbox row again (``cronjob.contrib.Handoff``)."""

    publisher: Any
    #: Seconds an attempt keeps its row from the other replicas.
    hold: float

    def resend(
        self, engine: Engine, row: lease.OutboxRow, *, now: datetime, retry_in: float | None = None
    ) -> Resent:
        """Send ``row`` again, or put it off ``retry_in`` seconds if it is refused."""
        ...

    def keep_held(self, engine: Engine, *, now: datetime) -> None:
        """Keep held the rows whose send this replica gave up on and may still be
        accepted, so that no other replica sends them meanwhile."""
        ...


def defer_pause(refused: int) -> float:
    """Seconds a publisher's due rows are put off after its ``refused``-th consecutive
    refused probe: `DEFER_FIRST`, doubling, at most `DEFER_REFUSED`."""
    return min(DEFER_REFUSED, DEFER_FIRST * float(2 ** min(16, max(0, refused - 1))))


@dataclass(frozen=True, slots=True)
class _Read:
    """What a sweep's read found: the due rows, and the earliest next try time after
    ``now_ms`` of the other unsent rows of its names (epoch ms), if any."""

    rows: list[lease.OutboxRow]
    next_ms: int | None


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
        meters: Where the sweep's measurements go (none: nowhere).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        states: Mapping[str, JobState],
        meters: Meters | None = None,
    ) -> None:
        self._clock = clock
        self._meters: OutboxMeters = (meters or _NO_METERS).outbox
        self._store = store
        self._control = control
        self._states = states
        self._thread: Control | None = None
        #: The functions of the tasks that hand their instants on, by task name: they
        #: send the rows of their removed schedules.
        self._tasks: dict[str, Resender] = {}
        self._sweep_at: float | None = None
        self._sweeping = False
        #: Consecutive refused probes by publisher (``id``); the outbox thread's own.
        self._refused: dict[int, int] = {}
        #: Seconds from a sweep's end to the next at the latest (`SWEEP_EVERY`, or the
        #: shortest hold of the senders if less).
        self._cadence = SWEEP_EVERY
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
        meters = self._meters
        senders = {id(fn): fn for fn in [*fns.values(), *tasks.values()]}.values()
        # A row recorded just after this read is read by the next within its hold.
        shortest = min([SWEEP_EVERY, *(float(fn.hold) for fn in senders)])
        self._cadence = max(SWEEP_SOONEST, shortest)

        def read() -> _Read:
            for fn in senders:
                fn.keep_held(store.engine, now=clock.now())
            now_ms = _ms(clock.now())
            _resolve_orphans(store, now_ms, fns, tasks, meters)
            with store.engine.connect() as conn:  # one transaction
                rows = lease.due_publications(
                    conn, now_ms=now_ms, limit=REPUBLISH_LIMIT, names=list(fns), tasks=list(tasks)
                )
                next_ms = lease.next_publication_ms(
                    conn, now_ms=now_ms, names=list(fns), tasks=list(tasks)
                )
                summary = lease.outbox_summary(conn)
            meters.read(summary.unsent, summary.oldest_ms, now_ms)
            if len(rows) >= REPUBLISH_LIMIT:
                next_ms = now_ms  # more are due: the next sweep as soon as may be
            return _Read(rows, next_ms)

        thread.run(read, self._send)

    def _send(self, read: _Read | BaseException) -> None:
        """On the dispatcher thread: pair each row with its job's function, send them."""
        if isinstance(read, BaseException):
            log.warning("reading the outbox failed: %s", read)
            self._done(None)
            return
        pairs: list[tuple[lease.OutboxRow, Resender]] = []
        for row in read.rows:
            state = self._states.get(row.name)
            fn: object = None if state is None else state.job.fn
            if not isinstance(fn, Resender) and row.task is not None:
                fn = self._tasks.get(row.task)  # a removed schedule's: its task sends it
            if isinstance(fn, Resender):  # else a replica that registers it sends it
                pairs.append((row, fn))
        if not pairs:
            self._done(read.next_ms)
            return
        engine, clock = self._store.engine, self._clock
        refused, meters = self._refused, self._meters
        assert self._thread is not None

        def send() -> int | None:
            put_off = _resend_all(engine, clock, pairs, refused, meters)
            return min((at for at in (read.next_ms, put_off) if at is not None), default=None)

        self._thread.run(send, self._done)

    def _done(self, next_ms: int | BaseException | None) -> None:
        """The sweep ended: the next comes after `SWEEP_EVERY` (or the shortest hold of
        its senders), or when the row due next (``next_ms``, epoch ms) comes due,
        `SWEEP_AHEAD` before, if that is sooner; not within `SWEEP_SOONEST`."""
        wait = self._cadence
        if isinstance(next_ms, BaseException):
            log.warning("sending the outbox again failed: %s", next_ms)
        elif next_ms is not None:
            due_in = (next_ms - _ms(self._clock.now())) / 1000 - SWEEP_AHEAD
            wait = min(wait, max(SWEEP_SOONEST, due_in))
        self._sweeping = False
        self._sweep_at = self._clock.monotonic() + wait

    def close(self) -> None:
        """Stop the thread: a send in flight ends with the process (its row is retried)."""
        if self._thread is not None:
            self._thread.shutdown(wait=0)


def _resend_all(
    engine: Engine,
    clock: Clock,
    pairs: list[tuple[lease.OutboxRow, Resender]],
    refused: dict[int, int],
    meters: OutboxMeters,
) -> int | None:
    """Send each row again (see the module's docstring: each publisher's first due row is
    its probe); after a refusal, put that publisher's other rows off. ``refused`` counts
    each publisher's consecutive refused probes, from sweep to sweep. Returns when the
    earliest put-off ends, or a refused probe's hold (epoch ms), or ``None``."""
    # Publisher -> when its put-off ends (epoch ms), and the ids of its rows not tried.
    put_off: dict[int, tuple[int, list[str]]] = {}
    wake: int | None = None  # when the next sweep must come (epoch ms)
    try:
        for row, fn in pairs:
            key = id(fn.publisher)
            if key in put_off:
                put_off[key][1].append(row.id)
                continue
            pause, now = defer_pause(refused.get(key, 0) + 1), clock.now()
            done = fn.resend(engine, row, now=now, retry_in=pause)
            if done is Resent.SENT:
                refused.pop(key, None)
                meters.accepted(row.name, row.target, row.instant, clock.now(), again=True)
            elif done is Resent.REFUSED:  # the broker is down: its other rows wait
                refused[key] = refused.get(key, 0) + 1
                # Its other rows come due with the probe, to be sent once it is accepted.
                # A send given up on may still be in flight: the probe's row is held
                # until its hold ends, and kept held by the sweep before then.
                tried = _ms(now)
                put_off[key] = (tried + round(pause * 1000), [])
                until = tried + round(min(pause, float(fn.hold)) * 1000)
                wake = until if wake is None else min(wake, until)
                meters.note_refused(row.name, row.target)
            elif done is Resent.INVALID:
                meters.note_invalid(row.name, row.target)
        by_end: dict[int, list[str]] = {}
        for end, ids in put_off.values():
            by_end.setdefault(end, []).extend(ids)
        now_ms = _ms(clock.now())
        for end, ids in by_end.items():
            if ids:
                with engine.begin() as conn:
                    lease.defer_publications(conn, ids, now_ms=now_ms, next_try_ms=end)
        return wake
    except lease.LeaseError as exc:
        log.warning("outbox: %s", exc)
        return None


def _ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def _resolve_orphans(
    store: lease.LeaseStore,
    now_ms: int,
    names: Mapping[str, object],
    tasks: Mapping[str, object],
    meters: OutboxMeters,
) -> int:
    """Resolve obsolete the rows due for `ORPHAN_AFTER` whose name is no schedule on
    record and whose task (or job, for a row recorded without a task) neither this
    replica nor any live one registers; returns how many. A row that does not decode is
    kept for repair. The replicas' records are read only when such a row is found."""
    engine = store.engine
    with engine.connect() as conn:
        found = lease.orphaned_publications(
            conn, now_ms=now_ms - round(ORPHAN_AFTER * 1000), limit=REPUBLISH_LIMIT
        )
    orphans = [
        row
        for row in found
        if row.name not in names and (row.task or row.name) not in tasks and row.problem is None
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
                meters.note_obsolete(row.name, row.target)
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


#: Measurements that go nowhere: a republisher built without a scheduler's (tests).
_NO_METERS = Meters(NoOpMeterProvider())
