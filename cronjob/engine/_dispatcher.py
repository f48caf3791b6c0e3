"""The dispatcher: the one thread that owns the scheduling state and decides.

It keeps one heap of the jobs' next instants, runs the messages other threads post to
its inbox, and wakes at the earliest of its own deadlines and those of the lease keeper
and recovery. At each wake it fires the instants that came due (one claim statement per
instant for this replica's share of the leased jobs due then, and one more after a grace
for the shares other replicas left, see ``_peers``), lets recovery and the lease keeper
act, and starts the rounds that were won. It never does I/O: statements go to the
control thread and their results come back through the inbox, so a slow database cannot
delay a deadline.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

import lease

from .._clock import Clock
from .._exceptions import Shutdown
from .._round import Outcome
from ._control import Control, Inbox
from ._keeper import LeaseKeeper, too_late
from ._lead import LEAD_MAX, ClaimLead
from ._peers import GRACE, Peers
from ._policies import PolicyTimers
from ._recovery import Recovery
from ._runner import RoundRunner, Start
from ._state import Flags, JobState, Reason, Run
from ._summary import RoundSummary

__all__ = ["Dispatcher"]

log = logging.getLogger("cronjob")

_GRACE = timedelta(seconds=GRACE)
#: Rounds of one claim handed to the worker threads at a time (see start_rounds).
START_BATCH = 128


class _Due(NamedTuple):
    """A job's next instant in the heap; stale once the job's generation moved on.

    A tuple, ordered by ``(when, seq)`` in C (``seq`` is unique, so ``state`` is never
    compared): the heap compares entries thousands of times per instant at scale.
    """

    when: datetime
    seq: int
    state: JobState
    generation: int


@dataclass
class _Rest:
    """Jobs of an instant claimed later than this replica's share: the other replicas'
    shares, after the grace, if they left them unclaimed (and jobs of this replica's
    share its claim sent ahead did not win); or, ``whole``, an instant too small to
    share, claimed whole at the instant itself."""

    #: When to claim them: on the wall clock like the instant.
    at: datetime
    instant: datetime
    states: list[JobState]
    #: Put off once already because every worker thread was busy.
    deferred: bool = False
    #: A small instant claimed whole (see Dispatcher._fire_due), not others' shares.
    whole: bool = False


@dataclass
class _Held:
    """Rounds won ahead of their instant (see :meth:`Dispatcher.lead`), started at it."""

    instant: datetime
    start: Callable[[], None]
    #: Undoes the claim instead (the scheduler began to drain meanwhile).
    drop: Callable[[], None]


class Dispatcher:
    """Owns the jobs' states, the heap of their next instants and the rounds in flight.

    Everything here runs on the dispatcher thread (:meth:`serve`), except
    :meth:`post_rounds_ended` (through the inbox), :meth:`give_back` (on the control thread,
    once the dispatcher has gone) and the ``drained`` and ``decided`` events. The parts it
    calls (runner, keeper, recovery) are wired in by the scheduler before the thread starts.
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
    ) -> None:
        self._clock = clock
        self._replica_id = replica_id
        self.states = states
        self._store = store
        self._inbox = inbox
        self._control = control
        self._flags = flags
        self.runner: RoundRunner
        self.keeper: LeaseKeeper
        self.recovery: Recovery
        self.peers = Peers(
            clock=clock,
            store=store,
            control=control,
            replica_id=replica_id,
            names=[name for name, state in states.items() if state.job.leased],
        )
        #: Other replicas' shares of past instants, in order, claimed once the grace passed.
        self._rest: list[_Rest] = []
        #: Rounds won ahead of their instant, in order, started when it comes.
        self._held: list[_Held] = []
        #: How long this replica's claims take: they go out that much ahead of an instant.
        self.claim_lead = ClaimLead()
        self._heap: list[_Due] = []
        self._seq = itertools.count()
        #: The rounds in flight on this replica.
        self.runs: set[Run] = set()
        #: Sync leased jobs in claims not answered yet (they take worker threads soon).
        self._claiming_sync = 0
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
            if self.recovery.db_ready:
                self.peers.tick(now)
            if not self.draining and not self.recovery.catch_up_pending:
                self._fire_due(now, mono)
                self._start_held(now)
                self._claim_rest(now)
                self.recovery.sweep(mono)
            elif self._rest or self._held:
                self._drop_rest()
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
            timeouts.append((self._heap[0].when - now).total_seconds() - self.lead())
        if self._held and not self.draining:
            timeouts.append((self._held[0].instant - now).total_seconds())
        parts = [
            self.recovery.next_wake(draining=self.draining),
            self.keeper.next_wake(),
            self.policies.next_wake(),
        ]
        if not self.draining:
            read_at = self.peers.next_wake()
            if read_at is not None:
                timeouts.append((read_at - now).total_seconds())
            if self._rest:
                timeouts.append((self._rest[0].at - now).total_seconds())
        for part in parts:
            if part is not None:
                timeouts.append(part - mono)
        return max(0.0, min(timeouts)) if timeouts else None

    # -- the heap -------------------------------------------------------------------------

    def schedule_after(
        self, state: JobState, after: datetime, *, when: datetime | None = None
    ) -> None:
        """Put ``state``'s job back in the heap at its first instant after ``after``
        (``when``, if the caller knows it already)."""
        state.busy = False
        state.generation += 1
        if when is None:
            when = state.job.schedule.next(after)
        if when is None:
            log.warning(
                "job %r has no instant after %s: it will not run again", state.job.name, after
            )
            return
        heapq.heappush(self._heap, _Due(when, next(self._seq), state, state.generation))

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

    def lead(self) -> float:
        """Seconds ahead of an instant its share's claim goes out: as long as claims take
        (see ``_lead``); while this replica needs to be seen by the others (see
        :attr:`Peers.lead`), ahead of any replica's claims. Every round still starts at
        its instant."""
        if self.peers.lead:
            return LEAD_MAX + self.peers.lead
        return self.claim_lead.seconds

    def _fire_due(self, now: datetime, mono: float) -> None:
        horizon = now + timedelta(seconds=self.lead())
        # Counted before this wake's rounds start: rounds of one instant share the threads.
        saturated = bool(self._heap) and self._heap[0].when <= horizon and self._workers_saturated()
        due: dict[datetime, list[JobState]] = {}
        while self._heap and self._heap[0].when <= horizon:
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
                if entry.when > now:
                    drop = functools.partial(self.schedule_after, state, entry.when)
                    self._hold(_Held(entry.when, start, drop))
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
            else:
                due.setdefault(entry.when, []).append(state)
        for instant, states in due.items():
            shares = self.peers.share(instant, states)
            # Too few to share: claimed whole, the first to claim wins, as without peers.
            mine, rest = shares if shares is not None else (states, [])
            if rest:
                self._add_rest(_Rest(instant + _GRACE, instant, rest))
            if saturated:
                mine = self._refuse_sync(instant, mine)
            if not mine:
                continue
            if shares is None:
                # Not ahead by the claims' lead: every replica claims these, and one whose
                # claim finds the lease still held by the round before (ending before the
                # instant) would otherwise have lost the instant if that round's replica
                # then stops. Ahead only to be seen (see Peers.lead), as before.
                at = instant - timedelta(seconds=self.peers.lead)
                if at > now:
                    self._add_rest(_Rest(at, instant, mine, whole=True))
                    continue
                self.claim(instant, mine, then=self._claimed_whole(instant, mine))
                continue
            self.claim(
                instant,
                mine,
                then=self._claimed_share(instant, mine, mono),
                lost_later=instant > now,
            )

    def _claimed_share(
        self, instant: datetime, mine: list[JobState], woke: float
    ) -> Callable[[set[str]], None]:
        """What to do when the claim of this replica's share of ``instant``, sent on the
        wake at monotonic ``woke``, answered: learn how long claims take, tell peers."""

        def then(won: set[str]) -> None:
            self.claim_lead.took(self._clock.monotonic() - woke)
            self.peers.claimed_share(instant, mine, won, whole=False)

        return then

    def _claimed_whole(self, instant: datetime, mine: list[JobState]) -> Callable[[set[str]], None]:
        return functools.partial(self.peers.claimed_share, instant, mine, whole=True)

    def _add_rest(self, rest: _Rest) -> None:
        bisect.insort(self._rest, rest, key=lambda r: r.at)

    def _claim_later(self, instant: datetime, lost: list[JobState]) -> bool:
        """Add ``lost`` (jobs of this replica's share whose claim, sent ahead of
        ``instant``, did not win them) to the rest of ``instant``: a lease still held
        by the round before, ending before the instant, is free by then. ``False`` if
        that claim has gone out already (the others' claims covered them then)."""
        for rest in self._rest:
            if rest.instant == instant and not rest.whole and not rest.deferred:
                rest.states.extend(lost)
                return True
        if instant + _GRACE <= self._clock.now():
            return False
        self._add_rest(_Rest(instant + _GRACE, instant, lost))
        return True

    def _hold(self, held: _Held) -> None:
        bisect.insort(self._held, held, key=lambda h: h.instant)

    def _unhold(self, won: list[JobState], token: int, instant: datetime) -> None:
        """Draining before the instant of rounds won ahead: hand each on, as a round cut
        short (another replica's sweep runs it; see :meth:`hand_back`)."""
        for state in won:
            self.hand_back(state.job.name, token)
            self.schedule_after(state, instant)

    def _start_held(self, now: datetime) -> None:
        while self._held and self._held[0].instant <= now:
            self._held.pop(0).start()

    def _claim_rest(self, now: datetime) -> None:
        """Claim, once their grace passed, the jobs other replicas left unclaimed (and
        small instants, whole, at their instant)."""
        while self._rest and self._rest[0].at <= now:
            rest = self._rest.pop(0)
            states = rest.states
            if rest.whole:
                self.claim(rest.instant, states, then=self._claimed_whole(rest.instant, states))
                continue
            sync = [state for state in states if not state.job.is_async]
            if sync and not rest.deferred and self._workers_saturated():
                # Every thread is busy: let replicas with free threads take the sync jobs
                # first, and take what they leave one grace later. Left alone, a job in
                # nobody's share (views that disagree) would miss its instant.
                self._add_rest(_Rest(rest.at + _GRACE, rest.instant, sync, deferred=True))
                states = [state for state in states if state.job.is_async]
            if states:
                then = functools.partial(self.peers.claimed_rest, rest.instant)
                self.claim(rest.instant, states, then=then)

    def _drop_rest(self) -> None:
        """Draining: forget the rest of past instants; hand on rounds won ahead."""
        for rest in self._rest:
            for state in rest.states:
                self.schedule_after(state, rest.instant)
        self._rest.clear()
        for held in self._held:
            held.drop()
        self._held.clear()

    # -- worker threads -------------------------------------------------------------------

    def _workers_saturated(self) -> bool:
        """Whether every worker thread is taken by a sync round in flight (or being claimed).

        A sync round holds a thread from its start until its end, leased or per-instance;
        async rounds run on the loop and take none.
        """
        in_flight = sum(1 for run in self.runs if not run.ended and not run.state.job.is_async)
        return in_flight + self._claiming_sync >= self.runner.max_workers

    def _refuse_sync(self, instant: datetime, states: list[JobState]) -> list[JobState]:
        """Leave ``instant`` of the sync jobs in ``states`` unclaimed; return the others.

        Claimed now they would only wait in the queue, holding (and renewing) leases that
        keep every other replica from running them. Left unclaimed, another replica's
        claim of the same instant takes them.
        """
        refused = [state for state in states if not state.job.is_async]
        if refused:
            log.warning(
                "instant %s of job(s) %s not claimed on this replica: all %d worker "
                "thread(s) are busy (another replica may run it)",
                instant.isoformat(),
                ", ".join(repr(state.job.name) for state in refused),
                self.runner.max_workers,
            )
            for state in refused:
                self.schedule_after(state, instant)
        return [state for state in states if state.job.is_async]

    # -- claims ---------------------------------------------------------------------------

    def claim(
        self,
        instant: datetime,
        states: list[JobState],
        *,
        reason: Reason = Reason.SCHEDULE,
        then: Callable[[set[str]], None] | None = None,
        lost_later: bool = False,
    ) -> None:
        """Claim ``instant`` for ``states`` in one statement, then start what was won
        (a round won ahead of its instant starts at the instant).

        ``then`` is told the names won, when the database answered, before their rounds
        start. A claim the database could not answer leaves the instant owed: recovery
        catches it up once the database answers again (unless a later instant came first).
        With ``lost_later`` (a share claimed ahead of its instant), jobs not won are
        claimed once more with the rest of the instant (see :meth:`_claim_later`).
        """
        names = [state.job.name for state in states]
        issued, claimed_at = self._clock.now(), self._clock.monotonic()
        catch_up = reason is not Reason.SCHEDULE
        sync = sum(1 for state in states if not state.job.is_async)
        self._claiming_sync += sync

        def done(result: lease.ClaimBatch | BaseException) -> None:
            self._claiming_sync -= sync
            won: set[str] = set()
            if isinstance(result, BaseException):
                log.error(
                    "claiming %s for %d job(s) failed: %s", instant.isoformat(), len(names), result
                )
                if isinstance(result, lease.DatabaseUnavailable):
                    self.recovery.database_lost()
            else:
                won = set(result.names)
                self.recovery.database_answered()
                if len(won) < len(names):
                    self.recovery.sweeper.claims_missed([n for n in names if n not in won], instant)
                if then is not None:
                    then(won)
            late = too_late(claimed_at, self._clock.monotonic())
            ahead = instant > self._clock.now()
            # Jobs of a share claimed ahead that it did not win: claimed again later.
            retry = (
                lost_later
                and not isinstance(result, BaseException)
                and not self.draining
                and not self._flags.stopped
            )
            claimed: list[JobState] = []
            lost: list[JobState] = []
            for state in states:
                if state.job.name in won:
                    claimed.append(state)
                elif retry:
                    lost.append(state)
                else:
                    self.schedule_after(state, max(instant, issued) if catch_up else instant)
            batch = None if isinstance(result, BaseException) else result
            if batch is not None and claimed:
                if late or self.draining or self._flags.stopped:
                    # The drain began meanwhile, or the claim came back too late: hand the
                    # instant on.
                    for state in claimed:
                        self._hand_on(state, batch, claimed_at, late=late)
                        self.schedule_after(state, max(instant, issued) if catch_up else instant)
                    claimed = []
                else:
                    self._report_claimed(claimed, batch, reason)
            if lost and not self._claim_later(instant, lost):
                for state in lost:
                    self.schedule_after(state, instant)
            if not claimed:
                return
            assert batch is not None
            rounds: list[tuple[JobState, int | None]] = [(state, batch.token) for state in claimed]
            start = functools.partial(
                self.start_rounds, rounds, instant, attempt=1, claimed_at=claimed_at, reason=reason
            )
            if ahead:  # claimed ahead: the rounds start together, on time
                drop = functools.partial(self._unhold, claimed, batch.token, instant)
                self._hold(_Held(instant, start, drop))
            else:
                start()

        self._control.run(
            lambda: self._store.claim_batch(names, instant, self._replica_id),
            done,
            self.give_back,
        )

    def _hand_on(
        self, state: JobState, batch: lease.ClaimBatch, claimed_at: float, *, late: bool
    ) -> None:
        """Give back the lease of a round just won that will not run here."""
        if late:
            log.warning(
                "job %r: the claim of %s came back %.1f s after it was sent, when its "
                "lease may be lost already: given back, not run here",
                state.job.name,
                batch.instant.isoformat(),
                self._clock.monotonic() - claimed_at,
            )
        self.hand_back(state.job.name, batch.token)

    def _report_claimed(
        self, claimed: list[JobState], batch: lease.ClaimBatch, reason: Reason
    ) -> None:
        """Log what a claim that is kept says: the unfinished rounds it gave up, and, for
        a catch-up, each round caught up (counted too)."""
        instant = batch.instant.isoformat()
        for name, (old_instant, old_attempt) in batch.superseded.items():
            log.warning(
                "job %r: the unfinished round of %s (attempt %d) is given up: "
                "instant %s started first",
                name,
                old_instant.isoformat(),
                old_attempt,
                instant,
            )
        if reason is Reason.SCHEDULE:
            return
        for state in claimed:
            state.metrics.caught_up(reason.text)
            log.info(
                "job %r: catching up instant %s%s",
                state.job.name,
                instant,
                " after the database outage" if reason is Reason.OUTAGE else "",
            )

    def hand_back(self, name: str, token: int) -> None:
        """Give back a lease won just as the scheduler began to drain."""
        self._control.run(lambda: self._store.give_back(name, token), lambda _result: None)

    def give_back(self, claims: lease.ClaimBatch | lease.Claim | None) -> None:
        """Give back leases won after the dispatcher has gone (on the control thread)."""
        if isinstance(claims, lease.ClaimBatch):
            won = claims.claims()
        else:
            won = [claims] if claims else []
        for claim in won:
            try:
                self._store.give_back(claim.name, claim.token)
            except lease.LeaseError as exc:
                log.warning("job %r: giving back a lease won at stop failed: %s", claim.name, exc)

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
        """Start the round of ``state``'s job for ``instant``.

        ``token`` is its lease's (``None`` for a per-instance round), claimed at the
        monotonic time ``claimed_at``.
        """
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
        """:meth:`start_round` for each ``(state, token)`` of ``rounds``, handed to the
        worker threads :data:`START_BATCH` at a time (the rounds one claim won): one lock
        per batch, and the first rounds run while the next are built."""
        for first in range(0, len(rounds), START_BATCH):
            runs: list[Run] = []
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
                    self._not_started(run, instant)

    def _not_started(self, run: Run, instant: datetime) -> None:
        """Hand on a round no thread could run: its lease back, its schedule kept."""
        state, token = run.state, run.token
        if state.run is run:
            state.run = None
        if token is not None:
            self._control.run(
                lambda: self._store.give_back(state.job.name, token), lambda _result: None
            )
        self.schedule_after(state, instant)

    def start_manual(
        self, state: JobState, request: lease.TriggerRow, *, token: int | None, claimed_at: float
    ) -> None:
        """Start the manual round ``request`` asked for, taken with ``token`` (``None`` for
        a per-instance job). It leaves the job's schedule alone: its next instant stays
        in the heap, and its end schedules nothing."""
        run = self.runner.prepare(
            state,
            request.requested,
            attempt=request.attempt + 1,
            token=token,
            claimed_at=claimed_at,
            reason=Reason.MANUAL,
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
        """:meth:`round_ended` for each of ``ends``."""
        for run, ended in ends:
            self.round_ended(run, ended)

    def round_ended(self, run: Run, ended: datetime) -> None:
        """``run`` ended at ``ended`` and its end is settled: schedule the job's next instant
        (not after a manual round: the schedule never moved for it). An attempt that
        ended ``retrying`` keeps its lease and waits for its retry instead."""
        if run.outcome is Outcome.RETRYING:
            self.runs.discard(run)
            if self.policies.backoff(run, ended):
                self.summary.ended(run.outcome, self._clock.monotonic())
                return
        self._forget(run)
        if run.request is not None:
            return
        state = run.state
        if state.run is run:
            state.run = None
        self.summary.ended(run.outcome, self._clock.monotonic())
        if not self._flags.stopped:
            schedule = state.job.schedule
            started = run.started_at or run.ctx.instant
            first = schedule.next(started)
            if first is not None and started <= ended < first:
                # The common case, no instant overrun: the first instant after the start
                # is the first after the end too (one schedule step per round, not two).
                self.schedule_after(state, ended, when=first)
                return
            state.metrics.overrun(schedule, started, ended)
            self.schedule_after(state, ended)

    def _forget(self, run: Run) -> None:
        self.runs.discard(run)
        if run.token is not None:
            self.keeper.release(run)

    def begin_drain(self) -> None:
        """Stop starting rounds and cancel the running ones with :class:`Shutdown`."""
        if self.draining:
            return
        self.draining = True
        self.policies.drain()
        for run in list(self.runs):
            self.runner.cancel(run, Shutdown(f"job {run.ctx.name!r}: the scheduler is draining"))
