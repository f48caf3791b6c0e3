"""The round runner: runs rounds (sync on worker threads, async on a loop).

A round runs inside its unit of work (its root span, its trace id in logs and SQL; see
`cronjob.engine._tracing`). When the job returns or raises, the round's thread hands
its end to the `EndRecorder`, which classifies it, records it
(in batches, through the `Finisher`) and posts it to the
dispatcher. A round is built, before it is handed here, by the
`RoundMaker` (`RoundRunner.prepare`).

Threads: `RoundRunner.prepare`, `submit_many` and
`cancel` are called on the dispatcher's thread (cancel also on the
control thread's callbacks there); a round then runs on a worker thread or the loop. The
runner also owns the fenced transactions' engines (see `cronjob.engine._fencing`)
and disposes the async engine it was handed to own, on the loop its connections belong to.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import inspect
import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import TracerProvider

import lease

from .._clock import Clock
from .._exceptions import Cancelled
from .._history import History
from .._round import Outcome
from ._ends import EndRecorder, round_where
from ._failures import Failures
from ._fencing import Fencing
from ._isolated import ChildRounds
from ._loop import OwnLoop
from ._prepare import RoundMaker
from ._state import Flags, Reason, Run
from ._tracing import RoundScope, round_scope
from ._workers import Workers, WorkersClosed

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["RoundRunner", "Start"]

log = logging.getLogger("cronjob")


class Start(enum.Enum):
    """What became of a round handed to `RoundRunner.submit`."""

    #: It runs, or waits in the queue for a worker thread (counted, its lease renewed).
    STARTED = "started"
    #: The runner was shut down meanwhile: the round will not run.
    SHUT_DOWN = "shut down"
    #: No worker thread could be started and none is alive: the round will not run,
    #: and its lease should be given back so that the sweep runs it again.
    NO_THREAD = "no thread"


class RoundRunner:
    """Runs rounds; hands each end to its `EndRecorder`.

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
            hooks: see `cronjob.engine._failures`); ``None`` when no job has either.
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
        app: str = "",
    ) -> None:
        self._clock = clock
        self._started = started
        #: Told of each round's start for the heartbeats' pings; ``None``: no heartbeat.
        self._beats = failures if failures is not None and failures.beats else None
        self._replica_id = replica_id
        self._tracer_provider = tracer_provider
        self._fencing = Fencing(
            engine=engine,
            async_engine=async_engine,
            owns_async_engine=owns_async_engine,
            store=store,
            flags=flags,
        )
        counts_work = type(clock)._work_started is not Clock._work_started
        # While rounds wait for a thread, ends are held back to share a batch; never on
        # a clock that counts work (a fake clock's advance() would wait on the hold).
        #: Settles rounds' ends (the policies record there the ends they decide).
        self.ends = self._ends = EndRecorder(
            clock=clock,
            replica_id=replica_id,
            store=store,
            flags=flags,
            ended=ended,
            history=history,
            failures=failures,
            hold=None if counts_work else lambda: self._workers.queued,
        )
        self._finisher = self._ends.finisher
        #: A round's end, handed over on the round's thread (bound once: once per round).
        self._end_round = self._ends.end_round
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
        self._maker = RoundMaker(clock=clock, replica_id=replica_id, fencing=self._fencing, app=app)
        self._engine = engine
        self._children: ChildRounds | None = None  # made for the first isolated round
        #: Build the round of a job for an instant, not started yet (see
        #: `RoundMaker.prepare`).
        self.prepare = self._maker.prepare

    @property
    def max_workers(self) -> int:
        """The worker threads for sync rounds."""
        return self._workers.max_workers

    # -- starting -------------------------------------------------------------------------

    def submit(self, run: Run) -> Start:
        """Start ``run`` on a worker thread or the loop.

        Returns:
            `Start.STARTED` if it runs or waits for a busy worker thread;
            `Start.SHUT_DOWN` if the runner was shut down meanwhile;
            `Start.NO_THREAD` (logged) if no thread could be started and none is
            alive: the round will never run, and the caller hands its lease back.
        """
        return self.submit_many([run])[0]

    def submit_many(self, runs: list[Run]) -> list[Start]:
        """`submit` each of ``runs``; the sync ones handed to the worker threads in
        one go (the rounds of an instant start together). Returns what became of each."""
        starts: list[Start] = []
        sync: list[Run] = []
        if self._tracer_provider is None:
            self._spans = _NO_SPANS if _tracing_off() else None
        for run in runs:
            self._clock._work_started()
            if not run.pinned.job.is_async or run.pinned.isolated:  # a child's: a thread waits
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
        waiting in ``ctx.wait_async`` always sees `asyncio.CancelledError` there,
        and the fake clock counts it as running again before this returns.
        """
        if not run.ctx._cancel(cause, wake=False):
            return
        if run.task is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed
                self._loop.call_soon_threadsafe(run.task.cancel)
        run.ctx._wake()

    # -- running --------------------------------------------------------------------------

    def _child_rounds(self) -> ChildRounds:
        """The runner of rounds in child processes (``isolation="process"``)."""
        children = self._children
        if children is None:
            children = self._children = ChildRounds(clock=self._clock, engine=self._engine)
        return children

    def _scope(self, run: Run) -> RoundScope:
        """Begin ``run``'s round: its start on record and in the metrics; return its unit
        of work, not entered yet."""
        clock, ctx = self._clock, run.ctx
        run.started = run.started_at = clock.now()
        run.started_mono = clock.monotonic()
        reason = run.reason.text
        run.state.metrics.started(ctx.instant, run.started_at, reason)
        if run.pinned.policed:
            self._started(run)
        if self._beats is not None:
            self._beats.started(run)
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
                    if run.pinned.policed and self._missed(run):
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
                                if run.pinned.isolated:  # in a child process of its own
                                    self._child_rounds().run(run)
                                else:
                                    _not_awaitable(run.ctx.name, run.pinned.fn(run.ctx))
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
                    if run.pinned.policed and self._missed(run):
                        await asyncio.to_thread(self._end_round, run, None, None)
                        return
                    with self._scope(run) as scope:
                        self._log_start(run)
                        error: BaseException | None = None
                        try:
                            run.ctx.check()  # cancelled before it could start: cut short
                            await run.pinned.fn(run.ctx)
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

    # -- the start deadline ---------------------------------------------------------------

    def _missed(self, run: Run) -> bool:
        """Whether ``run``'s round, about to start, missed its job's start deadline (it is
        then not run: marked `Outcome.MISSED_DEADLINE`, and logged).

        Checked for every round of the instant's schedule (scheduled, caught up, a second
        run); not for a retry (bounded by the job's next instant instead) nor a manual
        round (an operator asked for it now). A round that starts exactly at the deadline
        makes it. With a ``jitter``, the deadline runs from the round's delayed start:
        the delay is the job's own choice, not lateness.
        """
        deadline = run.pinned.start_deadline
        if deadline is None or run.reason is Reason.RETRY or run.request is not None:
            return False
        ctx = run.ctx
        late = self._clock.now() - run.pinned.starts_at()
        if late <= deadline:
            return False
        run.outcome = Outcome.MISSED_DEADLINE
        log.warning(
            "round of %s not run: it could not start within its start deadline of %g s "
            "after its instant (%.3f s late)",
            round_where(ctx),
            deadline.total_seconds(),
            late.total_seconds(),
        )
        return True

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


#: Where rounds' spans go while no SDK has set the global provider: nowhere, and execctx
#: knows it without asking a tracer (see ``_tracing_off``).
_NO_SPANS = trace.NoOpTracerProvider()


def _tracing_off() -> bool:
    """Whether no SDK has set OpenTelemetry's global tracer provider (yet)."""
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _why(run: Run) -> str:
    """The start line's note of why the round runs; nothing for its instant."""
    if run.reason is Reason.SCHEDULE:
        return ""
    if run.request is not None:
        return f" ({run.ctx.trigger}, asked by {run.request.requested_by})"
    return f" ({run.reason.value})"


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
