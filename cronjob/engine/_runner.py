"""The round runner: runs rounds (sync on worker threads, async on a loop) and records ends.

A round runs inside its unit of work (its root span, its trace id in logs and SQL; see
:mod:`cronjob.engine._tracing`). When the job returns or raises, the round is classified (see
:func:`cronjob._round.classify`) and its end recorded: a round that ran to its end is
written by the :class:`~cronjob.engine._finisher.Finisher` in a batch with others; a round cut
short gives its lease back at once so another replica can run it a second time. Then the
end is posted to the dispatcher, which schedules the job's next instant.

The runner also opens a round's fenced transaction (``ctx.transaction()`` on the
scheduler's engine, ``ctx.transaction_async()`` on its async engine) and disposes the
async engine it was handed to own, on the loop its connections belong to.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import functools
import inspect
import logging
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from opentelemetry import trace
from opentelemetry.trace import TracerProvider

import lease

from .._clock import Clock
from .._exceptions import Cancelled, Retry, TimedOut
from .._history import History, Pruner
from .._round import Outcome, Round, Trigger, classify, iter_own_errors, lease_lost
from ._failures import HOOKED, Failures, round_record
from ._fencing import Fencing
from ._finisher import Finisher
from ._loop import OwnLoop
from ._policies import backoff_delay
from ._state import Flags, JobState, Reason, Run
from ._tracing import RoundScope, round_scope
from ._workers import Workers, WorkersClosed

if TYPE_CHECKING:
    from sqlalchemy import Connection, Dialect, Engine, Select
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["RoundRunner", "Start"]

log = logging.getLogger("cronjob")


class Start(enum.Enum):
    """What became of a round handed to :meth:`RoundRunner.submit`."""

    #: It runs, or waits in the queue for a worker thread (counted, its lease renewed).
    STARTED = "started"
    #: The runner was shut down meanwhile: the round will not run.
    SHUT_DOWN = "shut down"
    #: No worker thread could be started and none is alive: the round will not run,
    #: and its lease should be given back so that the sweep runs it again.
    NO_THREAD = "no thread"


class RoundRunner:
    """Runs rounds and records their ends.

    Args:
        clock: The scheduler's clock.
        replica_id: This replica's id, on each round.
        engine: The scheduler's engine (fenced transactions).
        store: The lease store (ends, give-backs).
        flags: The scheduler's life flags: after a crash nothing is recorded.
        ended: Called with ``(run, ended)`` pairs, rounds whose end is settled and the
            clock time each ended (from the round's thread, or the finisher's for a batch
            of ends written together); it posts them to the dispatcher.
        max_workers: Threads for sync rounds.
        loop: The asyncio loop for async rounds; ``None`` to start one of our own when
            ``needs_loop``.
        needs_loop: Some job is async.
        tracer_provider: Where the rounds' spans go.
        async_engine: The engine of async rounds' fenced transactions, or the error that
            explains why there is none (raised by ``ctx.transaction_async()``).
        owns_async_engine: Dispose ``async_engine`` at shutdown (the scheduler made it).
        history: Keep the round history (a row with each end recorded, pruned as it
            says); ``None`` keeps none.
        started: Told of each round of a job with a policy as it starts (from its
            thread; it posts it to the dispatcher, which times it out).
        failures: Told of every round's end once settled (the self-pause, the failure
            hooks: see :mod:`cronjob.engine._failures`); ``None`` when no job has either.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        replica_id: str,
        engine: Engine,
        store: lease.LeaseStore,
        flags: Flags,
        ended: Callable[[list[tuple[Run, datetime]]], None],
        max_workers: int,
        loop: asyncio.AbstractEventLoop | None,
        needs_loop: bool,
        tracer_provider: TracerProvider | None,
        async_engine: AsyncEngine | lease.LeaseError | None = None,
        owns_async_engine: bool = False,
        history: History | None = None,
        started: Callable[[Run], None] = lambda run: None,
        failures: Failures | None = None,
    ) -> None:
        self._clock = clock
        self._started = started
        self._failures = failures if failures is not None and failures.active else None
        self._history = history is not None
        self._replica_id = replica_id
        self._store = store
        self._triggers = lease.Triggers(store)
        self._flags = flags
        self._ended = ended
        self._tracer_provider = tracer_provider
        self._fencing = Fencing(
            engine=engine,
            async_engine=async_engine,
            owns_async_engine=owns_async_engine,
            store=store,
            flags=flags,
        )
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
        counts_work = type(clock)._work_started is not Clock._work_started
        # Ends of rounds that end together: batched; the history pruned in their wake.
        # While rounds wait for a thread, ends are held back to share a batch; never on
        # a clock that counts work (a fake clock's advance() would wait on the hold).
        self._finisher: Finisher[_Later] = Finisher(
            store,
            ending=self._ending_of,
            done=self._batch_written,
            after_batch=None if pruner is None else pruner.maybe_prune,
            hold=None if counts_work else lambda: self._workers.queued,
            clock=clock,
        )
        # A round queued behind busy threads does not hold a fake clock's time. A clock
        # that counts no work (the system clock) gets no hooks: the pool then skips a
        # lock per round (see Workers.hand_over).
        if counts_work:
            self._workers = Workers(
                max_workers, "cronjob-round", park=clock._work_finished, unpark=clock._work_started
            )
        else:
            self._workers = Workers(max_workers, "cronjob-round", drained=self._finisher.poke)
        #: Where the rounds' spans go: the provider given, else, while no SDK has set
        #: the global one, a no-op provider (execctx then skips the tracer), else the
        #: global one. Looked at once per batch of rounds started (see submit_many).
        self._spans: TracerProvider | None = tracer_provider
        self._own_loop = OwnLoop() if needs_loop and loop is None else None
        self._loop = self._own_loop.loop if self._own_loop is not None else loop
        # A round's fenced transactions and fence check, made once for every round: each
        # finds its Run on the round itself (thousands of rounds a second at scale).
        fencing = self._fencing

        def transaction(ctx: Round) -> contextlib.AbstractContextManager[Connection]:
            return fencing.transaction(_run_of(ctx))

        def transaction_async(
            ctx: Round,
        ) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
            return fencing.transaction_async(_run_of(ctx))

        def fence(
            ctx: Round, dialect: Dialect, fetch: Callable[[Select[int]], bool], final: bool
        ) -> None:
            fencing.check(_run_of(ctx), dialect, fetch, final=final)

        self._transaction = transaction
        self._transaction_async = transaction_async
        self._fence = fence

    @property
    def max_workers(self) -> int:
        """The worker threads for sync rounds."""
        return self._workers.max_workers

    # -- starting -------------------------------------------------------------------------

    def prepare(
        self,
        state: JobState,
        instant: datetime,
        *,
        attempt: int,
        token: int | None,
        claimed_at: float,
        reason: Reason,
        request: lease.TriggerRow | None = None,
    ) -> Run:
        """Build the round of ``state``'s job for ``instant`` (not started yet); a manual
        round carries its ``request``."""
        ctx = Round(
            name=state.job.name,
            instant=instant,
            attempt=attempt,
            replica=self._replica_id,
            trace_id="",  # set by round_scope once the round's span exists
            clock=self._clock,
            transaction=self._transaction,
            transaction_async=self._transaction_async,
            fence=self._fence,
            trigger=Trigger.SCHEDULE if request is None else Trigger.MANUAL,
            requested_by=None if request is None else request.requested_by,
        )
        run = Run(
            state=state,
            ctx=ctx,
            token=token,
            reason=reason,
            renewed_at=claimed_at,
            request=request,
        )
        # A leased round's Round knows its Run weakly: no cycle, so the pair is freed as
        # soon as the round is over, not by the cyclic garbage collector (thousands of
        # pairs a second at scale, each a full collection's work). See _run_of.
        ctx._run = run if token is None else weakref.ref(run)
        return run

    def submit(self, run: Run) -> Start:
        """Start ``run`` on a worker thread or the loop.

        Returns:
            :attr:`Start.STARTED` if it runs or waits for a busy worker thread;
            :attr:`Start.SHUT_DOWN` if the runner was shut down meanwhile;
            :attr:`Start.NO_THREAD` (logged) if no thread could be started and none is
            alive: the round will never run, and the caller hands its lease back.
        """
        return self.submit_many([run])[0]

    def submit_many(self, runs: list[Run]) -> list[Start]:
        """:meth:`submit` each of ``runs``; the sync ones handed to the worker threads in
        one go (the rounds of an instant start together). Returns what became of each."""
        starts: list[Start] = []
        sync: list[Run] = []
        if self._tracer_provider is None:
            self._spans = _NO_SPANS if _tracing_off() else None
        for run in runs:
            self._clock._work_started()
            if not run.state.job.is_async:
                sync.append(run)
                starts.append(Start.STARTED)
                continue
            assert self._loop is not None
            try:
                asyncio.run_coroutine_threadsafe(self._round_async(run), self._loop)
            except RuntimeError:  # the loop was shut down meanwhile
                self._clock._work_finished()
                starts.append(Start.SHUT_DOWN)
            else:
                starts.append(Start.STARTED)
        if not sync:
            return starts
        outcomes: list[Exception | None]
        try:
            outcomes = [
                *self._workers.submit_many(
                    [functools.partial(self._round_sync, run) for run in sync]
                )
            ]
        except WorkersClosed:  # shut down meanwhile
            outcomes = [WorkersClosed()] * len(sync)  # the same for each
        failed = {id(run): outcome for run, outcome in zip(sync, outcomes, strict=True) if outcome}
        if not failed:
            return starts
        for i, run in enumerate(runs):
            error = failed.get(id(run))
            if error is None:
                continue
            self._clock._work_finished()
            if isinstance(error, WorkersClosed):
                starts[i] = Start.SHUT_DOWN
                continue
            log.error(
                "job %r: the round of %s is not started: no worker thread could be started (%s)%s",
                run.ctx.name,
                run.ctx.instant.isoformat(),
                error.__cause__ or error,
                "; its lease is given back, so it runs again" if run.token is not None else "",
            )
            starts[i] = Start.NO_THREAD
        return starts

    def cancel(self, run: Run, cause: Cancelled) -> None:
        """Cancel ``run``'s round; an async round's task is cancelled too.

        The cause is recorded first, then an async task's cancellation is queued on its
        loop, then waiters are woken (queued after it, from this same thread): a job
        waiting in ``ctx.wait_async`` always sees :class:`asyncio.CancelledError` there,
        and the fake clock counts it as running again before this returns.
        """
        if not run.ctx._cancel(cause, wake=False):
            return
        if run.task is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed
                self._loop.call_soon_threadsafe(run.task.cancel)
        run.ctx._wake()

    # -- running --------------------------------------------------------------------------

    def _scope(self, run: Run) -> RoundScope:
        """Begin ``run``'s round: its start on record and in the metrics; return its unit
        of work, not entered yet."""
        clock, ctx = self._clock, run.ctx
        run.started = run.started_at = clock.now()
        run.started_mono = clock.monotonic()
        reason = run.reason.text
        run.state.metrics.started(ctx.instant, run.started_at, reason)
        if run.state.policed:
            self._started(run)
        return round_scope(ctx, self._replica_id, self._spans, reason=reason)

    def _log_start(self, run: Run) -> None:
        """The round's start line, inside its unit of work (it carries the trace id)."""
        # A scheduled start is the common case, thousands a second at scale: DEBUG (the
        # dispatcher logs a summary at INFO); the others stay INFO.
        level = logging.DEBUG if run.reason is Reason.SCHEDULE else logging.INFO
        if log.isEnabledFor(level):
            ctx = run.ctx
            log.log(
                level,
                "round of job %r instant %s attempt %d started on %s%s",
                ctx.name,
                ctx.instant.isoformat(),
                ctx.attempt,
                ctx.replica,
                _why(run),
            )

    # A round runs as its unit of work (_scope), counted by the clock (_tracked). If the
    # unit fails to open or close before the round's end is settled, the work that
    # settles it (_bookkeeping_failed) is counted before this unit stops being: a fake
    # clock never sees a moment with nothing running in between. Written out in each of
    # the two methods below rather than as one generator: entered once per round.

    def _round_sync(self, run: Run) -> None:
        hand_over = self._workers.hand_over
        try:
            with self._clock._tracked():
                try:
                    if run.state.policed and self._missed(run):
                        try:
                            self._end_round(run, None, None)
                        finally:
                            hand_over()
                        return
                    with self._scope(run) as scope:
                        self._log_start(run)
                        try:
                            error: BaseException | None = None
                            try:
                                run.ctx.check()  # cancelled before it could start: cut short
                                _not_awaitable(run.ctx.name, run.state.job.fn(run.ctx))
                            except BaseException as exc:  # the worker's top: every outcome
                                error = exc
                            self._end_round(run, error, scope)
                        finally:
                            # Still counted as running: the round queued for this thread
                            # is counted before this one stops being.
                            hand_over()
                except Exception:
                    if not run.ended:
                        self._clock._work_started()  # _bookkeeping_failed's unit
                    raise
        except Exception as exc:  # the round's unit of work failed to open or to close
            self._bookkeeping_failed(run, exc, hand_over)

    async def _round_async(self, run: Run) -> None:
        run.task = asyncio.current_task()
        try:
            with self._clock._tracked():
                try:
                    if run.state.policed and self._missed(run):
                        await asyncio.to_thread(self._end_round, run, None, None)
                        return
                    with self._scope(run) as scope:
                        self._log_start(run)
                        error: BaseException | None = None
                        try:
                            run.ctx.check()  # cancelled before it could start: cut short
                            await run.state.job.fn(run.ctx)
                        except BaseException as exc:  # includes the task's own cancellation
                            error = exc
                        await asyncio.to_thread(self._end_round, run, error, scope)
                except Exception:
                    if not run.ended:
                        self._clock._work_started()  # _bookkeeping_failed's unit
                    raise
        except Exception as exc:  # the round's unit of work failed to open or to close
            await asyncio.to_thread(self._bookkeeping_failed, run, exc)

    def _bookkeeping_failed(
        self, run: Run, exc: Exception, hand_over: Callable[[], None] = lambda: None
    ) -> None:
        """The round's unit of work (its span) failed around the job: log; end it if open.

        Raised on the way in (the job did not run), the round fails and its end is
        recorded and posted like any other, so the job keeps its schedule. Raised on the
        way out, the end is already settled.
        """
        name = run.ctx.name
        if run.ended:
            log.error("job %r: its round's bookkeeping failed after its end", name, exc_info=exc)
            return
        log.error(
            "job %r: opening its round's unit of work failed: the job did not run",
            name,
            exc_info=exc,
        )
        with self._clock._tracked():  # counted since the round's unit let go
            try:
                self._end_round(run, exc, None)
            finally:
                hand_over()

    # -- ending ---------------------------------------------------------------------------

    def _end_round(self, run: Run, error: BaseException | None, scope: RoundScope | None) -> None:
        """Record how the round ended, log it, and hand the job back to the dispatcher.

        Runs in the round's own context, so the log lines and the finish statement carry
        the round's trace id. Whatever the bookkeeping raises, the end is handed back
        (the dispatcher then schedules the job's next instant), then it propagates.
        """
        ended = self._clock.now()
        run.ended = True
        handed = False
        try:
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
        if run.state.policed:
            outcome = self._police(run, outcome, error, ended)
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
                log.log(level, "round of %s ran to its end", _where(ctx))
        elif outcome is Outcome.FAILED:
            where = _where(ctx)
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
                _where(ctx),
                run.state.timeout,
                "it returned after its cancellation"
                if error is None
                else f"it ended with {error_summary(error)}",
            )
        elif outcome is Outcome.RETRYING:
            log.warning(
                "round of %s failed (%s): attempt %d of %d, the next in %.3g s",
                _where(ctx),
                error_summary(error) if error is not None else "no error",
                ctx.attempt,
                1 + run.state.job.policy.retries,
                run.retry_delay,
                exc_info=error,
            )
        elif outcome is Outcome.MISSED_DEADLINE:
            pass  # logged by _missed, as it decided
        else:
            where, cause = _where(ctx), ctx.cause or error
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
            log.warning("round of %s: its end is not on record (the lease is gone)", _where(ctx))
        return False

    def _missed(self, run: Run) -> bool:
        """Whether ``run``'s round, about to start, missed its job's start deadline (it is
        then not run: marked :attr:`Outcome.MISSED_DEADLINE`, and logged).

        Checked for every round of the instant's schedule (scheduled, caught up, a second
        run); not for a retry (bounded by the job's next instant instead) nor a manual
        round (an operator asked for it now). A round that starts exactly at the deadline
        makes it.
        """
        deadline = run.state.start_deadline
        if deadline is None or run.reason is Reason.RETRY or run.request is not None:
            return False
        ctx = run.ctx
        late = self._clock.now() - ctx.instant
        if late <= deadline:
            return False
        run.outcome = Outcome.MISSED_DEADLINE
        log.warning(
            "round of %s not run: it could not start within its start deadline of %g s "
            "after its instant (%.3f s late)",
            _where(ctx),
            deadline.total_seconds(),
            late.total_seconds(),
        )
        return True

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
        policy = run.state.job.policy
        asked = error if isinstance(error, Retry) else None
        if ctx.attempt > policy.retries:  # attempts are 1 + retries, a second run counted
            if asked is not None:
                log.warning(
                    "round of %s asked for a retry, but has no attempt left (%d retries)",
                    _where(ctx),
                    policy.retries,
                )
            return outcome
        if asked is not None and asked.delay is not None:
            delay = asked.delay
        else:
            delay = backoff_delay(policy.retry_backoff, ctx.attempt)
        due = run.state.job.schedule.next(ended)
        if due is not None and ended + timedelta(seconds=delay) >= due:
            log.warning(
                "round of %s failed; its retry is given up: the job's next instant %s is "
                "due before it could start (in %.3g s)",
                _where(ctx),
                due.isoformat(),
                delay,
            )
            return outcome
        run.retry_delay = delay
        return Outcome.RETRYING

    def _records_end(self, run: Run) -> bool:
        return run.token is not None and not self._flags.crashed and run.lost_at is None

    def _ending(
        self, run: Run, outcome: Outcome, error: BaseException | None, ended: datetime
    ) -> lease.Ending:
        """The end to record: outcome, error summary, and the history row (if kept)."""
        ctx = run.ctx
        summary = None if outcome is Outcome.SUCCEEDED or error is None else error_summary(error)
        if outcome is Outcome.TIMED_OUT and ctx.cause is not None:
            summary = error_summary(ctx.cause)
        elif outcome is Outcome.MISSED_DEADLINE:
            deadline = run.state.start_deadline
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
        )

    def _ending_of(self, later: _Later) -> lease.Ending:
        """The finisher's ``ending``: the record of an end handed to it."""
        later.ending = self._ending(later.run, later.outcome, later.error, later.ended)
        return later.ending

    def _tell_failures(
        self, ends: list[tuple[Run, Outcome, lease.Ending | None, bool]]
    ) -> None:
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
                    if outcome in HOOKED
                ]
            )
        except Exception:
            log.exception("acting on the failure policies of ended rounds failed")

    def _finish_later(self, later: _Later) -> None:
        """Hand the end to the finisher; it is logged and posted once written."""
        self._clock._work_started()
        try:
            self._finisher.finish_later(later)
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
            where = _where(run.ctx)
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

    # -- stopping -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the worker threads, the finisher and our own loop.

        Rounds that already ended finish their bookkeeping; a round that ignored its
        cancellation keeps its (daemon) thread or task and is not waited for.
        """
        self._workers.shutdown()
        self._finisher.close()
        if self._own_loop is not None:
            self._own_loop.settle()
        self._fencing.dispose_async_engine(self._loop)
        if self._own_loop is not None:
            self._own_loop.stop()


class _Later:
    """The end of a round that ran to its end, handed to the finisher, which builds the
    record to write from it (see :meth:`RoundRunner._ending`)."""

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


#: Where rounds' spans go while no SDK has set the global provider: nowhere, and execctx
#: knows it without asking a tracer (see ``_tracing_off``).
_NO_SPANS = trace.NoOpTracerProvider()


def _tracing_off() -> bool:
    """Whether no SDK has set OpenTelemetry's global tracer provider (yet)."""
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _word(outcome: Outcome, attempt: int) -> str:
    """The outcome in the record's words: a second run cut short is given up."""
    return "given up" if outcome is Outcome.CUT_SHORT and attempt >= 2 else outcome.value


def _why(run: Run) -> str:
    """The start line's note of why the round runs; nothing for its instant."""
    if run.reason is Reason.SCHEDULE:
        return ""
    if run.request is not None:
        return f" (manual, asked by {run.request.requested_by})"
    return f" ({run.reason.value})"


def _where(ctx: Round) -> str:
    """The round in the end's log lines: ``job 'x' instant … attempt n``."""
    return f"job {ctx.name!r} instant {ctx.instant.isoformat()} attempt {ctx.attempt}"


def error_summary(error: BaseException) -> str:
    """``"Type: message"`` of a job's failure, for the record: never its traceback or
    locals (bounded when stored, see :func:`lease.RoundRow`)."""
    kind = type(error).__qualname__
    try:
        message = str(error)
    except Exception:  # a broken __str__ must not keep the end from its record
        message = "<the message could not be read>"
    return f"{kind}: {message}" if message else kind


def _not_awaitable(name: str, result: object) -> None:
    """Fail a sync job's round that handed back an awaitable instead of doing its work.

    A callable that returns a coroutine (``lambda ctx: work(ctx)`` around an ``async
    def``) is not recognised as async, so it runs on a worker thread and its work would
    never happen. The coroutine is closed (no "never awaited" warning) and the round fails.

    Raises:
        TypeError: ``result`` is awaitable.
    """
    if result is None or not inspect.isawaitable(result):  # None: most jobs, at once
        return
    if inspect.iscoroutine(result):
        result.close()
    raise TypeError(
        f"job {name!r} returned {type(result).__name__} {result!r} instead of doing its "
        "work: it ran on a worker thread and nothing awaited it; register an `async def` "
        "function (or an object whose `__call__` is `async def`) to run it on the loop"
    )


def _run_of(ctx: Round) -> Run:
    """The ``Run`` of ``ctx``'s round, for its fenced transactions.

    Raises:
        LeaseLost: the round was leased and is over, long enough for the scheduler to
            have let go of it: a ``ctx`` kept past its round holds no lease.
    """
    held = ctx._run
    run = held() if isinstance(held, weakref.ref) else held
    if run is None:
        raise lease_lost(ctx.name, "the round no longer holds it")
    return cast("Run", run)
