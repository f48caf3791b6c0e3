"""The scheduler: claims instants through the lease, runs rounds, renews, re-runs, drains.

Three kinds of threads, none per idle job:

- the *dispatcher* owns all scheduling state. It keeps one heap of the jobs' next
  instants and a handful of timers (renewal, sweep, lease-loss deadlines), waits on the
  clock until the earliest, and never does I/O, so a slow database cannot delay a
  lease-loss deadline;
- the *control* thread runs the lease statements (claim, renew, sweep, catch-up), one
  at a time, and posts their results back to the dispatcher;
- a pool of *workers* runs sync rounds (async rounds run on an asyncio loop); each round
  records its own end in the lease table.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import heapq
import itertools
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import lease
from execctx import instrument

from ._clock import Clock, SystemClock
from ._exceptions import LeaseLost, Shutdown
from ._finisher import Finisher
from ._registry import Job, Registry, default_registry
from ._round import Outcome, Round, classify, iter_own_errors, lease_lost
from ._tracing import RoundScope, round_scope
from ._workers import Workers

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from sqlalchemy import Connection, Engine

__all__ = ["Scheduler", "resolve_database"]

log = logging.getLogger("cronjob")

#: Seconds between two renewals of the leases a replica holds.
RENEW_EVERY = 5.0
#: Seconds between two attempts when a renewal failed.
RENEW_RETRY = 1.0
#: A lease counts as lost after this many seconds without a successful renewal.
LOST_AFTER = 10.0
#: A round still running this many seconds after its lease was lost ends the process.
EXIT_AFTER_LOST = 5.0
#: ... and never later than this many seconds before its lease can expire: 10 s + 5 s is
#: exactly the lease's 15 s, and a replica claiming the job the moment the lease expires
#: must find this process gone (the fault suite saw one claim by 4 ms).
EXIT_MARGIN = 0.5
#: Seconds between two sweeps for rounds cut short.
SWEEP_EVERY = 15.0
#: Catch-up only runs an instant this recent.
CATCH_UP_HORIZON = timedelta(days=1)
#: Default bound on how long ``drain`` waits for cancelled rounds to end.
DEFAULT_DRAIN_TIMEOUT = 5.0
#: Default number of worker threads for sync rounds.
DEFAULT_MAX_WORKERS = 64
#: First and longest pause between attempts to reach a database that is down.
RETRY_FIRST, RETRY_LONGEST = 1.0, 30.0
#: Real seconds a stopping scheduler gives its queued lease statements to finish.
CONTROL_SETTLE_SECONDS = 10.0
#: Real seconds a stopping scheduler gives its async rounds to finish their bookkeeping.
TASK_SETTLE_SECONDS = 2.0
#: The exit status of a process a lost lease brings down.
EXIT_LEASE_LOST = 70
#: The embedded SQLite file used when no database is named.
DEFAULT_SQLITE_FILE = "cronjob.sqlite"
#: The environment variable naming the database.
DATABASE_ENV = "CRONJOB_DATABASE_URL"


def resolve_database(database: str | Engine | None) -> str | Engine:
    """Return ``database``, or ``$CRONJOB_DATABASE_URL``, or the embedded SQLite file."""
    if database is not None:
        return database
    return os.environ.get(DATABASE_ENV) or f"sqlite:///{DEFAULT_SQLITE_FILE}"


def _exit_process(message: str) -> None:
    logging.getLogger("cronjob").critical("%s; exiting with status %d", message, EXIT_LEASE_LOST)
    logging.shutdown()
    os._exit(EXIT_LEASE_LOST)


@dataclass(eq=False)
class _Run:
    """A round in flight on this replica."""

    state: _JobState
    ctx: Round
    token: int | None  # None for a per-instance round
    renewed_at: datetime  # clock time of the claim or of the last successful renewal
    lost_at: datetime | None = None
    ended: bool = False  # set by the worker before it records the end
    task: asyncio.Task[None] | None = None  # an async round's task, once it runs


@dataclass(eq=False)
class _JobState:
    job: Job
    generation: int = 0  # bumped to invalidate heap entries
    busy: bool = False  # claiming or running a round
    run: _Run | None = None


@dataclass(order=True)
class _Deadline:
    when: datetime
    seq: int
    run: _Run = field(compare=False)
    renewed_at: datetime | None = field(compare=False)  # None: the exit deadline

    def current(self) -> bool:
        """Whether the run is still in the state this deadline was set for."""
        run = self.run
        if run.ended:
            return False
        if self.renewed_at is None:
            return run.lost_at is not None
        return run.lost_at is None and run.renewed_at == self.renewed_at


@dataclass(order=True)
class _Due:
    when: datetime
    seq: int
    state: _JobState = field(compare=False)
    generation: int = field(compare=False)


class Scheduler:
    """Runs a registry's jobs: each leased instant once across replicas, each per-instance
    job on every replica.

    Args:
        database: A SQLAlchemy URL or :class:`~sqlalchemy.Engine` (an engine passed in is
            not disposed by the scheduler). ``None`` reads ``$CRONJOB_DATABASE_URL`` and,
            without it, uses the SQLite file ``cronjob.sqlite`` in the working directory.
        registry: The jobs to run; ``None`` for the default registry.
        clock: Where time is read and waited on; ``None`` for the system clock. Given a
            fake clock, lease times follow it too; otherwise they are the database's.
        replica_id: This replica's id in the lease table and in logs; by default
            ``host-pid-random``.
        auto_migrate: Bring the lease tables to head at start; with ``False`` a missing
            migration fails the start.
        max_workers: Threads for sync rounds running at once.
        drain_timeout: Bound, in clock seconds, on how long a drain waits for cancelled
            rounds to end.
        on_fatal: Called with a message when a round still runs 5 s after its lease was
            lost. The default logs it as critical and ends the process (status 70);
            tests pass a recorder and find the scheduler crashed.
        sql_comments: Annotate each statement a round runs on the scheduler's engine with
            the job name and trace id (see :mod:`execctx`).
        loop: An asyncio loop to run async jobs on (``cronjob.lifespan`` passes the app's);
            by default the scheduler runs its own in a thread when it has async jobs.
        tracer_provider: Where the rounds' spans go; by default OpenTelemetry's global
            provider (no spans are recorded unless an SDK is configured).

    The scheduler is a context manager: ``with Scheduler(...)`` starts it and drains and
    stops it on exit.
    """

    def __init__(
        self,
        database: str | Engine | None = None,
        *,
        registry: Registry | None = None,
        clock: Clock | None = None,
        replica_id: str | None = None,
        auto_migrate: bool = True,
        max_workers: int = DEFAULT_MAX_WORKERS,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        on_fatal: Callable[[str], None] | None = None,
        sql_comments: bool = True,
        loop: asyncio.AbstractEventLoop | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        if drain_timeout < 0:
            raise ValueError(f"drain_timeout must not be negative, got {drain_timeout}")
        self._database = resolve_database(database)
        self._registry = registry if registry is not None else default_registry
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.replica_id = replica_id or _default_replica_id()
        self._auto_migrate = auto_migrate
        self._max_workers = max_workers
        self._drain_timeout = drain_timeout
        self._on_fatal = on_fatal or _exit_process
        self._sql_comments = sql_comments
        self._given_loop = loop
        self._tracer_provider = tracer_provider

        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self._crashed = False
        self._draining = False
        self._inbox: collections.deque[Callable[[], None]] = collections.deque()
        self._wake = self._clock.event()
        self._drained = self._clock.event()
        self._ready = threading.Event()
        self._dispatcher: threading.Thread | None = None
        self._control: Workers | None = None
        self._workers: Workers | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._engine: Engine | None = None
        self._owns_engine = False
        self._store: lease.LeaseStore | None = None
        self._finisher: Finisher | None = None

        # Dispatcher state: touched only by the dispatcher thread once started.
        self._states: dict[str, _JobState] = {}
        self._leased: list[_JobState] = []  # the states of leased jobs, fixed at start
        self._leased_names: list[str] = []
        self._heap: list[_Due] = []
        self._seq = itertools.count()
        self._runs: set[_Run] = set()
        self._leased_runs = 0  # rounds in _runs that hold (or held) a lease
        # Lease deadlines (loss at renewed_at + 10 s, exit at lost_at + 5 s), checked
        # lazily: an entry whose run has moved on since it was pushed is dropped.
        self._deadlines: list[_Deadline] = []
        self._db_ready = False
        self._db_retry_at: datetime | None = None
        self._db_retry_pause = RETRY_FIRST
        self._renew_at: datetime | None = None
        self._renewing = False
        self._sweep_at: datetime | None = None
        self._sweeping = False

    def __repr__(self) -> str:
        return f"<Scheduler {self.replica_id!r} {len(self._states)} job(s)>"

    @property
    def clock(self) -> Clock:
        """The clock the scheduler reads and waits on."""
        return self._clock

    @property
    def engine(self) -> Engine | None:
        """The engine the scheduler uses, once started (``None`` with no jobs)."""
        return self._engine

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Check the database, bring the tables to head, start the loops.

        A registry with no jobs opens no connection and starts nothing. A database that
        is down is retried in the background with back-off (and logged); per-instance jobs
        run meanwhile.

        Raises:
            lease.UnsupportedDatabase: the database cannot carry leases.
            lease.MigrationRequired: ``auto_migrate=False`` and the tables are not at head.
            RuntimeError: the scheduler was already started.
        """
        with self._lock:
            if self._started:
                raise RuntimeError(f"scheduler {self.replica_id!r} was already started")
            self._started = True
        jobs = self._registry._freeze(by=repr(self.replica_id))
        if not jobs:
            log.info("no jobs registered: the scheduler starts nothing")
            self._stopped = True
            return
        self._states = {job.name: _JobState(job) for job in jobs}
        self._leased = [state for state in self._states.values() if state.job.leased]
        self._leased_names = [state.job.name for state in self._leased]
        self._connect()
        self._first_migration()
        self._control = Workers(1, "cronjob-control")
        self._workers = Workers(self._max_workers, "cronjob-round")
        if any(job.is_async for job in jobs):
            self._loop = self._given_loop or self._start_loop()
        now = self._clock.now()
        for state in self._states.values():
            self._schedule_after(state, now)
        self._clock._work_started()
        self._dispatcher = threading.Thread(
            target=self._dispatch, name=f"cronjob-dispatcher-{self.replica_id}", daemon=True
        )
        self._dispatcher.start()
        self._ready.wait()
        leased = sum(job.leased for job in jobs)
        log.info(
            "scheduler %s started: %d leased job(s), %d per-instance job(s), database %s",
            self.replica_id,
            leased,
            len(jobs) - leased,
            self._describe_database(),
        )

    def drain(self, timeout: float | None = None) -> bool:
        """Stop starting rounds, cancel the running ones with :class:`Shutdown`, and wait.

        A round whose job then raises its cancellation is cut short: its lease is given
        back and it runs a second time elsewhere. One that returns or raises its own error
        ran to its end. Rounds still running when ``timeout`` (clock seconds; default the
        scheduler's ``drain_timeout``) has passed keep their lease until it expires, so no
        other replica runs the same job at the same time.

        Returns:
            ``True`` if every round ended within the timeout.
        """
        if self._dispatcher is None or self._crashed:
            return True
        self._post(self._begin_drain)
        limit = self._drain_timeout if timeout is None else timeout
        ended = self._drained.wait(limit)
        if not ended:
            names = sorted(run.ctx.name for run in list(self._runs) if not run.ended)
            if names:
                log.error(
                    "drain: %d round(s) still running after %gs, left to their leases: %s",
                    len(names),
                    limit,
                    ", ".join(names),
                )
            else:
                log.error("drain: the ends of rounds still being recorded after %gs", limit)
        return ended

    def stop(self) -> None:
        """Drain (if not drained yet), then stop every thread the scheduler started."""
        if self._stopped:
            return
        if not self._crashed:
            self.drain()
        self._shutdown()

    def _crash(self) -> None:
        """Stop as a killed process would: no lease given back, no end recorded."""
        if self._stopped:
            return
        self._crashed = True
        for run in list(self._runs):
            run.ctx._cancel(Shutdown(f"job {run.ctx.name!r}: the replica crashed"))
        self._shutdown()

    def _shutdown(self) -> None:
        self._stopped = True
        if self._dispatcher is not None:
            self._post(lambda: None)  # wake it: it sees _stopped and returns
            if threading.current_thread() is not self._dispatcher:
                self._dispatcher.join()
        if self._control is not None:
            # Statements already queued finish (a drain's give-backs among them), unless
            # the database hangs: then the process is not held hostage.
            wait = None if self._crashed else CONTROL_SETTLE_SECONDS
            if not self._control.shutdown(wait=wait) and wait is not None:
                log.warning("lease statements still running after %gs at stop", wait)
        if self._workers is not None:
            # A round that ignored its cancellation keeps its (daemon) thread: not waited for.
            self._workers.shutdown()
        if self._finisher is not None:
            self._finisher.close()
        if self._loop_thread is not None and self._loop is not None:
            # Let rounds that already ended finish their bookkeeping, then stop the loop.
            # A round that ignored its cancellation is not waited for.
            finishing = asyncio.run_coroutine_threadsafe(_settle_tasks(), self._loop)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                finishing.result(timeout=TASK_SETTLE_SECONDS)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=TASK_SETTLE_SECONDS)
        if self._engine is not None and self._owns_engine:
            # Even after a crash: a killed process's connections close with it.
            self._engine.dispose()
        log.info("scheduler %s stopped", self.replica_id)

    # -- database -------------------------------------------------------------------------

    def _connect(self) -> None:
        if isinstance(self._database, str):
            self._engine = lease.create_engine(self._database)
            self._owns_engine = True
        else:
            self._engine = self._database
        if self._sql_comments:
            instrument(self._engine)
        self._store = lease.LeaseStore(self._engine, clock=self._clock.lease_clock())
        self._finisher = Finisher(self._store)  # ends of rounds that end together: batched
        if self._leased:
            self._store.check_dialect()

    def _describe_database(self) -> str:
        if self._engine is None:
            return "none"
        return lease.redact(self._engine.url)

    def _first_migration(self) -> None:
        try:
            self._migrate()
        except lease.DatabaseUnavailable as exc:
            log.warning(
                "database %s unavailable at start (%s); retrying in the background",
                self._describe_database(),
                exc,
            )
            self._db_retry_at = self._clock.now()
        else:
            self._db_ready = True

    def _migrate(self) -> None:
        assert self._engine is not None
        lease.migrate(self._engine, auto_migrate=self._auto_migrate)

    @property
    def _store_(self) -> lease.LeaseStore:
        assert self._store is not None
        return self._store

    # -- the dispatcher -------------------------------------------------------------------

    def _post(self, message: Callable[[], None]) -> None:
        """Hand ``message`` to the dispatcher thread and wake it."""
        self._inbox.append(message)
        self._wake.set()

    def _dispatch(self) -> None:
        with self._clock._tracked():
            try:
                if self._db_ready:
                    self._on_database_ready()
                self._ready.set()
                self._dispatch_loop()
            except BaseException:
                log.critical("the scheduler's dispatcher failed", exc_info=True)
                raise
            finally:
                self._ready.set()

    def _dispatch_loop(self) -> None:
        while True:
            self._wake.clear()
            while self._inbox:
                self._inbox.popleft()()
            if self._stopped:
                return
            now = self._clock.now()
            self._retry_database(now)
            if not self._draining:
                self._fire_due(now)
                self._maybe_sweep(now)
            self._watch_leases(now)
            self._maybe_renew(now)
            if self._draining and not self._runs:
                self._drained.set()
            wake_at = self._next_wake()
            timeout = None if wake_at is None else max(0.0, (wake_at - now).total_seconds())
            self._wake.wait(timeout)

    def _next_wake(self) -> datetime | None:
        candidates: list[datetime] = []
        while self._heap and self._heap[0].generation != self._heap[0].state.generation:
            heapq.heappop(self._heap)  # entries of jobs that were rescheduled or started
        if self._heap and not self._draining:
            candidates.append(self._heap[0].when)
        if self._db_retry_at is not None:
            candidates.append(self._db_retry_at)
        if self._renew_at is not None and not self._renewing:
            candidates.append(self._renew_at)
        if self._sweep_at is not None and not self._sweeping and not self._draining:
            candidates.append(self._sweep_at)
        while self._deadlines and not self._deadlines[0].current():
            heapq.heappop(self._deadlines)
        if self._deadlines:
            candidates.append(self._deadlines[0].when)
        return min(candidates, default=None)

    def _schedule_after(self, state: _JobState, after: datetime) -> None:
        """Put ``state``'s job back in the heap at its first instant after ``after``."""
        state.busy = False
        state.generation += 1
        when = state.job.schedule.next(after)
        if when is None:
            log.warning(
                "job %r has no instant after %s: it will not run again", state.job.name, after
            )
            return
        heapq.heappush(self._heap, _Due(when, next(self._seq), state, state.generation))

    def _fire_due(self, now: datetime) -> None:
        due: dict[datetime, list[_JobState]] = {}
        while self._heap and self._heap[0].when <= now:
            entry = heapq.heappop(self._heap)
            state = entry.state
            if entry.generation != state.generation or state.busy:
                continue
            state.busy = True
            state.generation += 1
            if not state.job.leased:
                self._start_round(state, entry.when, attempt=1, token=None, now=now)
            elif not self._db_ready:
                log.warning(
                    "job %r: instant %s skipped: the database is not reachable yet",
                    state.job.name,
                    entry.when.isoformat(),
                )
                self._schedule_after(state, entry.when)
            else:
                due.setdefault(entry.when, []).append(state)
        for instant, states in due.items():
            self._claim(instant, states)

    def _claim(self, instant: datetime, states: list[_JobState], *, catch_up: bool = False) -> None:
        """Claim ``instant`` for ``states`` in one statement, then start what was won."""
        names = [state.job.name for state in states]
        issued = self._clock.now()

        def done(result: list[lease.Claim] | BaseException) -> None:
            won: dict[str, lease.Claim] = {}
            if isinstance(result, BaseException):
                log.error(
                    "claiming %s for %d job(s) failed: %s", instant.isoformat(), len(names), result
                )
            else:
                won = {claim.name: claim for claim in result}
            for state in states:
                claim = won.get(state.job.name)
                if claim is None or self._draining or self._stopped:
                    if claim is not None:  # drain began meanwhile: hand the instant on
                        self._hand_back(claim)
                    self._schedule_after(state, max(instant, issued) if catch_up else instant)
                    continue
                if claim.superseded is not None:
                    old_instant, old_attempt = claim.superseded
                    log.warning(
                        "job %r: the unfinished round of %s (attempt %d) is given up: "
                        "instant %s started first",
                        state.job.name,
                        old_instant.isoformat(),
                        old_attempt,
                        instant.isoformat(),
                    )
                if catch_up:
                    log.info("job %r: catching up instant %s", state.job.name, instant.isoformat())
                self._start_round(state, instant, attempt=1, token=claim.token, now=issued)

        self._control_task(lambda: self._store_.claim(names, instant, self.replica_id), done)

    def _hand_back(self, claim: lease.Claim) -> None:
        """Give back a lease won just as the scheduler began to drain."""
        self._control_task(
            lambda: self._store_.give_back(claim.name, claim.token), lambda _result: None
        )

    def _control_task(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """Run ``work`` on the control thread; post ``done(result or exception)`` back."""
        assert self._control is not None

        def task() -> None:
            with self._clock._tracked():
                try:
                    result = work()
                except Exception as exc:
                    result = exc
                self._post(lambda: done(result))

        self._clock._work_started()
        try:
            self._control.submit(task)
        except RuntimeError:  # shut down meanwhile
            self._clock._work_finished()

    # -- rounds ---------------------------------------------------------------------------

    def _start_round(
        self, state: _JobState, instant: datetime, *, attempt: int, token: int | None, now: datetime
    ) -> None:
        job = state.job
        ctx = Round(
            name=job.name,
            instant=instant,
            attempt=attempt,
            replica=self.replica_id,
            trace_id="",  # set by round_scope once the round's span exists
            clock=self._clock,
            transaction=self._transaction,
        )
        run = _Run(state=state, ctx=ctx, token=token, renewed_at=now)
        state.busy = True
        state.run = run
        self._runs.add(run)
        if token is not None:
            self._leased_runs += 1
            self._watch(run)
            if self._renew_at is None:
                self._renew_at = now + timedelta(seconds=RENEW_EVERY)
        self._clock._work_started()
        try:
            if job.is_async:
                assert self._loop is not None
                asyncio.run_coroutine_threadsafe(self._round_async(run), self._loop)
            else:
                assert self._workers is not None
                self._workers.submit(lambda: self._round_sync(run))
        except RuntimeError:  # executor or loop shut down meanwhile
            self._clock._work_finished()
            self._forget(run)

    @contextlib.contextmanager
    def _round_context(self, run: _Run) -> Iterator[RoundScope]:
        """Run the block as ``run``'s unit of work, counted by the clock, and log its start."""
        with (
            self._clock._tracked(),
            round_scope(run.ctx, self.replica_id, self._tracer_provider) as scope,
        ):
            self._log_start(run)
            yield scope

    def _round_sync(self, run: _Run) -> None:
        with self._round_context(run) as scope:
            error: BaseException | None = None
            try:
                run.ctx.check()  # cancelled before it could start: cut short
                run.state.job.fn(run.ctx)
            except BaseException as exc:  # the worker's top: every outcome is recorded
                error = exc
            self._end_round(run, error, scope)

    async def _round_async(self, run: _Run) -> None:
        run.task = asyncio.current_task()
        with self._round_context(run) as scope:
            error: BaseException | None = None
            try:
                run.ctx.check()  # cancelled before it could start: cut short
                await run.state.job.fn(run.ctx)
            except BaseException as exc:  # includes the task's own cancellation
                error = exc
            await asyncio.to_thread(self._end_round, run, error, scope)

    def _log_start(self, run: _Run) -> None:
        ctx = run.ctx
        log.info(
            "round of job %r instant %s attempt %d started on %s",
            ctx.name,
            ctx.instant.isoformat(),
            ctx.attempt,
            ctx.replica,
        )

    def _end_round(self, run: _Run, error: BaseException | None, scope: RoundScope) -> None:
        """Record how the round ended, log it, and hand the job back to the dispatcher.

        Runs in the round's own context, so the log lines and the finish statement carry
        the round's trace id.
        """
        ended = self._clock.now()
        run.ended = True
        ctx = run.ctx
        outcome = classify(error)
        scope.outcome(outcome, error)
        where = f"job {ctx.name!r} instant {ctx.instant.isoformat()} attempt {ctx.attempt}"
        # A round that ran to its end has its end written by the finisher, in a batch
        # with the others ending now; the worker is free for the next round at once.
        later = outcome is not Outcome.CUT_SHORT and self._records_end(run)
        recorded = False if later else self._record_end(run, outcome, ended)
        if outcome is Outcome.SUCCEEDED:
            log.info("round of %s ran to its end", where)
        elif outcome is Outcome.FAILED:
            log.error("round of %s failed", where, exc_info=error)
        else:
            cause = ctx.cause or error
            for own in iter_own_errors(error) if error else ():
                log.error(
                    "round of %s: the job's own failure beside its cancellation",
                    where,
                    exc_info=own,
                )
            if ctx.attempt >= 2 and run.token is not None:
                log.warning(
                    "round of %s cut short a second time (%s): the instant is given up",
                    where,
                    cause,
                )
            else:
                log.info("round of %s cut short (%s)", where, cause)
        if later:
            self._finish_later(run, ended, where)
            return
        if not recorded and run.token is not None and not self._crashed:
            log.warning("round of %s: its end is not on record (the lease is gone)", where)
        self._post(lambda: self._on_round_end(run, ended))

    def _records_end(self, run: _Run) -> bool:
        return run.token is not None and not self._crashed and run.lost_at is None

    def _finish_later(self, run: _Run, ended: datetime, where: str) -> None:
        """Hand the end to the finisher; log and tell the dispatcher once it is written."""
        assert self._finisher is not None and run.token is not None
        context = contextvars.copy_context()  # the round's: its log lines keep its trace id

        def then(result: bool | BaseException) -> None:
            with self._clock._tracked():
                context.run(after, result)

        def after(result: bool | BaseException) -> None:
            if isinstance(result, BaseException):
                log.error("job %r: recording the end of its round failed: %s", run.ctx.name, result)
            if result is not True and not self._crashed:
                log.warning("round of %s: its end is not on record (the lease is gone)", where)
            self._post(lambda: self._on_round_end(run, ended))

        self._clock._work_started()
        try:
            self._finisher.finish_later(run.ctx.name, run.token, ended, then)
        except RuntimeError:  # stopped meanwhile: the end is not recorded
            then(False)

    def _record_end(self, run: _Run, outcome: Outcome, ended: datetime) -> bool:
        if run.token is None or self._crashed or run.lost_at is not None:
            return False
        try:
            if outcome is Outcome.CUT_SHORT:
                return self._store_.give_back(run.ctx.name, run.token)
            return self._store_.finish(run.ctx.name, run.token, ended=ended)
        except lease.LeaseError as exc:
            log.error("job %r: recording the end of its round failed: %s", run.ctx.name, exc)
            return False

    def _on_round_end(self, run: _Run, ended: datetime) -> None:
        self._forget(run)
        state = run.state
        if state.run is run:
            state.run = None
        if not self._stopped:
            self._schedule_after(state, ended)

    def _forget(self, run: _Run) -> None:
        if run in self._runs:
            self._runs.remove(run)
            if run.token is not None:
                self._leased_runs -= 1
                if not self._leased_runs:
                    self._renew_at = None

    @contextlib.contextmanager
    def _transaction(self, ctx: Round) -> Iterator[Connection]:
        if self._crashed:
            raise LeaseLost(f"job {ctx.name!r}: the replica crashed")
        assert self._engine is not None
        state = self._states[ctx.name]
        run = state.run
        token = run.token if run is not None and run.ctx is ctx else None
        if not state.job.leased:
            with self._engine.begin() as conn:
                yield conn
            return
        with self._engine.begin() as conn:
            if token is None or not self._store_.holds(conn, ctx.name, token):
                raise lease_lost(ctx.name, "the round no longer holds it")
            yield conn
            if not self._store_.holds(conn, ctx.name, token):
                raise lease_lost(ctx.name, "taken before the transaction committed")

    # -- leases: renewal, loss, sweep, catch-up ---------------------------------------------

    def _held(self) -> list[_Run]:
        return [r for r in self._runs if r.token is not None and not r.ended and r.lost_at is None]

    def _maybe_renew(self, now: datetime) -> None:
        if self._renew_at is None or self._renewing or now < self._renew_at:
            return
        held = self._held()
        if not held:
            self._renew_at = None
            return
        self._renewing = True
        pairs = [(run.ctx.name, run.token) for run in held if run.token is not None]

        def done(result: set[str] | BaseException) -> None:
            self._renewing = False
            if isinstance(result, BaseException):
                log.warning("renewing %d lease(s) failed: %s", len(pairs), result)
                self._renew_at = self._clock.now() + timedelta(seconds=RENEW_RETRY)
                return
            for run in held:
                if run.ended or run.lost_at is not None:
                    continue
                if run.ctx.name in result:
                    run.renewed_at = now
                    self._watch(run)
                else:
                    self._lose(run, self._clock.now(), "another claim took it")
            self._renew_at = now + timedelta(seconds=RENEW_EVERY)

        self._control_task(lambda: self._store_.renew(pairs, self.replica_id), done)

    def _watch(self, run: _Run) -> None:
        """Set the deadline that follows from ``run``'s lease as it stands now."""
        if run.lost_at is None:
            when, renewed_at = run.renewed_at + timedelta(seconds=LOST_AFTER), run.renewed_at
        else:
            when, renewed_at = self._exit_deadline(run), None
        heapq.heappush(self._deadlines, _Deadline(when, next(self._seq), run, renewed_at))

    def _exit_deadline(self, run: _Run) -> datetime:
        """When a round still running after its lease was lost ends the process: 5 s after
        the loss, but before the lease can expire (counted from the last successful claim
        or renewal, as issued, so the lease's own expiry is later still)."""
        assert run.lost_at is not None
        expires = run.renewed_at + timedelta(seconds=self._store_.ttl - EXIT_MARGIN)
        return min(run.lost_at + timedelta(seconds=EXIT_AFTER_LOST), expires)

    def _watch_leases(self, now: datetime) -> None:
        while self._deadlines and self._deadlines[0].when <= now:
            deadline = heapq.heappop(self._deadlines)
            if not deadline.current():
                continue
            run = deadline.run
            if run.lost_at is None:
                self._lose(run, now, f"no successful renewal for {LOST_AFTER:g} s")
            else:
                self._fatal(run)
                return

    def _lose(self, run: _Run, now: datetime, reason: str) -> None:
        run.lost_at = now
        self._watch(run)
        log.error(
            "job %r instant %s: lease lost (%s); cancelling the round",
            run.ctx.name,
            run.ctx.instant.isoformat(),
            reason,
        )
        self._cancel(run, lease_lost(run.ctx.name, reason))

    def _fatal(self, run: _Run) -> None:
        assert run.lost_at is not None
        after = (self._exit_deadline(run) - run.lost_at).total_seconds()
        message = (
            f"job {run.ctx.name!r} instant {run.ctx.instant.isoformat()}: the round is still "
            f"running {after:g} s after its lease was lost; another replica may "
            "run the job by now"
        )
        log.critical(message)
        self._crashed = True
        on_fatal = self._on_fatal
        # Stop as a dead process would, then report (the default ends the process).
        threading.Thread(target=self._crash, name="cronjob-fatal", daemon=True).start()
        on_fatal(message)

    def _cancel(self, run: _Run, cause: LeaseLost | Shutdown) -> None:
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

    def _maybe_sweep(self, now: datetime) -> None:
        if not self._db_ready or self._sweeping or self._sweep_at is None or now < self._sweep_at:
            return
        names = self._leased_names
        self._sweeping = True

        def done(result: list[lease.CutShort] | BaseException) -> None:
            self._sweeping = False
            self._sweep_at = self._clock.now() + timedelta(seconds=SWEEP_EVERY)
            if isinstance(result, BaseException):
                log.warning("sweep for rounds cut short failed: %s", result)
                return
            for found in result:
                state = self._states.get(found.name)
                if state is None or state.busy or self._draining:
                    continue
                self._rerun(state, found.instant)

        self._control_task(lambda: self._store_.find_cut_short(names), done)

    def _rerun(self, state: _JobState, instant: datetime) -> None:
        state.busy = True
        state.generation += 1
        issued = self._clock.now()

        def done(result: lease.Claim | BaseException | None) -> None:
            if isinstance(result, BaseException) or result is None or self._draining:
                if isinstance(result, BaseException):
                    log.error("job %r: claiming the second run failed: %s", state.job.name, result)
                elif result is not None:
                    self._hand_back(result)
                self._schedule_after(state, issued)
                return
            log.info(
                "job %r: running the round of %s a second time (it was cut short)",
                state.job.name,
                instant.isoformat(),
            )
            self._start_round(state, instant, attempt=2, token=result.token, now=issued)

        self._control_task(
            lambda: self._store_.claim_rerun(state.job.name, instant, self.replica_id), done
        )

    def _retry_database(self, now: datetime) -> None:
        if self._db_retry_at is None or now < self._db_retry_at:
            return
        self._db_retry_at = None

        def done(result: BaseException | None) -> None:
            if isinstance(result, BaseException):
                pause = self._db_retry_pause
                self._db_retry_pause = min(pause * 2, RETRY_LONGEST)
                log.warning("database still unavailable (%s); next attempt in %gs", result, pause)
                self._db_retry_at = self._clock.now() + timedelta(seconds=pause)
                return
            log.info("database %s reached", self._describe_database())
            self._db_ready = True
            self._on_database_ready()

        self._control_task(self._migrate, done)

    def _on_database_ready(self) -> None:
        """Catch up what start-up owes, then start sweeping (statements run in order)."""
        leased, names = self._leased, self._leased_names
        if not leased:
            return
        now = self._clock.now()

        def read() -> dict[str, lease.LeaseRow]:
            self._store_.ensure(names)
            return self._store_.read(names)

        def done(result: dict[str, lease.LeaseRow] | BaseException) -> None:
            if isinstance(result, BaseException):
                log.error("reading the lease table for catch-up failed: %s", result)
            else:
                self._catch_up(leased, result, now)
            self._sweep_at = self._clock.now()

        self._control_task(read, done)

    def _catch_up(
        self, leased: Sequence[_JobState], rows: dict[str, lease.LeaseRow], now: datetime
    ) -> None:
        """Claim each job's most recent instant that start-up owes it (the seed's rule)."""
        latest = now.replace(microsecond=0) + timedelta(seconds=1)  # instants <= now
        owed: dict[datetime, list[_JobState]] = {}
        for state in leased:
            row = rows.get(state.job.name)
            if row is None or row.instant is None or state.busy:
                continue  # never ran: it starts with its next instant
            instant = state.job.schedule.prev(latest)
            if instant is None or now - instant > CATCH_UP_HORIZON:
                continue  # history, not a missed round
            if row.instant >= instant:
                continue  # claimed already
            if row.skipped_through is not None and instant <= row.skipped_through:
                continue  # overrun by a round that ran to its end
            state.busy = True
            state.generation += 1
            owed.setdefault(instant, []).append(state)
        for instant, states in owed.items():
            self._claim(instant, states, catch_up=True)

    # -- drain ----------------------------------------------------------------------------

    def _begin_drain(self) -> None:
        if self._draining:
            return
        self._draining = True
        for run in list(self._runs):
            self._cancel(run, Shutdown(f"job {run.ctx.name!r}: the scheduler is draining"))

    # -- asyncio --------------------------------------------------------------------------

    def _start_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()

        self._loop_thread = threading.Thread(target=serve, name="cronjob-asyncio", daemon=True)
        self._loop_thread.start()
        started.wait()
        return loop


async def _settle_tasks() -> None:
    """Wait (a little, in real time) for the loop's other tasks to finish."""
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    if others:
        await asyncio.wait(others, timeout=TASK_SETTLE_SECONDS)


def _default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
