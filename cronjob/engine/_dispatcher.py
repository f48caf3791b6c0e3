"""The dispatcher: the one thread that owns the scheduling state and decides.

It keeps one heap of the jobs' next instants, runs the messages other threads post to
its inbox, and wakes at the earliest of its own deadlines and those of the lease keeper
and recovery. At each wake it fires the instants that came due (one claim statement per
instant for this replica's share of the leased jobs due then, and one more after a grace
for the shares other replicas left, see ``_peers``), lets recovery and the lease keeper
act, and starts the rounds that were won. It never does I/O: statements go to the
control thread and their results come back through the inbox, so a slow database cannot
delay a deadline. Claiming the instants (the shares, the rest after a grace, the rounds
held until their instant) is the `Claims` part's, on this same thread.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import NamedTuple

import lease

from .._clock import Clock
from .._exceptions import Shutdown
from .._policy import Overlap
from .._round import Outcome
from ._claiming import Claims
from ._control import Control, Inbox
from ._keeper import LeaseKeeper
from ._overlap import NextRounds
from ._peers import Peers
from ._policies import PolicyTimers
from ._recovery import Recovery
from ._runner import RoundRunner, Start
from ._state import Flags, JobState, Reason, Run
from ._summary import RoundSummary

__all__ = ["Dispatcher"]

log = logging.getLogger("cronjob")

#: Rounds of one claim handed to the worker threads at a time (see start_rounds).
START_BATCH = 128


class _Due(NamedTuple):
    """A job's next instant in the heap; stale once the job's generation moved on. A
    tuple, ordered by ``(at, seq)`` in C (``seq`` is unique, so ``state`` is never
    compared): the heap compares entries thousands of times per instant at scale."""

    at: datetime  # when its round starts: ``when``, or later by the job's jitter
    seq: int
    state: JobState
    generation: int
    when: datetime


class Dispatcher:
    """Owns the jobs' states, the heap of their next instants and the rounds in flight.

    Everything here runs on the dispatcher thread (`serve`), except
    `post_rounds_ended` (through the inbox) and the ``drained`` and ``decided``
    events. The parts it calls (runner, keeper, recovery) are wired in by the scheduler
    before the thread starts; it builds its own (peers, claims, policies, summary).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        replica_id: str,
        states: dict[str, JobState],
        store: lease.LeaseStore,
        inbox: Inbox,
        control: Control,
        flags: Flags,
        tasks: Collection[str] = (),
    ) -> None:
        self._clock = clock
        self._replica_id = replica_id
        self.states = states
        self._store = store
        self._inbox = inbox
        self._control = control
        self._flags = flags
        self.request_ended: Callable[[lease.TriggerRow], None] = lambda _: None  # the sweeper's
        self.runner: RoundRunner
        self.keeper: LeaseKeeper
        self.recovery: Recovery
        self.peers = Peers(
            clock=clock,
            store=store,
            control=control,
            replica_id=replica_id,
            jobs={
                name: state.job.schedule.spec for name, state in states.items() if state.job.leased
            }
            | dict.fromkeys(tasks, ""),
        )
        #: The claims of instants (this replica's share, the rest, the rounds held).
        self.claims = Claims(
            self,
            clock=clock,
            replica_id=replica_id,
            store=store,
            control=control,
            flags=flags,
            peers=self.peers,
        )
        self._heap: list[_Due] = []
        self._seq = itertools.count()
        #: The rounds in flight on this replica.
        self.runs: set[Run] = set()
        #: A drain began: no new rounds start.
        self.draining = False
        #: Set once draining and no round is in flight (any thread may wait on it).
        self.drained = clock.event()
        #: After ``stop``, rounds still running hold leases: the thread goes on keeping
        #: them (renewal, loss, exit) until they end, then calls ``after_lingering``.
        self.lingering = False
        self.after_lingering: Callable[[], None] | None = None
        #: Set once the thread, told to stop, either returned or began to linger.
        self.decided = threading.Event()
        self._ready = threading.Event()
        #: The rounds started and ended, logged once a minute (their own lines are DEBUG).
        self.summary = RoundSummary(clock.monotonic())
        #: The jobs' timeouts and retry backoffs (see ``_policies``).
        self.policies = PolicyTimers(self, clock=clock, store=store, control=control, flags=flags)
        #: What follows a round's end; the rounds ``cancel_other`` supersedes.
        self.next_rounds = NextRounds(self, clock=clock)

    # -- the thread -----------------------------------------------------------------------

    def serve(self) -> None:
        """The dispatcher thread's body: run until the scheduler stops."""
        with self._clock._tracked():
            try:
                if self.recovery.db_ready:
                    self.recovery.on_database_ready()
                self._ready.set()
                self._loop()
            except BaseException:
                log.critical("the scheduler's dispatcher failed", exc_info=True)
                raise
            finally:
                self.summary.flush(self._clock.monotonic())
                self._ready.set()
                self.decided.set()
        if self.lingering and self.after_lingering is not None:
            self.after_lingering()

    def wait_ready(self) -> None:
        """Block until the thread is serving (the start-up handshake)."""
        self._ready.wait()

    def _loop(self) -> None:
        while True:
            self._inbox.wake.clear()
            self._inbox.run_pending()
            if self._flags.stopped and not self._linger():
                self._inbox.close()  # a late result now goes to its `orphaned` handler
                return
            now, mono = self._clock.now(), self._clock.monotonic()
            self.recovery.retry_database(mono)
            self.recovery.probe(mono)
            if not self.draining:
                self.recovery.poll(mono)
            if self.recovery.db_ready:
                self.peers.tick(now)
            if not self.draining and not self.recovery.catch_up_pending:
                self._fire_due(now, mono)
                self.claims.start_held(now)
                self.claims.claim_rest(now)
                self.next_rounds.tick(now)
                self.recovery.sweep(mono)
            else:
                self.claims.drop_rest()
            self.policies.tick(mono)
            self.keeper.tick(mono)
            if self.draining and not self.runs:
                self.drained.set()
            self._inbox.wake.wait(self._timeout(now, mono))

    def _linger(self) -> bool:
        """Whether to go on after ``stop``: while rounds that ignored the drain still hold
        leases, the lease rule needs their renewals and their loss and exit deadlines."""
        if self._flags.crashed:
            return False
        holding = [run for run in self.runs if run.token is not None and not run.settled]
        if holding and not self.lingering:
            self.lingering = True
            log.warning(
                "stopped with %d round(s) still running (%s): their leases are kept until "
                "they end, then the scheduler finishes stopping",
                len(holding),
                ", ".join(sorted(run.ctx.name for run in holding)),
            )
            self.decided.set()
        return bool(holding)

    def _timeout(self, now: datetime, mono: float) -> float | None:
        """Seconds until the next thing to do: the next instant (wall clock) or the parts'
        timers (monotonic); ``None`` when there is nothing until a message comes."""
        timeouts: list[float] = []
        while self._heap and self._heap[0].generation != self._heap[0].state.generation:
            heapq.heappop(self._heap)  # entries of jobs that were rescheduled or started
        if self._heap and not self.draining and not self.recovery.catch_up_pending:
            timeouts.append((self._heap[0].at - now).total_seconds() - self.claims.lead())
        parts = [
            self.recovery.next_wake(draining=self.draining),
            self.keeper.next_wake(),
            self.policies.next_wake(),
        ]
        if not self.draining:
            # The peers' next read; a round held for its instant, an instant's rest.
            for at in (
                self.peers.next_wake(),
                self.claims.next_wake(),
                self.next_rounds.next_wake(),
            ):
                if at is not None:
                    timeouts.append((at - now).total_seconds())
        for part in parts:
            if part is not None:
                timeouts.append(part - mono)
        return max(0.0, min(timeouts)) if timeouts else None

    # -- the heap -------------------------------------------------------------------------

    def schedule_after(
        self, state: JobState, after: datetime, *, when: datetime | None = None
    ) -> None:
        """Put ``state``'s job back in the heap at its first instant after ``after``
        (``when``, if the caller knows it already); ``state.due`` says which."""
        state.busy = False
        state.generation += 1
        state.due = None
        if state.retired:
            return  # a schedule made of data, removed
        if when is None:
            when = state.job.schedule.next(after)
        if when is None:
            if state.job.task is not None:  # a one-off, or a schedule past its end
                log.info("schedule %r has no instant after %s: done", state.job.name, after)
                return
            log.warning(
                "job %r has no instant after %s: it will not run again", state.job.name, after
            )
            return
        state.due = when
        due = _Due(state.starts_at(when), next(self._seq), state, state.generation, when)
        heapq.heappush(self._heap, due)

    @property
    def inbox(self) -> Inbox:
        """The dispatcher's inbox (for a part with a statement thread of its own)."""
        return self._inbox

    def post(self, message: Callable[[], None]) -> None:
        """Run ``message`` on the dispatcher thread (from any thread)."""
        self._inbox.post(message)

    def take(self, state: JobState) -> None:
        """Mark ``state``'s job busy (claiming or running): its heap entry is void."""
        state.busy = True
        state.generation += 1

    def run_at_start(self) -> None:
        """Run each per-instance job registered with ``run_at_start=True`` once, now (its
        round's instant is the start, to the second); its schedule resumes after it."""
        now, mono = self._clock.now(), self._clock.monotonic()
        for state in self.states.values():
            if state.job.run_at_start and not state.busy:
                self.take(state)
                instant = now.replace(microsecond=0)
                self.start_round(
                    state, instant, attempt=1, token=None, claimed_at=mono, reason=Reason.START
                )

    def _fire_due(self, now: datetime, mono: float) -> None:
        """Pop the jobs due by this wake (a claim's lead ahead of ``now``): start the
        per-instance ones (at their instant), hand the leased ones to the claims."""
        claims = self.claims
        horizon = now + timedelta(seconds=claims.lead())
        # Counted before this wake's rounds start: rounds of one instant share the threads.
        heap = self._heap
        saturated = bool(heap) and heap[0].at <= horizon and claims.workers_saturated()
        due: dict[datetime, list[JobState]] = {}
        while self._heap and self._heap[0].at <= horizon:
            entry = heapq.heappop(self._heap)
            state = entry.state
            if entry.generation != state.generation or state.busy:
                continue
            self.take(state)
            if not state.job.leased and state.paused:
                when = entry.when.isoformat()
                log.info("job %r: instant %s skipped: paused", state.job.name, when)
                self.schedule_after(state, entry.when)
            elif not state.job.leased:
                start = functools.partial(
                    self.start_round,
                    state,
                    entry.when,
                    attempt=1,
                    token=None,
                    claimed_at=mono,
                    reason=Reason.SCHEDULE,
                )
                if entry.at > now:
                    drop = functools.partial(self.schedule_after, state, entry.when)
                    claims.hold(entry.at, start, drop)
                else:
                    start()
            elif not self.recovery.db_ready:
                log.warning(
                    "job %r: instant %s skipped: the database is not reachable yet",
                    state.job.name,
                    entry.when.isoformat(),
                )
                state.metrics.skipped(1, "database unreachable")
                self.schedule_after(state, entry.when)
            elif entry.at != entry.when:  # jittered: claimed alone at its start (_jitter)
                drop = functools.partial(self.schedule_after, state, entry.when)
                claims.hold(entry.at, functools.partial(claims.claim, entry.when, [state]), drop)
            else:
                due.setdefault(entry.when, []).append(state)
        if due:
            claims.claim_due(due, now, mono, saturated=saturated)

    # -- rounds ---------------------------------------------------------------------------

    def start_round(
        self,
        state: JobState,
        instant: datetime,
        *,
        attempt: int,
        token: int | None,
        claimed_at: float,
        reason: Reason,
    ) -> None:
        """Start the round of ``state``'s job for ``instant``: ``token`` is its lease's
        (``None`` for a per-instance round), claimed at the monotonic time ``claimed_at``."""
        self.start_rounds(
            [(state, token)], instant, attempt=attempt, claimed_at=claimed_at, reason=reason
        )

    def start_rounds(
        self,
        rounds: list[tuple[JobState, int | None]],
        instant: datetime,
        *,
        attempt: int,
        claimed_at: float,
        reason: Reason,
    ) -> None:
        """`start_round` for each ``(state, token)`` of ``rounds``, handed to the
        worker threads `START_BATCH` at a time (the rounds one claim won): one lock
        per batch, and the first rounds run while the next are built.

        A schedule made of data removed since its claim went out (held, claimed with the
        rest, caught up) starts nothing, its lease given back; a retry runs as claimed."""
        if reason is not Reason.RETRY and any(state.retired for state, _token in rounds):
            gone: dict[int, list[str]] = {}
            for state, token in rounds:
                if state.retired and token is not None:
                    gone.setdefault(token, []).append(state.job.name)
            for token, names in gone.items():
                log.info("instant %s of removed schedule(s) not started: %s", instant, names)
                self.claims.give_back_names(names, token)
            rounds = [(state, token) for state, token in rounds if not state.retired]
        for first in range(0, len(rounds), START_BATCH):
            runs: list[Run] = []
            unstarted: list[Run] = []
            for state, token in rounds[first : first + START_BATCH]:
                run = self.runner.prepare(
                    state,
                    instant,
                    attempt=attempt,
                    token=token,
                    claimed_at=claimed_at,
                    reason=reason,
                )
                state.busy = True
                state.run = run
                self.runs.add(run)
                if run.pinned.policy.overlap is Overlap.CANCEL_OTHER:
                    self.next_rounds.watch(run)
                if token is not None:
                    self.keeper.hold(run, claimed_at)
                runs.append(run)
            for run, started in zip(runs, self.runner.submit_many(runs), strict=True):
                if started is Start.STARTED:
                    self.summary.started()
                    continue
                run.ended = True  # it never runs
                self._forget(run)
                if started is Start.NO_THREAD:  # it will never run: hand it on
                    unstarted.append(run)
            if unstarted:
                self._not_started(unstarted, instant)

    def _not_started(self, runs: list[Run], instant: datetime) -> None:
        """Hand on rounds no thread could run: their leases back (one statement per
        token), their schedule kept."""
        given: dict[int, list[str]] = {}
        for run in runs:
            state = run.state
            if state.run is run:
                state.run = None
            if run.token is not None:
                given.setdefault(run.token, []).append(state.job.name)
            self.schedule_after(state, instant)
        for token, names in given.items():
            self.claims.give_back_names(names, token)

    def start_manual(
        self, state: JobState, request: lease.TriggerRow, *, token: int | None, claimed_at: float
    ) -> None:
        """Start the manual round ``request`` asked for, taken with ``token`` (``None`` for
        a per-instance job), or a backfill's instant of the past (its ``ctx.instant``).
        The job's next instant stays in the heap, and its end schedules nothing."""
        instant, why = (request.instant, Reason.BACKFILL) if request.backfill else (None, None)
        run = self.runner.prepare(
            state,
            instant or request.requested,
            attempt=request.attempt + 1,
            token=token,
            claimed_at=claimed_at,
            reason=why or Reason.MANUAL,
            request=request,
        )
        self.runs.add(run)
        if token is not None:
            self.keeper.hold(run, claimed_at)
        if self.runner.submit(run) is not Start.STARTED:
            run.ended = True  # it never runs: on record as cut short, so it is taken again
            self._forget(run)
            triggers, name = lease.Triggers(self._store), state.job.name
            self._control.run(
                lambda: triggers.end(
                    request.id, name, token or 0, leased=token is not None, outcome="cut short"
                ),
                lambda _result: None,
            )

    def post_round_started(self, run: Run) -> None:
        """Tell the dispatcher thread that ``run``'s round (of a job with a policy) started,
        from the round's thread: its timeout is timed from then."""
        self._inbox.post(functools.partial(self.policies.watch, run))

    def post_rounds_ended(self, ends: list[tuple[Run, datetime]]) -> None:
        """Tell the dispatcher thread that each ``run`` ended at its ``ended`` (from the
        round's thread, or the finisher's), in one message."""
        self._inbox.post(lambda: self.rounds_ended(ends))

    def rounds_ended(self, ends: list[tuple[Run, datetime]]) -> None:
        """`round_ended` for each of ``ends``."""
        for run, ended in ends:
            self.round_ended(run, ended)

    def round_ended(self, run: Run, ended: datetime) -> None:
        """``run`` ended at ``ended`` and its end is settled: schedule the job's next instant,
        or claim the one its policy says follows (see ``_overlap``); not after a manual
        round: the schedule never moved for it. An attempt that ended ``retrying`` keeps
        its lease and waits for its retry instead."""
        if run.outcome is Outcome.RETRYING:
            self.runs.discard(run)
            if self.policies.backoff(run, ended):
                self.summary.ended(run.outcome, self._clock.monotonic())
                return
        self._forget(run)
        if run.request is not None:
            self.request_ended(run.request)  # a backfill's next instant may be taken now
            return
        state = run.state
        if state.run is run:
            state.run = None
        self.summary.ended(run.outcome, self._clock.monotonic())
        if not self._flags.stopped:
            self.next_rounds.after(run, ended)

    def _forget(self, run: Run) -> None:
        self.runs.discard(run)
        if run.token is not None:
            self.keeper.release(run)

    def begin_drain(self) -> None:
        """Stop starting rounds and cancel the running ones with [Shutdown][cronjob.Shutdown]."""
        if self.draining:
            return
        self.draining = True
        self.policies.drain()
        for run in list(self.runs):
            self.runner.cancel(run, Shutdown(f"job {run.ctx.name!r}: the scheduler is draining"))
