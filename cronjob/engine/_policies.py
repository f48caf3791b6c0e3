"""Job policies at run time: the timeouts of running rounds and the backoffs of retries.

Both are timers on the dispatcher thread (one heap, on the clock's monotonic time), never
a thread per round: the dispatcher wakes at the earliest of them as it does for its other
deadlines (see `PolicyTimers.next_wake`).

- **timeout**: a round of a job with a ``timeout`` tells the dispatcher when it started
  (`PolicyTimers.watch`, through the inbox); still running ``timeout`` seconds
  later, it is cancelled with [TimedOut][cronjob.TimedOut] and, if leased, its lease row
  is marked so that it never runs a second time. Still running `TIMEOUT_GRACE`
  seconds after that, a leased round ends the process as a round outliving its lost
  lease does (the keeper's forced exit): its lease is still renewed until then, so no
  other replica can run the job alongside it, and the job runs again once the lease
  expires. A per-instance round (no lease, nothing shared) is logged as critical and
  left to its thread; its job's next instant waits for it, as for any round still running.
  A round in a child process (``isolation="process"``) has its child killed instead, and
  the process lives on (see `cronjob.engine._isolated`).
- **retries**: an attempt that failed with attempts left ends ``retrying`` (its worker
  decides, see ``RoundRunner._police``); once its end is on record the dispatcher hands
  it here (`PolicyTimers.backoff`) and the next attempt starts when its delay has
  passed, for the same instant, under the same lease (kept by the keeper meanwhile),
  unless the job's next instant is due by then, the lease was lost, or the scheduler
  began to drain: then the round is given up, on record.

The other policy, ``start_deadline``, needs no timer: the round's worker checks it as the
round would start (``RoundRunner._missed``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final, NamedTuple

import lease

from .._clock import Clock
from .._exceptions import Cancelled, TimedOut
from .._policy import RETRY_BACKOFF_CAP
from ._control import Control
from ._decided import DecidedEnds, error_summary
from ._keeper import LeaseKeeper
from ._ports import Starter, Timetable
from ._state import Flags, Reason, Run

__all__ = ["TIMEOUT_GRACE", "PolicyTimers", "backoff_delay"]

log = logging.getLogger("cronjob")

#: Seconds a round may go on after its timeout cancelled it before a leased one ends the
#: process (as `cronjob.engine._keeper.EXIT_AFTER_LOST` after a lost lease).
TIMEOUT_GRACE: Final = 5.0

#: The source of the retries' full jitter (tests seed it or replace it).
JITTER = random.Random()

_TIMEOUT, _ESCALATE, _RETRY = 0, 1, 2


def backoff_delay(backoff: timedelta, retry: int) -> float:
    """The delay before the ``retry``-th retry (1 for the first): full jitter, a uniform
    draw up to ``backoff * 2**(retry-1)``, capped at `RETRY_BACKOFF_CAP`."""
    ceiling = min(RETRY_BACKOFF_CAP, backoff.total_seconds() * 2.0 ** min(retry - 1, 64))
    return JITTER.uniform(0.0, ceiling)


class _Timer(NamedTuple):
    """One deadline of a round; ordered by ``(when, seq)`` (``seq`` is unique)."""

    when: float  # monotonic
    seq: int
    run: Run
    kind: int


class PolicyTimers:
    """The timeouts and retry backoffs of this replica's rounds (dispatcher thread only).

    Args:
        timetable: The heap a given-up round's job goes back to.
        starter: Starts the retries.
        cancel: Cancels a round that outlived its timeout (the runner's).
        decided: Records the ends the policies decide (the runner's end recorder's).
        keeper: Keeps the leases of rounds between attempts; ends the process.
        clock: The scheduler's clock.
        store: The lease store (marks, give-backs, late give-ups; on ``control``).
        control: Where statements run.
        flags: The scheduler's life flags.
    """

    def __init__(
        self,
        *,
        timetable: Timetable,
        starter: Starter,
        cancel: Callable[[Run, Cancelled], None],
        decided: DecidedEnds,
        keeper: LeaseKeeper,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        flags: Flags,
    ) -> None:
        self._timetable = timetable
        self._starter = starter
        self._cancel = cancel
        self._decided = decided
        self._keeper = keeper
        self._clock = clock
        self._store = store
        self._control = control
        self._flags = flags
        self._timers: list[_Timer] = []
        self._seq = itertools.count()
        #: Rounds waiting for their retry, with the job's next instant (none after it).
        self._backoffs: dict[Run, datetime | None] = {}

    def next_wake(self) -> float | None:
        """The earliest monotonic time `tick` has something to do, or ``None``."""
        while self._timers and not self._current(self._timers[0]):
            heapq.heappop(self._timers)
        return self._timers[0].when if self._timers else None

    def tick(self, mono: float) -> None:
        """Act on the timers due by monotonic time ``mono``."""
        while self._timers and self._timers[0].when <= mono:
            timer = heapq.heappop(self._timers)
            if not self._current(timer):
                continue
            if timer.kind == _TIMEOUT:
                self._time_out(timer.run, mono)
            elif timer.kind == _ESCALATE:
                self._escalate(timer.run)
            else:
                self._retry(timer.run)

    def _push(self, when: float, run: Run, kind: int) -> None:
        heapq.heappush(self._timers, _Timer(when, next(self._seq), run, kind))

    @staticmethod
    def _current(timer: _Timer) -> bool:
        """Whether the round is still where the timer was set for it."""
        run = timer.run
        if timer.kind == _RETRY:
            return run.backoff
        return not run.ended

    # -- timeouts -------------------------------------------------------------------------

    def watch(self, run: Run) -> None:
        """``run``'s round started (at ``run.started_mono``): time it out if its job has a
        timeout (the runner posts this for every round of a job with a policy)."""
        timeout = run.pinned.timeout
        if timeout is not None and not run.ended:
            self._push(run.started_mono + timeout, run, _TIMEOUT)

    def _time_out(self, run: Run, mono: float) -> None:
        ctx, timeout = run.ctx, run.pinned.timeout
        assert timeout is not None
        cause = TimedOut(f"job {ctx.name!r}: the round ran past its timeout of {timeout:g} s")
        if ctx.cause is not None:
            return  # cancelled already (a drain, a lost lease): that ending stands
        log.warning(
            "job %r instant %s attempt %d: still running %g s after it started, its "
            "timeout: cancelling the round",
            ctx.name,
            ctx.instant.isoformat(),
            ctx.attempt,
            timeout,
        )
        self._cancel(run, cause)
        token = run.token
        if token is not None and not self._flags.crashed:
            # Never run a second time, even if this process ends before the round does.
            name, store = ctx.name, self._store
            self._control.run(lambda: store.keep_from_rerun(name, token), _ignore)
        self._push(mono + TIMEOUT_GRACE, run, _ESCALATE)

    def _escalate(self, run: Run) -> None:
        """The round ignored its timeout's cancellation for `TIMEOUT_GRACE`."""
        ctx = run.ctx
        if not isinstance(ctx.cause, TimedOut) or self._flags.crashed:
            return
        where = f"job {ctx.name!r} instant {ctx.instant.isoformat()} attempt {ctx.attempt}"
        if run.child is not None:
            # A round in a child process: the child is killed, the replica lives on.
            log.error("%s: the round's child process still runs: SIGKILL", where)
            run.child.kill()
            return
        if run.token is None:
            log.critical(
                "%s: the round is still running %g s after its timeout cancelled it; a "
                "per-instance round holds no lease, so it is left to its thread: the job's "
                "next instant on this replica waits until it returns",
                where,
                TIMEOUT_GRACE,
            )
            return
        message = (
            f"{where}: the round is still running {TIMEOUT_GRACE:g} s after its timeout "
            f"({run.pinned.timeout:g} s) cancelled it; its lease ends with the process, "
            "then the job runs again"
        )
        ends, keeper = self._decided, self._keeper
        if run.request is not None:
            # A manual round's end is its request's to record, and its lease row's
            # instant, attempt and state are the schedule's: the exit alone, as before.
            keeper.force_exit(run, message)
            return

        def done(result: bool | BaseException | None) -> None:
            if result is None or self._flags.crashed:
                return  # the job ended meanwhile, on its own record; or the exit came first
            keeper.force_exit(run, message, settle=ends.settle_hooks)

        # timed_out on record first (the self-pause and the hook see it), then the exit.
        # The lease is renewed meanwhile; should the database not answer, the keeper's
        # own loss and exit deadlines end the process all the same.
        self._control.run(lambda: ends.record_outlived(run), done)

    # -- retries --------------------------------------------------------------------------

    def backoff(self, run: Run, ended: datetime) -> bool:
        """Wait out ``run``'s retry delay (its attempt ended ``retrying`` at ``ended``
        and is on record), then start the next attempt.

        The delay runs from now, as this is told: should the retry then start at or
        after the job's next instant (a slow record of the end, a clock stepped), it is
        given up at once, the round on record as failed (see `_give_up_failed`).

        Returns:
            ``False`` when the retry does not happen and the round ends now (the
            scheduler is draining or stopped, or the lease was lost): it was given up
            here (its lease given back) and the caller ends it as any other. ``True``
            when the round is this part's until its retry starts or it is given up.
        """
        delay, timetable = run.retry_delay, self._timetable
        if delay is None or self._flags.stopped or timetable.draining or run.lost_at:
            why = None
            if timetable.draining:
                why = "the scheduler is draining"
            elif run.lost_at:
                why = "its lease was lost"
            self._give_up(run, why)
            return False
        due = run.pinned.schedule.next(ended)
        if due is not None and self._clock.now() + timedelta(seconds=delay) >= due:
            self._give_up_failed(run, due)
            return True
        run.backoff = True
        self._backoffs[run] = due
        self._push(self._clock.monotonic() + delay, run, _RETRY)
        return True

    def _retry(self, run: Run) -> None:
        due = self._backoffs.pop(run, None)
        run.backoff = False
        ctx, state = run.ctx, run.state
        if run.lost_at is not None:
            self._give_up(run, "its lease was lost")
            self._end(run)
            return
        if due is not None and self._clock.now() >= due:
            self._give_up_failed(run, due)
            return
        run.retry_error = None  # the next attempt runs: its failure's frames are not kept
        # It runs as the round was claimed, whatever became of its schedule since (changed,
        # removed): its descriptor goes on to the next attempt.
        state.pinned = run.pinned
        self._starter.start_round(
            state,
            ctx.instant,
            attempt=ctx.attempt + 1,
            token=run.token,
            claimed_at=run.renewed_at,
            reason=Reason.RETRY,
        )
        if run.token is not None:
            self._keeper.release(run)  # after the next attempt holds the lease

    def _give_up_failed(self, run: Run, due: datetime) -> None:
        """Give up a retry that would start at or after the job's next instant ``due``:
        the round is on record as failed (with its history row, counted by the
        self-pause, told to the failure hook), then ends."""
        ctx, failure = run.ctx, _last_failure(run)
        log.warning(
            "round of job %r instant %s: its retry (attempt %d) is given up: the job's "
            "next instant %s is due",
            ctx.name,
            ctx.instant.isoformat(),
            ctx.attempt + 1,
            due.isoformat(),
            exc_info=failure,
        )
        if run.token is None or self._flags.crashed:
            self._end(run)
            return
        ends = self._decided
        error = f"retry given up: the next instant {due.isoformat()} is due"
        if failure is not None:  # what the hook and the history most need to tell
            error = f"{error}; attempt {ctx.attempt}: {error_summary(failure)}"
        run.backoff = True  # the lease is still kept, until the end is on record

        def done(_result: object) -> None:
            run.backoff = False
            self._end(run)

        self._control.run(lambda: ends.record_given_up_retry(run, error), done)

    def drain(self) -> None:
        """The scheduler began to drain: every retry still waiting is given up."""
        for run in list(self._backoffs):
            del self._backoffs[run]
            run.backoff = False
            self._give_up(run, "the scheduler is draining")
            self._end(run)

    def _give_up(self, run: Run, why: str | None) -> None:
        """Give back the lease of a round whose retry will not start: on record as given
        up (its row's attempt is 2 already), free for the job's next instant at once.
        With ``why`` (logged), the attempt that never started is in the history too, as
        ``'given up'``, its lease lost or not (see `DecidedEnds.record_given_up`)."""
        ctx, token = run.ctx, run.token
        if why is not None:
            failure = _last_failure(run)
            log.warning(
                "round of job %r instant %s: its retry (attempt %d) is given up: %s",
                ctx.name,
                ctx.instant.isoformat(),
                ctx.attempt + 1,
                why,
                exc_info=failure,
            )
            if token is None or self._flags.crashed:
                return
            # On record, as every attempt given up: `cronjob history --failed` shows it.
            error = f"retry given up: {why}"
            if failure is not None:
                error = f"{error}; attempt {ctx.attempt}: {error_summary(failure)}"
            ends, lost = self._decided, run.lost_at is not None
            self._control.run(lambda: ends.record_given_up(run, error, lost=lost), _ignore)
            return
        if token is None or run.lost_at is not None or self._flags.crashed:
            return
        name, store = ctx.name, self._store
        self._control.run(lambda: store.give_back(name, token), _ignore)

    def _end(self, run: Run) -> None:
        """The round is over without another attempt: let go of its lease, schedule on."""
        timetable, state = self._timetable, run.state
        if run.token is not None:
            self._keeper.release(run)
        if state.run is run:
            state.run = None
        if not self._flags.stopped and not timetable.draining:
            timetable.schedule_after(state, self._clock.now())


def _last_failure(run: Run) -> BaseException | None:
    """The failure of ``run``'s last attempt, for the one line that logs its traceback:
    taken, so that it is logged once and its frames are not kept any longer."""
    error, run.retry_error = run.retry_error, None
    return error


def _ignore(_result: object) -> None:
    """A statement's result nobody waits for (failures are the lease's to tell)."""
