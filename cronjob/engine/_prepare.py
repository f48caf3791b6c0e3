"""The start of a round: its ``Round`` and ``Run`` built, its fenced transactions wired.

`RoundMaker` builds what one round is made of (on the dispatcher's thread, or the
sweep's and policies' callbacks there): the [Round][cronjob.Round] its job sees and
the `Run` the parts keep of it. The round is not started:
the runner does that (`cronjob.engine._runner.RoundRunner.submit_many`). The fenced
transactions every round is handed (``ctx.transaction()``, ``ctx.transaction_async()``,
the fence check, the group writes of hand-off records) are made once and run on the
round's own thread (the group writes on the thread of the round that writes the group);
each finds its round's ``Run`` on the round itself (`run_of`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, cast

import lease

from .._clock import Clock
from .._exceptions import LeaseLost
from .._round import Round, Trigger, lease_lost
from ._fencing import Fencing
from ._state import JobState, Reason, Run, pin

if TYPE_CHECKING:
    from sqlalchemy import Connection, Dialect, Select
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["RoundMaker", "run_of"]


class RoundMaker:
    """Builds rounds (see `prepare`).

    Args:
        clock: The scheduler's clock, on each round.
        replica_id: This replica's id, on each round.
        fencing: The fenced transactions' checks (see `cronjob.engine._fencing`).
        app: The application's name, on each round (its occurrence ids).
    """

    def __init__(self, *, clock: Clock, replica_id: str, fencing: Fencing, app: str = "") -> None:
        self._clock = clock
        self._app = app
        self._replica_id = replica_id

        # A round's fenced transactions and fence check, made once for every round: each
        # finds its Run on the round itself (thousands of rounds a second at scale).
        def transaction(ctx: Round) -> contextlib.AbstractContextManager[Connection]:
            return fencing.transaction(run_of(ctx))

        def writes(
            rounds: Sequence[Round], work: Callable[[Connection, list[bool]], None]
        ) -> list[Exception | None]:
            return fencing.write_many([_run_or_lost(ctx) for ctx in rounds], work)

        def transaction_async(
            ctx: Round,
        ) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
            return fencing.transaction_async(run_of(ctx))

        def fence(
            ctx: Round, dialect: Dialect, fetch: Callable[[Select[int]], bool], final: bool
        ) -> None:
            fencing.check(run_of(ctx), dialect, fetch, final=final)

        self._transaction = transaction
        self._writes = writes
        self._transaction_async = transaction_async
        self._fence = fence

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
        round carries its ``request``. The round runs its descriptor, pinned now (see
        `cronjob.engine._pinned.pin`), whatever becomes of ``state.job`` after."""
        pinned = pin(state, instant, requested=request is not None)
        ctx = Round(
            name=pinned.name,
            instant=instant,
            attempt=attempt,
            replica=self._replica_id,
            trace_id="",  # set by round_scope once the round's span exists
            clock=self._clock,
            transaction=self._transaction,
            transaction_async=self._transaction_async,
            fence=self._fence,
            writes=self._writes,
            trigger=(
                Trigger.SCHEDULE
                if request is None
                else Trigger.BACKFILL
                if request.backfill
                else Trigger.MANUAL
            ),
            requested_by=None if request is None else request.requested_by,
            why=reason.word,
            task=pinned.task,
            args=pinned.args,
            app=self._app,
        )
        run = Run(
            state=state,
            ctx=ctx,
            pinned=pinned,
            token=token,
            reason=reason,
            renewed_at=claimed_at,
            claimed_mono=claimed_at,
            request=request,
            queued_mono=self._clock.monotonic(),
        )
        # A leased round's Round knows its Run weakly: no cycle, so the pair is freed as
        # soon as the round is over, not by the cyclic garbage collector (thousands of
        # pairs a second at scale, each a full collection's work). See run_of.
        ctx._run = run if token is None else weakref.ref(run)
        ctx._schedule = pinned.schedule
        owed = state.owed
        if owed is not None and owed.instant == instant:
            ctx._owed, ctx._takes_over, state.owed = owed.instants, owed.takes_over, None
        return run


def _run_or_lost(ctx: Round) -> Run | LeaseLost:
    """`run_of` ``ctx``, or the `LeaseLost` it raises."""
    try:
        return run_of(ctx)
    except LeaseLost as exc:
        return exc


def run_of(ctx: Round) -> Run:
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
