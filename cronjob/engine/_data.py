"""Schedules made of data, followed: this replica's tasks' schedules loaded once the
database is reached, and every committed change applied within `POLL_EVERY` seconds.

Each schedule runs as a leased job (a `JobState` in the dispatcher's ``states``, named by
the schedule's id) whose function is its task's. The replica follows the change counter
(see `lease._schedules`): one read of its row every `POLL_EVERY` seconds, and when it
moved, the rows changed since the value last seen — a change costs the same whatever the
number of schedules. On a clock whose replicas all live in this process (a fake clock)
nothing is polled: the commit of a change tells this process's watchers, and the read
that follows waits for that commit (a locking read of the counter).

What a change does, as the dispatcher applies it:

- **Added**: scheduled from the first instant after it is seen (a one-off whose instant
  passed is claimed at once, as catch-up, if its policy catches up and its instant lies
  within its ``catch_up_window``; else it is done). A schedule no running replica saw
  (all were down, or none registered its task) is owed its instants from its commit by
  start-up's catch-up (`Recovery`, ``_committed``), not from here.
- **Changed**: the new schedule governs from the first instant after it is seen; the old
  one's instants are not caught up. A round claimed before runs as it was claimed (its
  descriptor is pinned, see `cronjob.engine._pinned`), retries and all; its end schedules
  the new schedule's next instant. An instant that came before the change and waits for
  its jittered start is pinned too: it starts as it would have.
- **Removed** (or its task is not registered here): no instant of it starts after; a
  round claimed before runs to its end, on record, never cut short nor superseded.
- **Added again** after a removal: owed nothing from before the re-add, which is its
  commit (the write marks a round of its former life cut short as run twice, see
  `lease.forgo_former_rounds`).

A wing (see ``_wings``): recovery calls it once the database is reached (`DataSchedules.reached`:
the load, before start-up's catch-up) and on each wake (`DataSchedules.poll`).

Dispatcher thread only; the reads run on a thread of their own (``cronjob-schedules``,
one per replica), the writes on the control thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime

import lease

from .._bounds import OneOff, timing
from .._clock import Clock
from .._exceptions import ScheduleError
from .._policy import CatchUp
from .._registry import Job, Task
from ..schedules._policies import with_own
from ._control import Control, Inbox
from ._metrics import Meters
from ._pinned import Pinned
from ._ports import Claimer, Timetable
from ._state import JobState, Reason, Run
from ._wings import Wing

__all__ = ["POLL_EVERY", "DataSchedules"]

log = logging.getLogger("cronjob")

#: Seconds between two reads of the change counter: a committed change is applied
#: within this long (plus one read).
POLL_EVERY = 1.0

_Read = tuple[int, list[lease.ScheduleRow]]
#: How many dropped schedules' tasks are kept for the ends of their last rounds.
_DROPPED_KEPT = 10_000


def job_of(row: lease.ScheduleRow, task: Task) -> Job:
    """The leased job that runs the schedule ``row`` with ``task``'s function and policy,
    with the policies the schedule sets for itself laid over it.

    Raises:
        ScheduleError: its spec does not parse here (a newer release's grammar?), or its
            policies are not valid (a row edited by hand).
    """
    return Job(
        name=row.id,
        fn=task.fn,
        schedule=timing(row.spec, row.at, row.start, row.end),
        leased=True,
        is_async=task.is_async,
        policy=with_own(task.policy, row.id, row.policies),
        task=task.name,
        args=row.args,
    )


class DataSchedules(Wing):
    """This replica's schedules made of data: loaded, polled, applied.

    Args:
        clock: The scheduler's clock.
        store: The lease store.
        control: Runs the writes (the lease rows' due).
        inbox: The dispatcher's: the reads' results come back through it.
        timetable: The heap the schedules' instants go in.
        claims: Claims a one-off's instant passed within the day.
        states: The jobs' states by name (the dispatcher's): the schedules' are added
            and removed here.
        tasks: This replica's tasks.
        meters: Makes each schedule's measurements.
        changed: Told of the schedules added and the names dropped.
        retimed: Told of a round in flight whose schedule's timing changed (the overlap
            policy may supersede it at the new timing's first instant).
        late: Catches up schedules loaded after start-up.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        inbox: Inbox,
        timetable: Timetable,
        claims: Claimer,
        states: dict[str, JobState],
        tasks: Mapping[str, Task],
        meters: Meters,
        changed: Callable[[list[JobState], list[str]], None],
        retimed: Callable[[Run], None] = lambda _run: None,
        late: Callable[[list[JobState]], None] = lambda _states: None,
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        # The reads of the counter and the changes go on a thread of their own, so that
        # a long statement of the control thread (a sweep over 100,000 names) never holds
        # a change back; writes (the lease rows' due) stay on the control thread.
        self._reads = Control(clock, inbox, name="cronjob-schedules")
        self._inbox = inbox
        self._timetable = timetable
        self._claims = claims
        self._states = states
        self._tasks = tasks
        self._meters = meters
        #: Called (dispatcher thread) with the schedules added and the names dropped: the
        #: parts that keep the leased names follow.
        self._changed = changed
        self._retimed = retimed
        #: Catches up schedules loaded after start-up (its load failed): start-up's rule.
        self._late = late
        #: The tasks not registered here whose schedules were logged (once per task).
        self._told_tasks: set[str] = set()
        #: The job of each schedule dropped lately (its last round's end still reports).
        self._dropped: dict[str, Job] = {}
        #: The counter value the schedules held here are complete up to; ``None``: not
        #: loaded yet.
        self.rev: int | None = None
        #: How many schedules this replica runs (their states are the dispatcher's).
        self.count = 0
        #: How many of them have a heartbeat their task has not (see `heartbeat_of`).
        self.beating = 0
        self._reading = False
        self._poll_at: float | None = None
        self._again = False  # a change was told while a read was in flight
        self._failing = False  # the last read failed (logged once)
        self._unwatch = store.watch(self._on_write) if clock.in_process else None

    def task_of(self, name: str) -> str | None:
        """The task of the schedule ``name`` (also one dropped lately, whose last round
        may still end), or ``None`` for a registered job (any thread: dict reads)."""
        job = self._job_of(name)
        return None if job is None else job.task

    def heartbeat_of(self, name: str) -> str | None:
        """The heartbeat URL of the schedule ``name`` (its own, else its task's; also of
        one dropped lately), or ``None`` (any thread: dict reads)."""
        job = self._job_of(name)
        return None if job is None else job.policy.heartbeat

    def _job_of(self, name: str) -> Job | None:
        state = self._states.get(name)
        if state is None:
            return self._dropped.get(name)
        return state.job if state.job.task is not None else None

    # -- reading ------------------------------------------------------------------------

    def reached(self, then: Callable[[], None]) -> bool:
        """The database was reached: load the schedules, unless loaded already, then call
        ``then`` (start-up's catch-up covers them). Returns whether it loads."""
        if self.rev is not None:
            return False
        self.load(then)
        return True

    def load(self, then: Callable[[], None]) -> None:
        """Read every schedule of this replica's tasks and apply them, then call ``then``
        (the start-up's catch-up, which covers them). A failed read is retried by the
        polls; ``then`` runs anyway."""
        self._reading = True
        store, tasks = self._store, sorted(self._tasks)

        def done(result: _Read | BaseException) -> None:
            self._reading = False
            if isinstance(result, BaseException):
                log.warning("reading the schedules failed: %s; read again shortly", result)
            else:
                self._apply(*result, ensure=False)
                log.info("%d schedule(s) of %d task(s) loaded", self.count, len(tasks))
            self._poll_at = self._next_poll()
            then()
            if self._again:  # told of a commit the load may have read before
                self._poll(told=True)

        # Every task's rows: those of tasks not registered here are counted, and told.
        self._reads.run(lambda: lease.schedule_changes(store, None, tasks=None), done)

    def next_wake(self, *, draining: bool) -> float | None:
        """When the next poll is due (monotonic), or ``None`` (none while draining)."""
        return None if self._reading or draining else self._poll_at

    def poll(self, mono: float) -> None:
        """Poll the counter if it is time."""
        if self._poll_at is not None and not self._reading and mono >= self._poll_at:
            self._poll()

    def close(self) -> None:
        """Stop watching this process's writes and reading the changes (the scheduler
        stopped): a read in flight is given a second, then left to its daemon thread."""
        if self._unwatch is not None:
            self._unwatch()
        self._reads.shutdown(wait=1.0)

    def _next_poll(self) -> float | None:
        if self._unwatch is not None and self.rev is not None:
            return None  # told of each change in this process
        return self._clock.monotonic() + POLL_EVERY

    def _on_write(self, write: lease.LeaseWrite) -> None:
        """A write in this process (any thread): schedules changed, read them."""
        if write.kind is lease.WriteKind.SCHEDULES:
            self._inbox.post(self._told)

    def _told(self) -> None:
        if self._reading:
            self._again = True
        elif self.rev is not None:
            self._poll(told=True)

    def _poll(self, *, told: bool = False) -> None:
        """Read the counter, and the rows changed since, if it moved. ``told``: a commit in
        this process is on its way: the read waits for it (a locking read), so that it
        sees what it was told of."""
        self._reading = True
        self._again = False
        store, since, tasks, wait = self._store, self.rev, sorted(self._tasks), told

        def done(result: _Read | BaseException) -> None:
            self._reading = False
            self._poll_at = self._next_poll()
            if isinstance(result, BaseException):
                # Once per outage, not every second: the claims say the rest.
                level = logging.DEBUG if self._failing else logging.WARNING
                log.log(level, "reading the schedules' changes failed: %s", result)
                self._failing = True
                self._poll_at = self._clock.monotonic() + POLL_EVERY
            else:
                if self._failing:
                    log.info("reading the schedules' changes works again")
                self._failing = False
                added = self._apply(*result, ensure=True)
                if since is None:  # the load at start failed: what start-up owes them
                    self._late(added)
            if self._again:
                self._poll(told=True)

        self._reads.run(lambda: lease.schedule_changes(store, since, wait=wait, tasks=tasks), done)

    # -- applying -----------------------------------------------------------------------

    def _apply(self, rev: int, rows: list[lease.ScheduleRow], *, ensure: bool) -> list[JobState]:
        """Apply the rows read (dispatcher thread); ``ensure``: give the new and changed
        ones their lease row's due instant (at start-up the catch-up's read does).
        Returns the schedules added."""
        self.rev = rev if self.rev is None else max(rev, self.rev)
        if not rows:
            return []
        states = self._states
        now = self._clock.now()
        fresh: list[tuple[JobState, Job | None]] = []  # with the job it replaced
        added: list[JobState] = []
        dropped: list[str] = []
        unknown: dict[str, int] = {}  # live schedules of tasks not registered here
        for row in rows:
            task = None if row.removed else self._tasks.get(row.task)
            if task is not None and row.format > lease.SCHEDULE_FORMAT:
                log.error(
                    "schedule %r is written in format %d, and this release runs format %d "
                    "at most: it is left to replicas of the release that wrote it",
                    row.id,
                    row.format,
                    lease.SCHEDULE_FORMAT,
                )
                task = None
            state = states.get(row.id)
            if state is not None and state.job.task is None:
                continue  # a registered job's name: never a schedule's (refused at add)
            if task is None:
                if state is not None:
                    dropped.append(self._drop(state))
                elif not row.removed and row.task not in self._tasks:
                    unknown[row.task] = unknown.get(row.task, 0) + 1
                continue
            try:
                job = job_of(row, task)
            except ScheduleError as exc:
                log.error("schedule %r is not run here: %s", row.id, exc)
                if state is not None:
                    dropped.append(self._drop(state))
                continue
            old = None if state is None else state.job
            if state is None:
                state = JobState(job, metrics=self._meters.job(row.id))
                states[row.id] = state
                self.count += 1
                self.beating += self._alone(job)
                added.append(state)
            if old is not None and _same(old, job):
                continue
            if old is not None:
                self.beating += self._alone(job) - self._alone(old)
                state.job = job
                state.refresh()
                if old.schedule != job.schedule or type(old.schedule) is not type(job.schedule):
                    state.changed, state.before = now, old.schedule
            fresh.append((state, old))
        if unknown:
            self._tell_unknown(unknown)
        for state, old in fresh:
            self._schedule(state, now, old)
        if added or dropped:
            self._changed(added, dropped)
        if fresh or dropped:
            log.debug("schedules: %d added or changed, %d dropped", len(fresh), len(dropped))
        if ensure and fresh:
            self._ensure([state for state, _old in fresh], now)
        return added

    def _tell_unknown(self, unknown: dict[str, int]) -> None:
        """Log, once per task for this replica's life, the schedules that name a task it
        does not register (``unknown``: how many of each task, in the rows just read): a
        schedule added for a task no replica registers would otherwise never run, and
        say so nowhere but in ``cronjob status``. One line per task, however many rows."""
        for name in sorted(unknown.keys() - self._told_tasks):
            self._told_tasks.add(name)
            log.warning(
                "%d schedule(s) name task %r, which this replica does not register: only "
                "a replica that registers it runs them (cronjob status shows them as "
                "orphaned when none does)",
                unknown[name],
                name,
            )

    def _schedule(self, state: JobState, now: datetime, old: Job | None) -> None:
        """Schedule a new or changed schedule from now (a round in flight: from its end).
        ``old``: the job it replaced (``None``: a new schedule)."""
        timetable = self._timetable
        if state.busy:  # its round's end schedules the new schedule's next instant
            if old is not None and state.run is not None and state.changed == now:
                self._retimed(state.run)
            return
        came = state.due
        if old is not None and came is not None and came <= now:
            # Its instant came before the change, its jittered start has not: it starts
            # then as it would have, pinned (the heap entry stays); the new schedule
            # follows from its end.
            pinned = Pinned.of(old, came)
            if pinned.starts_at() > now:
                state.pinned = pinned
                return
        schedule = state.job.schedule
        if isinstance(schedule, OneOff) and schedule.at <= now:
            # Its one instant passed: owed as any missed instant is, by its catch-up policy.
            policy = state.job.policy
            if policy.catch_up is not CatchUp.NONE and now - schedule.at <= policy.catch_up_window:
                timetable.take(state)
                self._claims.claim(schedule.at, [state], reason=Reason.CATCH_UP)
            else:
                log.info(
                    "schedule %r: its instant %s passed, not caught up: done",
                    state.job.name,
                    schedule.at.isoformat(),
                )
            return
        timetable.schedule_after(state, now)

    def _drop(self, state: JobState) -> str:
        """No instant of ``state``'s schedule starts any more here; a round in flight ends
        as it runs. Returns its name."""
        name = state.job.name
        self.beating -= self._alone(state.job)
        if state.job.task is not None:
            self._dropped[name] = state.job
            while len(self._dropped) > _DROPPED_KEPT:  # the oldest first
                del self._dropped[next(iter(self._dropped))]
        state.retired = True
        state.generation += 1  # its heap entry is void
        del self._states[name]
        self.count -= 1
        return name

    def _alone(self, job: Job) -> int:
        """1 if the schedule ``job`` has a heartbeat of its own where its task has none,
        else 0: the failure policies hear of every end while some schedule has one."""
        task = self._tasks.get(job.task or "")
        return int(job.policy.heartbeat is not None and (task is None or not task.policy.heartbeat))

    def _ensure(self, states: list[JobState], now: datetime) -> None:
        store = self._store
        specs = {state.job.name: state.job.schedule.spec for state in states}
        due = {state.job.name: state.job.schedule.next(now) for state in states}

        def done(result: BaseException | None) -> None:
            if isinstance(result, BaseException):
                log.warning("writing the schedules' lease rows failed: %s", result)

        self._control.run(lambda: store.ensure(sorted(specs), specs=specs, due=due), done)


def _same(old: Job, new: Job) -> bool:
    """Whether two jobs of one schedule run the same: task, timing, arguments and
    policies."""
    return (
        old.task == new.task
        and old.args == new.args
        and old.policy == new.policy
        and old.schedule == new.schedule
        and type(old.schedule) is type(new.schedule)
    )
