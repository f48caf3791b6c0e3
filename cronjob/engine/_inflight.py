"""The rounds in flight: started in batches, ended, handed on when no thread takes them.

The dispatcher's heap says when an instant is due and its claims win the leases; this
part starts the rounds won (`InFlight.start_rounds`: each round built, counted in
flight, its lease held by the keeper, handed to the runner `START_BATCH` at a time), a
manual round a request asked for (`InFlight.start_manual`), and takes each end back
(`InFlight.round_ended`, posted by the round's thread or the finisher's): the retry's
backoff (``_policies``), or what follows (``_overlap``: the job's next instant in the
heap, or an instant claimed at once).

Dispatcher thread only, except `InFlight.post_round_started` and
`InFlight.post_rounds_ended`, which post to it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from datetime import datetime

import lease

from .._clock import Clock
from .._exceptions import Shutdown
from .._policy import Overlap
from .._round import Outcome
from ._control import Control, Inbox
from ._giveback import GiveBacks
from ._keeper import LeaseKeeper
from ._overlap import NextRounds
from ._policies import PolicyTimers
from ._ports import Timetable
from ._runner import RoundRunner, Start
from ._state import Flags, JobState, Reason, Run
from ._summary import RoundSummary
from ._wings import Wing

__all__ = ["START_BATCH", "InFlight"]

log = logging.getLogger("cronjob")

#: Rounds of one claim handed to the worker threads at a time (see start_rounds).
START_BATCH = 128


class InFlight:
    """Owns the rounds in flight on this replica: starts them, takes their ends.

    Args:
        clock: The scheduler's clock.
        store: The lease store (a manual round that never ran is ended on record).
        control: Runs that statement.
        inbox: The dispatcher's: the ends and starts are posted there.
        flags: The scheduler's life flags.
        timetable: The heap a job goes back to (a round handed on).
        summary: Counts the rounds started and ended (the dispatcher logs it).

    The façade then wires in the parts it calls (`runner`, `keeper`, `policies`,
    `next_rounds`, `give_backs`, `wings`) before the dispatcher thread starts.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        inbox: Inbox,
        flags: Flags,
        timetable: Timetable,
        summary: RoundSummary,
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._inbox = inbox
        self._flags = flags
        self._timetable = timetable
        #: The rounds started and ended, logged once a minute (their own lines are DEBUG).
        self.summary = summary
        #: The rounds in flight on this replica.
        self.runs: set[Run] = set()
        self.runner: RoundRunner
        self.keeper: LeaseKeeper
        #: The jobs' timeouts and retry backoffs (see ``_policies``).
        self.policies: PolicyTimers
        #: What follows a round's end; the rounds ``cancel_other`` supersedes.
        self.next_rounds: NextRounds
        #: Gives back the leases of rounds that will not run here.
        self.give_backs: GiveBacks
        #: Told of each request's round that ended (a backfill's next instant).
        self.wings: Sequence[Wing] = ()

    # -- starting -------------------------------------------------------------------------

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
                self.give_backs.give_back_names(names, token)
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
            self._timetable.schedule_after(state, instant)
        for token, names in given.items():
            self.give_backs.give_back_names(names, token)

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

    # -- ending ---------------------------------------------------------------------------

    def post_round_started(self, run: Run) -> None:
        """Tell the dispatcher thread that ``run``'s round (of a job with a policy) started,
        from the round's thread: its timeout is timed from then."""
        self._inbox.post(functools.partial(self.policies.watch, run))

    def post_rounds_ended(self, ends: list[tuple[Run, datetime]]) -> None:
        """Tell the dispatcher thread that each ``run`` ended at its ``ended`` (from the
        round's thread, or the finisher's), in one message."""
        self._inbox.post(lambda: self.rounds_ended(ends))

    def rounds_ended(self, ends: list[tuple[Run, datetime]]) -> None:
        """`round_ended` for each of ``ends``; the claims of the instants that follow them
        made together, one per instant (`NextRounds.batched`)."""
        with self.next_rounds.batched():
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
            for wing in self.wings:  # a backfill's next instant may be taken now
                wing.request_ended(run.request)
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

    def cancel_all(self) -> None:
        """The scheduler drains: cancel every round in flight with
        [Shutdown][cronjob.Shutdown]."""
        for run in list(self.runs):
            self.runner.cancel(run, Shutdown(f"job {run.ctx.name!r}: the scheduler is draining"))
