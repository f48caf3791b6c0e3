"""The dispatcher: the one thread that owns the scheduling state and decides.

It keeps one heap of the jobs' next instants, runs the messages other threads post to
its inbox, and wakes at the earliest of its own deadlines and those of the lease keeper
and recovery. At each wake it fires the instants that came due (one claim statement per
instant for this replica's share of the leased jobs due then, and one more after a grace
for the shares other replicas left, see ``_peers``), lets recovery and the lease keeper
act, and starts the rounds that were won. It never does I/O: statements go to the
control thread and their results come back through the inbox, so a slow database cannot
delay a deadline. Claiming the instants (the shares, the rest after a grace, the rounds
held until their instant) is the `Claims` part's, on this same thread; starting the
rounds won and taking their ends back is the `InFlight` part's (``_inflight``).

The façade wires the parts (``_wiring``): each part gets the dispatcher as the
`Timetable` port (``_ports``), never the dispatcher itself, and the dispatcher gets the
parts it calls.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import NamedTuple

from .._clock import Clock
from ._claiming import Claims
from ._control import Inbox
from ._inflight import InFlight
from ._keeper import LeaseKeeper
from ._overlap import NextRounds
from ._peers import Peers
from ._policies import PolicyTimers
from ._recovery import Recovery
from ._state import Flags, JobState, Reason, Run
from ._summary import RoundSummary

__all__ = ["Dispatcher"]

log = logging.getLogger("cronjob")


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
    """Owns the jobs' states, the heap of their next instants and the drain.

    Everything here runs on the dispatcher thread (`serve`), except the ``drained``
    and ``decided`` events. The parts it calls (peers, claims, the rounds in flight,
    policies, what follows an end, keeper, recovery) are wired in by the façade before
    the thread starts (see ``_wiring``).

    Args:
        clock: The scheduler's clock.
        states: The jobs' states by name (shared with the parts, on this thread).
        inbox: The messages other threads post to this one.
        flags: The scheduler's life flags.
        summary: The rounds started and ended, logged once a minute.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        states: dict[str, JobState],
        inbox: Inbox,
        flags: Flags,
        summary: RoundSummary,
    ) -> None:
        self._clock = clock
        self.states = states
        self._inbox = inbox
        self._flags = flags
        #: The live replicas and each one's share of an instant.
        self.peers: Peers
        #: The claims of instants (this replica's share, the rest, the rounds held).
        self.claims: Claims
        #: Starts the rounds won and takes their ends back.
        self.inflight: InFlight
        #: The rounds in flight on this replica (the `InFlight` part's set).
        self.runs: set[Run]
        #: The jobs' timeouts and retry backoffs (see ``_policies``).
        self.policies: PolicyTimers
        #: What follows a round's end; the rounds ``cancel_other`` supersedes.
        self.next_rounds: NextRounds
        self.keeper: LeaseKeeper
        self.recovery: Recovery
        self._heap: list[_Due] = []
        self._seq = itertools.count()
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
        self.summary = summary

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
                self.inflight.start_round(
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
                    self.inflight.start_round,
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

    def begin_drain(self) -> None:
        """Stop starting rounds and cancel the running ones with [Shutdown][cronjob.Shutdown]."""
        if self.draining:
            return
        self.draining = True
        self.policies.drain()
        self.inflight.cancel_all()
