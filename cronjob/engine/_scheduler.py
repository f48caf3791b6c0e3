"""The scheduler: the façade that wires the parts and holds the lifecycle.

``Scheduler`` checks the database, has the parts built and wired (``_wiring``; see the
package docstring, "Threads", and docs/architecture.md), starts the dispatcher thread,
and drains and stops them. The rules themselves live in the parts: `_dispatcher`
(instants), `_inflight` (rounds in flight), `_claiming` (claims), `_runner` (rounds),
`_ends` (their ends), `_keeper` (renewal, loss, forced exit), `_recovery` (database
retry, catch-up, the sweep, the wings). The options' defaults and checks are
`_options`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self

import lease

from .._clock import Clock, SystemClock
from .._exceptions import Shutdown
from .._history import History
from .._occurrence import resolve_app
from .._registry import Job, Registry, Task, default_registry
from ._control import Control, Inbox
from ._database import connect, resolve_database, warn_if_embedded
from ._dispatcher import Dispatcher
from ._failures import Hooks, check_history
from ._keeper import exit_process
from ._options import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_HISTORY,
    DEFAULT_MAX_WORKERS,
    check_options,
    default_replica_id,
)
from ._recovery import Recovery
from ._runner import RoundRunner
from ._state import Flags
from ._wiring import wire_core, wire_rounds

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["Scheduler"]

log = logging.getLogger("cronjob")

#: Real seconds a stopping scheduler gives its queued lease statements to finish.
CONTROL_SETTLE_SECONDS = 10.0


class Scheduler:
    """Runs a registry's jobs: each leased instant once across replicas, each per-instance
    job on every replica.

    Args:
        database: A SQLAlchemy URL, `Engine` or
            `AsyncEngine` (an engine passed in is not
            disposed by the scheduler). ``None`` reads ``$CRONJOB_DATABASE_URL`` and,
            without it, uses the SQLite file ``cronjob.sqlite`` in the working directory.
            An ``AsyncEngine`` or an async URL (``postgresql+asyncpg://…``) serves the
            jobs' ``ctx.transaction_async()``; the lease statements then run on a sync
            engine the scheduler makes on the same URL with the sync driver (psycopg,
            sqlite3, PyMySQL) through [lease.create_engine][].
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
            the job name and trace id (see [execctx][]).
        loop: An asyncio loop to run async jobs on. ``async with`` (and so
            ``cronjob.lifespan``) uses the loop that enters it; otherwise, by default, the
            scheduler runs its own in a thread when it has async jobs.
        tracer_provider: Where the rounds' spans go; by default OpenTelemetry's global
            provider (no spans are recorded unless an SDK is configured).
        meter_provider: Where the scheduler's metrics go (see
            ``cronjob.engine._metrics``); by default OpenTelemetry's global provider.
        history: How long the round history (``cronjob history NAME``) keeps rounds, see
            [History][cronjob.History]; ``None`` keeps none. Each job's state (last outcome, last
            error, failures in a row, ...) is on record either way.
        app: The application's name, in every occurrence id its rounds hand on
            ([occurrence_id][cronjob.occurrence_id]); ``None`` reads ``$CRONJOB_APP``,
            and without it ``""``, the ids of the releases that had no ``app``.

    The scheduler is a context manager: ``with Scheduler(...)`` starts it and drains and
    stops it on exit; ``async with`` does the same from a coroutine (start and stop in a
    thread) and runs async jobs on that loop (an ASGI lifespan). It starts once.

    Besides the registry's jobs it runs the schedules made of data of the registry's
    tasks (see `cronjob.schedules`), following their changes while it runs.
    """

    def __init__(
        self,
        database: str | Engine | AsyncEngine | None = None,
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
        meter_provider: MeterProvider | None = None,
        history: History | None = DEFAULT_HISTORY,
        app: str | None = None,
    ) -> None:
        #: The application's name in its rounds' occurrence ids (``$CRONJOB_APP``, "").
        self.app = resolve_app(app)
        check_options(history=history, max_workers=max_workers, drain_timeout=drain_timeout)
        self._database = resolve_database(database)
        self._registry = registry if registry is not None else default_registry
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.replica_id = lease.check_holder(replica_id or default_replica_id())
        self._auto_migrate = auto_migrate
        self._max_workers = max_workers
        self._drain_timeout = drain_timeout
        self._on_fatal = on_fatal or exit_process
        self._sql_comments = sql_comments
        self._given_loop = loop
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._history = history

        self._lock = threading.Lock()
        self._started = False
        self._start_done = False  # start() returned normally
        self._stopping = False  # drain() or stop() was called
        self._recovery: Recovery | None = None
        self._flags = Flags()
        self._engine: Engine | None = None
        self._owns_engine = False
        self._async_engine: AsyncEngine | lease.LeaseError | None = None
        self._owns_async_engine = False
        self._jobs = 0
        self._tasks: dict[str, Task] = {}
        # The parts, built at start (none with no jobs).
        self._inbox: Inbox | None = None
        self._control: Control | None = None
        self._dispatcher: Dispatcher | None = None
        self._runner: RoundRunner | None = None
        self._hooks: Hooks | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<Scheduler {self.replica_id!r} {self._jobs} job(s)>"

    @property
    def clock(self) -> Clock:
        """The clock the scheduler reads and waits on."""
        return self._clock

    @property
    def _lingering(self) -> bool:
        """Whether ``stop`` returned with rounds still running, their leases kept."""
        return self._dispatcher is not None and self._dispatcher.lingering

    @property
    def _crashed(self) -> bool:
        """Whether the scheduler stopped as a killed process would (tests read it)."""
        return self._flags.crashed

    @property
    def ready(self) -> bool:
        """Whether this replica is up: started, and its database reached with the lease
        tables at head; ``False`` before [start][cronjob.Scheduler.start], while a database
        that was down at start has not been reached yet, once a drain or stop began, and
        after a crash.

        For a readiness probe; safe to read from any thread. A scheduler with no jobs is
        ready once started (it needs no database). An outage *after* start does not
        clear it: rounds then follow the lease rules, and the replica catches up.
        """
        if not self._start_done or self._stopping or self._flags.crashed:
            return False
        if self._jobs == 0:
            return True
        recovery = self._recovery
        return recovery is not None and recovery.db_ready and not self._flags.stopped

    @property
    def database_error(self) -> str | None:
        """Why the database has not been reached since start (password hidden), or
        ``None``. Safe to read from any thread."""
        recovery = self._recovery
        if recovery is None or recovery.db_ready:
            return None
        return recovery.database_error

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

    async def __aenter__(self) -> Self:
        if self._given_loop is None:
            self._given_loop = asyncio.get_running_loop()
        starting = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            # start() goes on in its thread: let it end, then stop what it started, so a
            # cancelled ``async with`` leaves no scheduler running with nobody to stop it.
            with contextlib.suppress(Exception):
                await starting
                await asyncio.to_thread(self.stop)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    def start(self) -> None:
        """Check the database, bring the tables to head, start the loops.

        A registry with no jobs opens no connection and starts nothing. A database that
        is down is retried in the background with back-off (and logged); per-instance jobs
        run meanwhile ([ready][cronjob.Scheduler.ready] tells when it is reached). A failed
        start leaves nothing running and the engine it created disposed.

        Raises:
            lease.DatabaseRefused: the server answered and refused: the database does not
                exist, the credentials were refused, or a privilege is missing (waiting
                would not heal it, so it is not retried).
            lease.UnsupportedDatabase: the database cannot carry leases.
            lease.MigrationRequired: ``auto_migrate=False`` and the tables are not at head.
            RuntimeError: the scheduler was already started.
            ValueError: a job's ``pause_after_failures`` cannot be counted: the scheduler
                keeps no history, or too few rounds per job (see `_failures`).
        """
        with self._lock:
            if self._started:
                raise RuntimeError(f"scheduler {self.replica_id!r} was already started")
            self._started = True
        jobs = self._registry._freeze(by=repr(self.replica_id))
        self._tasks = {task.name: task for task in self._registry.tasks}
        if not jobs and not self._tasks:
            log.warning("no jobs registered: the scheduler starts nothing")
            self._flags.stopped = True
            self._start_done = True
            return
        warn_if_embedded(self._database)
        self._jobs = len(jobs) + len(self._tasks)
        try:
            self._start(jobs)
        except BaseException:
            self._abandon_start()
            raise
        self._start_done = True

    def _start(self, jobs: tuple[Job, ...]) -> None:
        check_history(jobs, self._history)
        leased = sum(job.leased for job in jobs)
        tasks = self._tasks
        is_async = any(job.is_async for job in jobs) or any(t.is_async for t in tasks.values())
        engine, store = self._connect(check_dialect=leased > 0 or bool(tasks), async_jobs=is_async)
        clock = self._clock
        core = wire_core(
            clock=clock,
            replica_id=self.replica_id,
            jobs=jobs,
            tasks=tasks,
            store=store,
            flags=self._flags,
            max_workers=self._max_workers,
            meter_provider=self._meter_provider,
            migrate=self._migrate,
            describe_database=self._describe_database,
            history=self._history is not None,
        )
        inbox, self._inbox, self._control = core.inbox, core.inbox, core.control
        dispatcher, recovery = core.dispatcher, core.recovery
        self._recovery = recovery
        recovery.first_migration()
        self._runner, self._hooks = wire_rounds(
            core,
            replica_id=self.replica_id,
            registry=self._registry,
            engine=engine,
            tasks=tasks,
            max_workers=self._max_workers,
            loop=self._given_loop,
            needs_loop=is_async,
            tracer_provider=self._tracer_provider,
            async_engine=self._async_engine,
            owns_async_engine=self._owns_async_engine,
            history=self._history,
            app=self.app,
            crash=self._crash,
            on_fatal=self._on_fatal,
            on_lost=recovery.sweeper.rows.lost,
        )
        now = clock.now()
        for state in core.states.values():
            dispatcher.schedule_after(state, now)
        if any(job.run_at_start for job in jobs):
            inbox.post(dispatcher.run_at_start)  # the dispatcher's first message
        self._dispatcher = dispatcher
        dispatcher.after_lingering = self._teardown
        clock._work_started()
        self._thread = threading.Thread(
            target=dispatcher.serve, name=f"cronjob-dispatcher-{self.replica_id}", daemon=True
        )
        self._thread.start()
        dispatcher.wait_ready()
        started = "scheduler %s started: %d leased job(s), %d per-instance job(s), %d task(s)"
        database = self._describe_database()
        args = (self.replica_id, leased, len(jobs) - leased, len(tasks), database)
        log.info(started + ", database %s", *args)

    def drain(self, timeout: float | None = None) -> bool:
        """Stop starting rounds, cancel the running ones with [Shutdown][cronjob.Shutdown],
        and wait.

        A round whose job then raises its cancellation is cut short: its lease is given
        back and it runs a second time elsewhere. One that returns or raises its own error
        ran to its end. Rounds still running when ``timeout`` (clock seconds; default the
        scheduler's ``drain_timeout``) has passed keep their lease until it expires, so no
        other replica runs the same job at the same time.

        Returns:
            ``True`` if every round ended within the timeout.
        """
        self._stopping = True
        dispatcher, inbox = self._dispatcher, self._inbox
        if dispatcher is None or inbox is None or self._flags.crashed:
            return True
        inbox.post(dispatcher.begin_drain)
        limit = self._drain_timeout if timeout is None else timeout
        ended = dispatcher.drained.wait(limit)
        if not ended:
            names = sorted(run.ctx.name for run in list(dispatcher.runs) if not run.ended)
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
        """Drain (if not drained yet), then stop every thread the scheduler started.

        Rounds that ignored the drain and still run keep their leases, so that no other
        replica runs the same job alongside them: ``stop`` returns, but the dispatcher
        and control threads go on renewing those leases (and enforcing their loss and
        forced exit) until the rounds end, then stop themselves. A process that exits
        ends them with it, and the leases expire as a killed process's do.
        """
        self._stopping = True
        if self._flags.stopped:
            return
        if not self._flags.crashed:
            self.drain()
        self._shutdown()

    def _crash(self) -> None:
        """Stop as a killed process would: no lease given back, no end recorded."""
        if self._flags.stopped:
            return
        self._flags.crashed = True
        if self._dispatcher is not None:
            for run in list(self._dispatcher.runs):
                run.ctx._cancel(Shutdown(f"job {run.ctx.name!r}: the replica crashed"))
        self._shutdown()

    def _abandon_start(self) -> None:
        """Undo a start that raised before the dispatcher thread ran: nothing stays."""
        self._flags.stopped = True
        if self._control is not None:
            self._control.shutdown(wait=0)
        if self._engine is not None and self._owns_engine:
            self._engine.dispose()

    def _shutdown(self) -> None:
        self._flags.stopped = True
        dispatcher, inbox = self._dispatcher, self._inbox
        if self._thread is not None and dispatcher is not None and inbox is not None:
            inbox.post(lambda: None)  # wake it: it sees `stopped` and returns, or lingers
            if threading.current_thread() is not self._thread:
                dispatcher.decided.wait()
                if dispatcher.lingering:
                    return  # it calls _teardown itself once the rounds end
                self._thread.join()
        self._teardown()

    def _teardown(self) -> None:
        if self._dispatcher is not None:
            # A clean stop takes the replica's record off the table, as the last of the
            # statements below: it leaves the live list at once (a crash does not).
            self._dispatcher.recovery.close(leave=not self._flags.crashed)
        if self._control is not None:
            # Statements already queued finish (a drain's give-backs among them, and the
            # record's delete), unless the database hangs: then the process is not held
            # hostage.
            wait = None if self._flags.crashed else CONTROL_SETTLE_SECONDS
            if not self._control.shutdown(wait=wait) and wait is not None:
                log.warning("lease statements still running after %gs at stop", wait)
        if self._runner is not None:
            self._runner.shutdown()
        if self._hooks is not None:
            # Bounded: a hook that hangs is left to its daemon thread (see _failures).
            self._hooks.close()
        if self._engine is not None and self._owns_engine:
            # Even after a crash: a killed process's connections close with it.
            self._engine.dispose()
        log.info("scheduler %s stopped", self.replica_id)

    # -- database -------------------------------------------------------------------------

    def _connect(
        self, *, check_dialect: bool, async_jobs: bool = False
    ) -> tuple[Engine, lease.LeaseStore]:
        """Make or take the engines (see `_database`); return the lease statements'
        engine and its store."""
        engines = connect(
            self._database,
            clock=self._clock,
            sql_comments=self._sql_comments,
            check_dialect=check_dialect,
            async_jobs=async_jobs,
        )
        self._engine, self._owns_engine = engines.engine, engines.owns_engine
        self._async_engine = engines.async_engine
        self._owns_async_engine = engines.owns_async_engine
        return engines.engine, engines.store

    def _describe_database(self) -> str:
        return "none" if self._engine is None else lease.redact(self._engine.url)

    def _migrate(self) -> None:
        assert self._engine is not None
        lease.migrate(self._engine, auto_migrate=self._auto_migrate)
