"""Tools for testing code that uses `cronjob` without waiting for real time.

``FakeClock`` drives every scheduler that shares it; ``crash`` stops a scheduler as a
killed process would; ``make_round`` builds the round a job receives, to call the job
itself in a unit test without a scheduler; ``record_rounds`` derives a registry whose
jobs note each round they run as a ``RanRound``. The pytest plugin
(`cronjob.pytest_plugin`) wraps them in fixtures. A lost lease's forced exit is observed by
passing ``on_fatal`` to the scheduler::

    exits = []
    with cronjob.Scheduler(url, registry=reg, clock=clock, on_fatal=exits.append) as s:
        ...
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ._clock import Clock
from ._exceptions import Cancelled
from ._fakeclock import FakeClock as FakeClock
from ._records import Why
from ._registry import Job, Registry
from ._round import Outcome, Round, Trigger, classify
from .engine import Scheduler, is_async_engine

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["FakeClock", "RanRound", "crash", "make_round", "record_rounds"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RanRound:
    """One round a job ran, as [record_rounds][cronjob.testing.record_rounds] notes it.

    Attributes:
        job: The job's name.
        instant: The scheduled instant (aware UTC).
        attempt: 1, or 2 for the second run of a round cut short.
        replica: The replica that ran it.
        outcome: How the job ended, classified as the scheduler classifies it.
    """

    job: str
    instant: datetime
    attempt: int
    replica: str
    outcome: Outcome


def record_rounds(registry: Registry, into: list[RanRound]) -> Registry:
    """Derive a registry whose jobs append a [RanRound][cronjob.testing.RanRound] to
    ``into`` as they end.

    Each job runs as registered (same name, schedule, kind); when it returns or raises,
    its round is appended to ``into`` (from the round's thread), then what it raised
    propagates. A job that never ends (a crashed replica's, still running) is not noted.
    """

    def wrap(job: Job) -> Callable[..., Any]:
        fn = job.fn

        def note(ctx: Round, error: BaseException | None) -> None:
            into.append(
                RanRound(
                    job=ctx.name,
                    instant=ctx.instant,
                    attempt=ctx.attempt,
                    replica=ctx.replica,
                    outcome=classify(error),
                )
            )

        if job.is_async:

            async def recorded_async(ctx: Round) -> None:
                try:
                    await fn(ctx)
                except BaseException as exc:
                    note(ctx, exc)
                    raise
                note(ctx, None)

            return recorded_async

        def recorded(ctx: Round) -> None:
            try:
                fn(ctx)
            except BaseException as exc:
                note(ctx, exc)
                raise
            note(ctx, None)

        return recorded

    return registry.derive(replace={job.name: wrap(job) for job in registry.jobs})


def make_round(
    name: str,
    instant: datetime,
    *,
    engine: Engine | AsyncEngine | None = None,
    attempt: int = 1,
    replica: str = "test",
    clock: Clock | None = None,
    cancelled: Cancelled | None = None,
    why: Why = Why.SCHEDULE,
) -> Round:
    """Build the round a job receives, to call the job directly in a unit test.

    ``ctx.transaction()`` (or ``ctx.transaction_async()`` with an ``AsyncEngine``) is a
    plain transaction on ``engine``: no lease, so no fencing. ``ctx.wait`` runs on
    ``clock`` (a ``FakeClock`` starting at ``instant`` by default). ``cancelled`` (a
    [Shutdown][cronjob.Shutdown] or [LeaseLost][cronjob.LeaseLost]) cancels the round up
    front, to test what the job does then. ``why`` is the round's
    [Round.why][cronjob.Round] (a catch-up, a retry, …; its ``trigger`` follows), to
    test a job's branch on it.

    Raises:
        ValueError: ``instant`` is naive.
    """
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"make_round needs an aware instant, got naive {instant!r}")
    instant = instant.astimezone(UTC)

    @contextlib.contextmanager
    def transaction(ctx: Round) -> Iterator[Connection]:
        from sqlalchemy import Engine

        if not isinstance(engine, Engine):
            raise RuntimeError(f"make_round({name!r}) was given no (sync) engine")
        with engine.begin() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def transaction_async(ctx: Round) -> AsyncIterator[AsyncConnection]:
        if not is_async_engine(engine):
            raise RuntimeError(f"make_round({name!r}) was given no AsyncEngine")
        async with engine.begin() as conn:
            yield conn

    ctx = Round(
        name=name,
        instant=instant,
        attempt=attempt,
        replica=replica,
        trace_id="0" * 32,
        clock=clock if clock is not None else FakeClock(instant),
        transaction=transaction,
        transaction_async=transaction_async,
        why=why,
        # The trigger that goes with it: an operator's for a manual round or a backfill.
        trigger=Trigger(why.value) if why in (Why.MANUAL, Why.BACKFILL) else Trigger.SCHEDULE,
    )
    if cancelled is not None:
        ctx._cancel(cancelled)
    return ctx


def crash(scheduler: Scheduler) -> None:
    """Stop ``scheduler`` as a killed process would.

    No lease is given back and no round's end is recorded; renewals stop. Rounds still
    running are told to stop (so test threads end) but whatever they do afterwards is not
    recorded and their fenced transactions are refused. Lease expiry and the other
    replicas' sweeps then play out on the clock.
    """
    scheduler._crash()
