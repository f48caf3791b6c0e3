"""What follows a round's end: the job's ``overlap`` and ``catch_up`` policies.

An instant that falls while a round of its job runs (see [Policy][cronjob.Policy]):

- ``overlap="skip"`` (the seed's rule): skipped. Another replica's claim of it is refused
  (the lease is held); the replica running the round schedules the job after its end,
  and the lease row's ``skipped_through`` keeps the overrun on record.
- ``"buffer_one"``: the first such instant waits, the later ones are skipped. As the
  round ends, the replica that ran it claims that instant, at once, under the same rule as
  any claim (one claim per instant: the row's instant older, its lease free). A round
  whose replica died (or drained) while it ran ends with its second run, on whichever
  replica's sweep takes it: that replica then claims the first instant after the round's
  own, if it has come, as buffered (nothing else knew it waited).
- ``"cancel_other"``: at the first instant after a round's start, the replica running it
  cancels it with [Superseded][cronjob.Superseded]; as it ends, that replica claims the
  latest instant that fell while it ran. A round that ignores its cancellation keeps its
  lease: the newer instant waits for its end and never runs beside it.

Each decision reads the round's pinned descriptor (see `cronjob.engine._pinned`): the
policy it was claimed with. A schedule made of data changed while its round ran governs
only the instants after the change: one of its new timing from before the change is
never buffered nor superseding, the old timing's instants are not caught up. One removed
meanwhile has no instant after: its round is never superseded, nothing follows it.

A hand-off (a job that publishes its instants) skips none of them, whatever its
policy: the latest that fell while its round held the lease is claimed as it ends, and
that round owes the earlier ones (see `cronjob.engine._owed`).

Only the replica running the round acts: it alone knows when the round ends, and
every instant that falls meanwhile is refused to the others by the lease. A follow-up
claim that finds a later instant already claimed (another replica's claim came between
the end and the follow-up) wins nothing: the job goes on from that later instant. The
follow-ups of ends handled together (the finisher's batch) are claimed together, one
claim per instant (`NextRounds.batched`).

``catch_up="all"``: a round run late (a catch-up after a start or an outage, or the second
run of a round cut short) is followed at once by the job's next instant when that is due
already and within ``catch_up_window``: the missed instants run oldest first, one at a
time, each on record (``why=catch-up``). A drain stops the chain: the second run of a
round it cut short goes on with it on another replica, and the next start's catch-up
takes what is left (the row's instant says how far it went: nothing runs twice).

Dispatcher thread only.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Callable, Collection, Iterator
from datetime import datetime, timedelta

import lease

from .._clock import Clock
from .._exceptions import Cancelled, Superseded
from .._policy import CatchUp, Overlap
from .._registry import Job
from .._round import Outcome
from ._committed import owed_from
from ._owed import first_kept, owe_overrun, publishes
from ._ports import Claimer, Starter, Timetable
from ._state import JobState, Reason, Run

__all__ = ["NextRounds", "oldest_owed"]

#: Rounds run late: under ``catch_up="all"`` the next instant, if due already, follows.
_LATE = frozenset({Reason.CATCH_UP, Reason.OUTAGE, Reason.RERUN})
_TICK = timedelta(microseconds=1)


class NextRounds:
    """Decides what follows a round's end, and supersedes rounds of ``cancel_other`` jobs.

    Args:
        timetable: The heap a job's next instant goes back to.
        starter: Starts a per-instance job's round that follows at once.
        claims: Claims a leased job's instant that follows at once.
        runs: The rounds in flight (a watched round no longer among them has ended).
        cancel: Cancels a round (the runner's), with the exception it is cancelled with.
        clock: The scheduler's clock.
    """

    def __init__(
        self,
        *,
        timetable: Timetable,
        starter: Starter,
        claims: Claimer,
        runs: Collection[Run],
        cancel: Callable[[Run, Cancelled], None],
        clock: Clock,
    ) -> None:
        self._timetable = timetable
        self._starter = starter
        self._claims = claims
        self._runs = runs
        self._cancel = cancel
        self._clock = clock
        #: Rounds of ``cancel_other`` jobs by the instant that supersedes them.
        self._watched: list[tuple[datetime, int, Run]] = []
        self._seq = itertools.count()
        #: Inside `batched`: the follow-up claims put off to its end, by instant and reason
        #: (each job once, by identity, in the order of its end).
        self._pending: dict[tuple[datetime, Reason], dict[int, JobState]] | None = None

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Put off the follow-up claims of the ends handled in the block to its end, then
        claim each instant once for every job it follows: rounds that ended together (the
        finisher's batch) and are followed at the same instant, such as the hand-offs of
        one period that all ran over it, are claimed in one statement, as their instant's
        first claim was, not in one a job. Each job is taken off the timetable at once, as
        without the block; the claims are made even if handling an end raised."""
        if self._pending is not None:  # already inside one
            yield
            return
        self._pending = {}
        try:
            yield
        finally:
            pending, self._pending = self._pending, None
            for (instant, reason), states in pending.items():
                self._claims.claim(instant, list(states.values()), reason=reason)

    def watch(self, run: Run) -> None:
        """``run`` (of a ``cancel_other`` job) starts: supersede it if it still runs at
        the job's first instant after now."""
        when = run.pinned.schedule.next(max(run.ctx.instant, self._clock.now()))
        if when is not None:
            heapq.heappush(self._watched, (when, next(self._seq), run))

    def retimed(self, run: Run) -> None:
        """The timing of ``run``'s schedule changed while it runs: a ``cancel_other``
        round is superseded at the new timing's first instant after the change too, not
        only when the instant it was watched for comes (see `tick`)."""
        if run.pinned.policy.overlap is Overlap.CANCEL_OTHER and not run.ended:
            when = run.state.job.schedule.next(self._clock.now())
            if when is not None:
                heapq.heappush(self._watched, (when, next(self._seq), run))

    def next_wake(self) -> datetime | None:
        """When a watched round is due to be superseded (wall clock); ``None``: none."""
        return self._watched[0][0] if self._watched else None

    def tick(self, now: datetime) -> None:
        """Cancel, with [Superseded][cronjob.Superseded], each watched round still running
        at an instant of its job that has come."""
        while self._watched and self._watched[0][0] <= now:
            when, _seq, run = heapq.heappop(self._watched)
            if run.ended or run not in self._runs or run.state.retired:
                continue  # over, or its schedule removed: no instant of it comes
            since = _changed_since(run)
            if since is not None:  # only an instant of its new timing, after the change
                real = run.state.job.schedule.next(since)
                if real is None:
                    continue
                if real > now:
                    heapq.heappush(self._watched, (real, next(self._seq), run))
                    continue
                when = real
            self._cancel(
                run,
                Superseded(
                    f"job {run.ctx.name!r}: its instant {when.isoformat()} came while the "
                    f"round of {run.ctx.instant.isoformat()} ran (overlap=cancel_other)"
                ),
            )

    def after(self, run: Run, ended: datetime) -> None:
        """``run`` (not a manual round) ended at ``ended``, its end settled, the scheduler
        not stopped: schedule the job's next instant, or claim at once the instant its
        policy says follows (buffered, superseding, or the next one caught up)."""
        timetable = self._timetable
        state = run.state
        if run.outcome is Outcome.CUT_SHORT and run.token is not None and run.ctx.attempt == 1:
            state.pinned = run.pinned  # its second run, if this replica wins it, runs as it
        if state.retired:  # removed: nothing follows
            timetable.schedule_after(state, ended)
            return
        # The round's own policy decides; the instants to come are the schedule's as it is
        # now, from its change if it changed while the round ran.
        schedule = state.job.schedule
        instant = run.ctx.instant
        policy = run.pinned.policy
        since = _changed_since(run)
        late = run.reason in _LATE and since is None  # the old timing's: not caught up
        if policy.catch_up is CatchUp.ALL and late and not timetable.draining:
            due, now = schedule.next(instant), self._clock.now()
            if due is not None and due <= now and now - due <= policy.catch_up_window:
                why = Reason.OUTAGE if run.reason is Reason.OUTAGE else Reason.CATCH_UP
                self._follow(state, due, why)
                return
        overlap = policy.overlap
        rerun = run.reason is Reason.RERUN and since is None
        handoff = since is None and publishes(state.job)
        if rerun and overlap is Overlap.BUFFER_ONE and not timetable.draining and not handoff:
            # The round's first run died with its replica, or a drain cut it short there:
            # the instant buffered meanwhile was known to that replica alone. The round
            # ran from its first start to this end, so the first instant after its own
            # that has come is the one that waits (no claim took it: a later claim would
            # have superseded this second run).
            buffered = schedule.next(instant)
            if buffered is not None and buffered <= ended:
                state.metrics.overrun(schedule, buffered, ended)
                self._follow(state, buffered, Reason.OVERLAP)
                return
        started = run.started_at or instant
        if since is not None:  # for the new timing, the round began at the change
            started = max(started, since)
            first = schedule.next(started)
        else:  # the next after the instant, as its claim asked (no instant lies between)
            first = state.next_after(instant) if started >= instant else schedule.next(started)
        if first is not None and started >= first:
            first = schedule.next(started)
        if handoff:  # from its claim on, not its start: a late round's lease came first
            first = first_kept(run, self._clock.now(), self._clock.monotonic())
        if first is not None and started <= ended < first:
            # The common case, no instant overrun: the first instant after the start
            # is the first after the end too (one schedule step per round, not two).
            timetable.schedule_after(state, ended, when=first)
            return
        if handoff and first is not None and not timetable.draining:
            # A hand-off skips no instant: the claims of those that fell while it ran
            # were refused, and only this replica knows (see cronjob.engine._owed).
            self._follow(state, owe_overrun(state, first, ended), Reason.OVERLAP)
            return
        if first is None or overlap is Overlap.SKIP or timetable.draining:
            state.metrics.overrun(schedule, started, ended)
            timetable.schedule_after(state, ended)
            return
        if overlap is Overlap.BUFFER_ONE:
            follow = first  # the first that fell while it ran waits; the later are skipped
            state.metrics.overrun(schedule, first, ended)
        else:  # the latest that fell while it ran supersedes the others too
            follow = schedule.prev(ended + _TICK) or first
            state.metrics.overrun(schedule, started, follow - _TICK)
        self._follow(state, follow, Reason.OVERLAP)

    def _follow(self, state: JobState, instant: datetime, reason: Reason) -> None:
        """Claim ``instant`` of ``state``'s job now (a per-instance job: start it)."""
        self._timetable.take(state)
        if state.job.leased:
            if self._pending is None:
                self._claims.claim(instant, [state], reason=reason)
                return
            self._pending.setdefault((instant, reason), {})[id(state)] = state
        else:
            self._starter.start_round(
                state,
                instant,
                attempt=1,
                token=None,
                claimed_at=self._clock.monotonic(),
                reason=reason,
            )


def _changed_since(run: Run) -> datetime | None:
    """When this replica saw the timing of ``run``'s schedule change, if it changed since
    the round was claimed (its descriptor's schedule is not the state's); else ``None``."""
    state, pinned = run.state, run.pinned
    if state.job is pinned.job or state.job.schedule == pinned.schedule:
        return None
    return state.changed or pinned.instant


def oldest_owed(job: Job, row: lease.LeaseRow, latest: datetime, now: datetime) -> datetime:
    """The oldest instant ``job`` (``catch_up="all"``) is owed, ``latest`` being the most
    recent one owed: the first after what its row says ran, was overrun, or came before
    its deployment (a schedule made of data: its commit, see `owed_from`), and within its
    ``catch_up_window`` of ``now``."""
    bounds = [now - job.policy.catch_up_window - _TICK]
    since = owed_from(row)
    if row.instant is not None:
        bounds.append(row.instant)
        if job.task is not None and since is not None:
            bounds.append(since)  # a schedule made of data, changed since
    elif since is not None:
        bounds.append(since)
    if row.skipped_through is not None:
        bounds.append(row.skipped_through)
    first = job.schedule.next(max(bounds))
    return first if first is not None and first <= latest else latest
