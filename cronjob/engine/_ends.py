"""The end of a round: classified, put on record, then posted to the dispatcher.

When a job returns or raises, the round's thread hands its end to
`EndRecorder.end_round`. The end is classified (see `cronjob._round.classify`;
for a job with a policy, ``_police``: a timeout, a retry), counted, logged and recorded: a
round that ran to its end is written by the `Finisher` in
a batch with others (its [lease.Ending][] built on the finisher's thread from the
round's `_Later`, the history pruned in the batches' wake); a round cut short gives
its lease back at once so another replica can run it a second time; a manual round's end
is written with its request. Then the end is posted to the dispatcher (``ended``), which
schedules the job's next instant; the failure policies hear of it first (see
`cronjob.engine._failures`).

Threads: `EndRecorder.end_round` runs on the round's thread (its worker, or a thread
of the loop's ``to_thread`` for an async round); the records of a batch and its report
(``_ending_of``, ``_batch_written``) on the finisher's. It keeps no scheduling state: the
dispatcher learns of each end through ``ended``, on its own thread.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import lease

from .._clock import Clock
from .._exceptions import Retry, Superseded, TimedOut
from .._history import History, Pruner
from .._round import Outcome, classify, iter_own_errors
from ._decided import DecidedEnds, error_summary, round_where
from ._failures import Failures, round_record
from ._finisher import Finisher
from ._policies import backoff_delay
from ._state import Flags, Run
from ._tracing import RoundScope

__all__ = ["EndRecorder", "error_summary", "round_where"]

log = logging.getLogger("cronjob")


class EndRecorder:
    """Settles rounds' ends: classifies, counts, logs and records each, then posts it.

    Args:
        clock: The scheduler's clock.
        replica_id: This replica's id, on each record.
        store: The lease store (ends, give-backs).
        flags: The scheduler's life flags: after a crash nothing is recorded.
        ended: Called with ``(run, ended)`` pairs, rounds whose end is settled and the
            clock time each ended (from the round's thread, or the finisher's for a batch
            of ends written together); it posts them to the dispatcher.
        history: Keep the round history (a row with each end recorded, pruned as it
            says); ``None`` keeps none.
        failures: Told of every round's end once settled (the self-pause, the failure
            hooks: see `cronjob.engine._failures`); ``None`` when no job has either.
        hold: The finisher's ``hold`` (rounds wait for a worker thread: ends are held back
            to share a batch); ``None`` writes each end at once.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        replica_id: str,
        store: lease.LeaseStore,
        flags: Flags,
        ended: Callable[[list[tuple[Run, datetime]]], None],
        history: History | None,
        failures: Failures | None,
        hold: Callable[[], bool] | None,
    ) -> None:
        self._clock = clock
        self._failures = failures if failures is not None and failures.active else None
        self._history = history is not None
        self._replica_id = replica_id
        self._store = store
        self._triggers = lease.Triggers(store)
        self._flags = flags
        self._ended = ended
        pruner = (
            None
            if history is None
            else Pruner(
                store=store,
                clock=clock,
                holder=replica_id,
                history=history,
                stopped=lambda: flags.stopped,
            )
        )
        #: The ends the policies decide for rounds past their job's own end (a round that
        #: outlived its timeout, a retry given up), recorded as this part's ends are.
        self.decided = DecidedEnds(
            clock=clock,
            replica_id=replica_id,
            store=store,
            flags=flags,
            history=history is not None,
            ending=self._ending,
            tell_failures=self._tell_failures,
            failures=self._failures,
        )
        # Ends of rounds that end together: batched; the history pruned in their wake.
        # While rounds wait for a thread (``hold``), ends are held back to share a batch.
        self.finisher: Finisher[_Later] = Finisher(
            store,
            ending=self._ending_of,
            done=self._batch_written,
            after_batch=None if pruner is None else pruner.maybe_prune,
            hold=hold,
            clock=clock,
        )

    def end_round(self, run: Run, error: BaseException | None, scope: RoundScope | None) -> None:
        """Record how the round ended, log it, and hand the job back to the dispatcher.

        Runs in the round's own context, so the log lines and the finish statement carry
        the round's trace id. Whatever the bookkeeping raises, the end is handed back
        (the dispatcher then schedules the job's next instant), then it propagates.
        """
        ended = self._clock.now()
        run.ended = True
        handed = False
        try:
            # A round with a timeout may have had its end recorded before a forced exit
            # (record_outlived): then that end stands, and nothing more is written.
            if run.pinned.timeout is None or self.decided.take_end(run):
                handed = self._settle_end(run, error, scope, ended)
        finally:
            if not handed:
                self._ended([(run, ended)])

    def _settle_end(
        self, run: Run, error: BaseException | None, scope: RoundScope | None, ended: datetime
    ) -> bool:
        """Classify, record and log the end; ``True`` once the finisher took it over."""
        ctx = run.ctx
        outcome = classify(error)
        if run.pinned.policed:
            outcome = self._police(run, outcome, error, ended)
        if outcome is Outcome.CUT_SHORT and isinstance(ctx.cause, Superseded):
            outcome = Outcome.SUPERSEDED  # a newer instant replaces it: never run again
        given_up = ctx.attempt >= 2 and run.token is not None and outcome is Outcome.CUT_SHORT
        seconds = self._clock.monotonic() - run.started_mono
        if outcome is Outcome.MISSED_DEADLINE:  # it never started: no duration, not active
            run.state.metrics.missed_deadline()
        else:
            run.state.metrics.ended(outcome, error, seconds, given_up=given_up)
        if scope is not None:
            try:
                scope.outcome(outcome, error)
            except Exception:  # tracing must not keep the end from its record
                log.exception("job %r: putting the outcome on its round's span failed", ctx.name)
        run.outcome = outcome
        # A round that ran to its end has its end written by the finisher, in a batch
        # with the others ending now, and its record built there: the worker is free
        # for the next round at once.
        later = outcome is not Outcome.CUT_SHORT and self._records_end(run) and run.request is None
        recorded = later
        if not later:
            ending = self._ending(run, outcome, error, ended)
            recorded = self._record_end(run, ending, outcome)
            if self._failures is not None:  # hooks only: no count on a worker's thread
                self._tell_failures([(run, outcome, ending, False)])
        if outcome is Outcome.SUCCEEDED:
            # DEBUG, as the start: the dispatcher's summary line counts them at INFO. A
            # manual round, rare and asked for by someone, stays at INFO.
            level = logging.INFO if run.request is not None else logging.DEBUG
            if log.isEnabledFor(level):
                log.log(level, "round of %s ran to its end", round_where(ctx))
        elif outcome is Outcome.FAILED:
            where = round_where(ctx)
            log.error("round of %s failed", where, exc_info=error)
            if ctx.cause is not None and run.token is not None:
                log.warning(
                    "round of %s was cancelled (%s) but raised an error of its own instead "
                    "of the cancellation: it counts as run to its end and will not run again. "
                    "Let ctx.check() raise, or raise from within an ExceptionGroup with it, "
                    "to be re-run",
                    where,
                    ctx.cause,
                )
        elif outcome is Outcome.TIMED_OUT:
            log.warning(
                "round of %s timed out: it ran past its timeout of %g s (%s)",
                round_where(ctx),
                run.pinned.timeout,
                "it returned after its cancellation"
                if error is None
                else f"it ended with {error_summary(error)}",
            )
        elif outcome is Outcome.RETRYING:
            # One line an attempt, without its traceback: a job retried every few
            # seconds would fill the log with the same one. The traceback is logged
            # once, by the attempt that fails for good (the FAILED branch above), or
            # with the line that tells its retry is given up (see PolicyTimers).
            run.retry_error = error
            log.warning(
                "round of job %r instant %s attempt %d of %d failed (%s); next try in %.3g s",
                ctx.name,
                ctx.instant.isoformat(),
                ctx.attempt,
                1 + run.pinned.policy.retries,
                error_summary(error) if error is not None else "no error",
                run.retry_delay,
            )
        elif outcome is Outcome.MISSED_DEADLINE:
            pass  # logged by _missed, as it decided
        elif outcome is Outcome.SUPERSEDED:
            log.info("round of %s superseded (%s)", round_where(ctx), ctx.cause)
        else:
            where, cause = round_where(ctx), ctx.cause or error
            for own in iter_own_errors(error) if error else ():
                log.error(
                    "round of %s: the job's own failure beside its cancellation",
                    where,
                    exc_info=own,
                )
            if given_up:
                log.warning(
                    "round of %s cut short a second time (%s): the instant is given up",
                    where,
                    cause,
                )
            else:
                log.info("round of %s cut short (%s)", where, cause)
        if later:
            self._finish_later(_Later(run, ended, outcome, error))
            return True
        if not recorded and run.token is not None and not self._flags.crashed:
            log.warning(
                "round of %s: its end is not on record (the lease is gone)", round_where(ctx)
            )
        return False

    def _police(
        self, run: Run, outcome: Outcome, error: BaseException | None, ended: datetime
    ) -> Outcome:
        """The outcome of a round of a job with a policy: a missed start deadline, a
        timeout (a round its timeout cancelled ended ``timed_out`` whatever it did then),
        or a failed attempt with attempts left: ``retrying`` (its delay on ``run``),
        unless the retry could not start before the job's next instant is due."""
        if run.outcome is Outcome.MISSED_DEADLINE:
            return Outcome.MISSED_DEADLINE
        ctx = run.ctx
        cause = ctx.cause
        if isinstance(cause, TimedOut):
            return Outcome.TIMED_OUT
        if outcome is not Outcome.FAILED or cause is not None or run.request is not None:
            return outcome
        policy = run.pinned.policy
        asked = error if isinstance(error, Retry) else None
        if ctx.attempt > policy.retries:  # attempts are 1 + retries, a second run counted
            if asked is not None:
                log.warning(
                    "round of %s asked for a retry, but has no attempt left (%d retries)",
                    round_where(ctx),
                    policy.retries,
                )
            return outcome
        if asked is not None and asked.delay is not None:
            delay = asked.delay
        else:
            delay = backoff_delay(policy.retry_backoff, ctx.attempt)
        due = run.pinned.schedule.next(ended)
        if due is not None and ended + timedelta(seconds=delay) >= due:
            log.warning(
                "round of %s failed; its retry is given up: the job's next instant %s is "
                "due before it could start (in %.3g s)",
                round_where(ctx),
                due.isoformat(),
                delay,
            )
            return outcome
        run.retry_delay = delay
        return Outcome.RETRYING

    def _records_end(self, run: Run) -> bool:
        return run.token is not None and not self._flags.crashed and run.lost_at is None

    def _ending(
        self,
        run: Run,
        outcome: Outcome,
        error: BaseException | None,
        ended: datetime,
        *,
        holding: bool = False,
    ) -> lease.Ending:
        """The end to record: outcome, error summary, and the history row (if kept)."""
        ctx = run.ctx
        summary = None if outcome is Outcome.SUCCEEDED or error is None else error_summary(error)
        if outcome is Outcome.TIMED_OUT and ctx.cause is not None:
            summary = error_summary(ctx.cause)
        elif outcome is Outcome.MISSED_DEADLINE:
            deadline = run.pinned.start_deadline
            seconds = 0.0 if deadline is None else deadline.total_seconds()
            summary = f"not started within its start deadline of {seconds:g} s"
        word = _word(outcome, ctx.attempt)
        record = None
        if self._history:
            record = lease.RoundRow(
                name=ctx.name,
                instant=ctx.instant,
                attempt=ctx.attempt,
                holder=self._replica_id,
                why=run.reason.why,
                started=run.started if run.started is not None else ended,
                ended=ended,
                outcome=word,
                error=summary,
                trace_id=ctx.trace_id or None,
                requested_by=ctx.requested_by,
            )
        return lease.Ending(
            name=ctx.name,
            token=run.token if run.token is not None else 0,
            ended=ended,
            succeeded=outcome is Outcome.SUCCEEDED,
            error=summary,
            record=record,
            outcome=word,
            retrying=outcome is Outcome.RETRYING,
            holding=holding,
        )

    def _ending_of(self, later: _Later) -> lease.Ending:
        """The finisher's ``ending``: the record of an end handed to it."""
        later.ending = self._ending(later.run, later.outcome, later.error, later.ended)
        return later.ending

    def _tell_failures(self, ends: list[tuple[Run, Outcome, lease.Ending | None, bool]]) -> None:
        """Hand ends to the failure policies (``(run, outcome, ending, on_record)``);
        whatever they raise is logged: the ends go on to the dispatcher."""
        failures = self._failures
        if failures is None:
            return
        try:
            failures.ended(
                [
                    (outcome, round_record(run, outcome, ending, self._replica_id), on_record)
                    for run, outcome, ending, on_record in ends
                    if outcome in failures.told
                ]
            )
        except Exception:
            log.exception("acting on the failure policies of ended rounds failed")

    def _finish_later(self, later: _Later) -> None:
        """Hand the end to the finisher; it is logged and posted once written."""
        self._clock._work_started()
        try:
            self.finisher.finish_later(later)
        except RuntimeError:  # stopped meanwhile: the end is not recorded
            with self._clock._tracked():
                later.context.run(self._not_recorded, later, False)

    def _batch_written(self, results: list[tuple[_Later, bool | BaseException]]) -> None:
        """The finisher's ``done``: post the ends its batch recorded in one message, then
        each stops being counted as work (after the post: a fake clock never sees them
        neither running nor posted). An end not recorded is logged and posted alone."""
        recorded: list[tuple[Run, datetime]] = []
        if self._failures is not None:
            # Before the ends go on: a job that pauses itself is paused on record before
            # this replica schedules its next instant.
            self._tell_failures(
                [(x.run, x.outcome, x.ending, result is True) for x, result in results]
            )
        for later, result in results:
            if result is True:  # the common case
                recorded.append((later.run, later.ended))
                continue
            try:
                with self._clock._tracked():
                    later.context.run(self._not_recorded, later, result)
            except Exception:  # one end's failure must not keep the others back
                log.exception("job %r: handing on its round's end failed", later.run.ctx.name)
        if not recorded:
            return
        try:
            self._ended(recorded)
        finally:
            for _ in recorded:
                self._clock._work_finished()

    def _not_recorded(self, later: _Later, result: bool | BaseException) -> None:
        """Log an end the finisher could not record (in the round's context: its trace
        id), and tell the dispatcher it ended."""
        run = later.run
        run.retry_delay = None  # an attempt not on record is not retried: the lease is gone
        if isinstance(result, BaseException):
            log.error("job %r: recording the end of its round failed: %s", run.ctx.name, result)
        if not self._flags.crashed:
            where = round_where(run.ctx)
            log.warning("round of %s: its end is not on record (the lease is gone)", where)
        self._ended([(run, later.ended)])

    def _record_end(self, run: Run, e: lease.Ending, outcome: Outcome) -> bool:
        """Give back the lease of a round cut short (ends that ran go to the finisher);
        record a manual round's end, however it ended, with its request."""
        request = run.request
        if request is not None and not self._flags.crashed:
            try:
                return self._triggers.end(
                    request.id,
                    e.name,
                    e.token,
                    leased=run.token is not None,
                    outcome=_word(outcome, run.ctx.attempt),
                    error=e.error,
                    record=e.record,
                )
            except lease.LeaseError as exc:
                log.error("job %r: recording the end of its round failed: %s", e.name, exc)
                return False
        if not self._records_end(run):
            return False
        try:
            return self._store.give_back(e.name, e.token, record=e.record)
        except lease.LeaseError as exc:
            log.error("job %r: recording the end of its round failed: %s", run.ctx.name, exc)
            return False


class _Later:
    """The end of a round that ran to its end, handed to the finisher, which builds the
    record to write from it (see `EndRecorder._ending`)."""

    __slots__ = ("context", "ended", "ending", "error", "outcome", "run")

    def __init__(
        self, run: Run, ended: datetime, outcome: Outcome, error: BaseException | None
    ) -> None:
        self.run = run
        self.ended = ended
        self.outcome = outcome
        self.error = error
        #: The record built from it on the finisher's thread (``None`` until then).
        self.ending: lease.Ending | None = None
        #: The round's context: lines logged for the end keep the round's trace id.
        self.context = contextvars.copy_context()


def _word(outcome: Outcome, attempt: int) -> str:
    """The outcome in the record's words: a second run cut short is given up."""
    return "given up" if outcome is Outcome.CUT_SHORT and attempt >= 2 else outcome.value
