"""A round's fenced transactions: ``ctx.transaction()`` and ``ctx.transaction_async()``,
and the group writes of many rounds in one (``Fencing.write_many``: hand-off records).

For a leased round, the transaction checks, inside itself, that the round still holds its
lease (its fencing token) when it opens and again just before it commits, and refuses
with [LeaseLost][cronjob.LeaseLost] once it does not; a crashed replica's transactions are
refused too, as a killed process's would die. A per-instance round gets a plain
transaction. The async form runs the same checks on the async engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import lease

from .._exceptions import LeaseLost, TimedOut
from .._round import lease_lost
from ._state import Flags, Run

if TYPE_CHECKING:
    from sqlalchemy import Connection, Dialect, Engine, Select
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["Fencing"]

log = logging.getLogger("cronjob")

#: Real seconds given to dispose an async engine we own on its loop.
DISPOSE_SECONDS = 2.0


class Fencing:
    """Opens the fenced transactions of rounds.

    Args:
        engine: The sync engine (``ctx.transaction()``).
        async_engine: The async engine (``ctx.transaction_async()``), the error saying
            why there is none, or ``None``.
        owns_async_engine: The scheduler made the async engine (and so disposes it).
        store: The lease store (its ``holds`` checks).
        flags: The scheduler's life flags (a crash refuses every transaction).
    """

    def __init__(
        self,
        *,
        engine: Engine,
        async_engine: AsyncEngine | lease.LeaseError | None,
        owns_async_engine: bool,
        store: lease.LeaseStore,
        flags: Flags,
    ) -> None:
        self._engine = engine
        self._async_engine = async_engine
        self._owns_async_engine = owns_async_engine
        self._store = store
        self._flags = flags

    @contextlib.contextmanager
    def transaction(self, run: Run) -> Iterator[Connection]:
        """Open ``run``'s ``ctx.transaction()``.

        Raises:
            LeaseLost: the lease is gone when it opens or before it commits (the block's
                work is rolled back), or the replica crashed.
            TimedOut: the round ran past its job's timeout (at the start or before it
                commits; rolled back).
        """
        ctx = run.ctx
        if self._flags.crashed:
            raise LeaseLost(f"job {ctx.name!r}: the replica crashed")
        _refuse_timed_out(run)
        if run.token is None:  # a per-instance round: a plain transaction
            with self._engine.begin() as conn:
                yield conn
            return
        with self._engine.begin() as conn:
            if run.ended or not self._store.holds(conn, ctx.name, run.token):
                raise lease_lost(ctx.name, "the round no longer holds it")
            yield conn
            if self._flags.crashed:  # as a killed process's would, the transaction dies
                raise LeaseLost(f"job {ctx.name!r}: the replica crashed")
            _refuse_timed_out(run)
            if not self._store.holds(conn, ctx.name, run.token, final=True):
                raise lease_lost(ctx.name, "taken before the transaction committed")

    def write_many(
        self, runs: Sequence[Run | LeaseLost], work: Callable[[Connection, list[bool]], None]
    ) -> list[Exception | None]:
        """Write for many rounds in one transaction, fenced by one check of all their
        leases (a hand-off's group record, `cronjob.contrib._records`).

        Each round is refused as `transaction` refuses it (the replica crashed, its
        timeout cancelled it, it ended, its lease is gone); ``runs`` may carry a round's
        refusal already (a ``ctx`` whose round is over). Then one statement checks the
        leases of the others and locks their rows until the commit
        ([lease.LeaseStore.holds_many][], under
        [locking_held][lease.LeaseStore.locking_held]): no claim can take one before
        it, so ``work`` may write after the check. ``work(conn, holding)`` is called once,
        in the transaction, ``holding[i]`` telling whether ``runs[i]`` may write; the
        transaction commits after it unless the replica crashed meanwhile. Nothing is
        opened when no round may write.

        Returns:
            For each round, in order: ``None`` (what ``work`` wrote for it committed), or
            what the round raises: `LeaseLost` (lease gone, ended, or the replica
            crashed) or `TimedOut`, and nothing was written for it; or the error that
            failed the check, ``work`` or the commit (every round not refused before it
            gets it, as its own transaction would have failed; nothing is written). A
            ``BaseException`` that is not an ``Exception`` propagates.
        """
        fates: list[Exception | None] = [
            run if isinstance(run, LeaseLost) else _refusal(run, self._flags.crashed)
            for run in runs
        ]
        fenced = [
            (i, run) for i, run in enumerate(runs) if fates[i] is None and isinstance(run, Run)
        ]
        if not fenced:
            return fates
        leases = [(run.ctx.name, run.token) for _, run in fenced if run.token is not None]
        try:
            with self._store.locking_held(), self._engine.begin() as conn:
                held = self._store.holds_many(conn, leases, lock=True)
                for i, run in fenced:
                    if run.token is not None and (run.ctx.name, run.token) not in held:
                        fates[i] = lease_lost(run.ctx.name, "the round no longer holds it")
                work(conn, [fate is None for fate in fates])
                if self._flags.crashed:  # as a killed process's would, the transaction dies
                    raise _Crashed
        except _Crashed:
            for i, run in fenced:
                if fates[i] is None:
                    fates[i] = LeaseLost(f"job {run.ctx.name!r}: the replica crashed")
        except Exception as exc:  # each round raises it, as its own transaction would have
            for i, _run in fenced:
                if fates[i] is None:
                    fates[i] = exc
        return fates

    @contextlib.asynccontextmanager
    async def transaction_async(self, run: Run) -> AsyncIterator[AsyncConnection]:
        """`transaction` on the async engine: the same checks, awaited."""
        ctx = run.ctx
        if self._flags.crashed:
            raise LeaseLost(f"job {ctx.name!r}: the replica crashed")
        engine = self._async_engine
        if engine is None:
            raise RuntimeError(f"job {ctx.name!r}: the scheduler has no async engine")
        if isinstance(engine, lease.LeaseError):  # a fresh copy: raised once per call
            raise type(engine)(f"job {ctx.name!r}: {engine}")
        _refuse_timed_out(run)
        if run.token is None:  # a per-instance round: a plain transaction
            async with engine.begin() as conn:
                yield conn
            return
        async with engine.begin() as conn:
            if run.ended or not await self._store.holds_async(conn, ctx.name, run.token):
                raise lease_lost(ctx.name, "the round no longer holds it")
            yield conn
            if self._flags.crashed:
                raise LeaseLost(f"job {ctx.name!r}: the replica crashed")
            _refuse_timed_out(run)
            if not await self._store.holds_async(conn, ctx.name, run.token, final=True):
                raise lease_lost(ctx.name, "taken before the transaction committed")

    def check(
        self, run: Run, dialect: Dialect, fetch: Callable[[Select[int]], bool], *, final: bool
    ) -> None:
        """Check ``run``'s lease inside a transaction that is not ours (a framework's ORM).

        The same statement `transaction` runs ([lease.LeaseStore.holds][]),
        built for ``dialect`` and run by ``fetch`` on the caller's connection, which tells
        whether it found a row. Call it when the transaction opens and, with
        ``final=True``, just before it commits. A per-instance round passes unchecked.

        Raises:
            LeaseLost: the lease is gone (or the round ended), or the replica crashed.
        """
        ctx = run.ctx
        if self._flags.crashed:
            raise LeaseLost(f"job {ctx.name!r}: the replica crashed")
        _refuse_timed_out(run)
        if run.token is None:
            return
        if not final and run.ended:
            raise lease_lost(ctx.name, "the round no longer holds it")
        if not fetch(self._store.holds_statement(ctx.name, run.token, dialect, final=final)):
            if final:
                raise lease_lost(ctx.name, "taken before the transaction committed")
            raise lease_lost(ctx.name, "the round no longer holds it")

    def dispose_async_engine(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Dispose the async engine we own, on the loop whose connections it pools."""
        engine = self._async_engine
        if not self._owns_async_engine or loop is None or isinstance(engine, lease.LeaseError):
            return
        if engine is None or loop.is_closed() or not loop.is_running():
            return  # nothing to await it on: its connections end with the process
        try:
            disposing = asyncio.run_coroutine_threadsafe(engine.dispose(), loop)
        except RuntimeError:  # closed meanwhile
            return
        if _running_loop() is loop:
            return  # called on the loop itself (blocking it): the disposal runs after
        try:
            disposing.result(timeout=DISPOSE_SECONDS)
        except concurrent.futures.TimeoutError:
            log.warning("the async engine was not disposed within %gs", DISPOSE_SECONDS)
        except Exception as exc:  # a connection that fails to close: it is gone anyway
            log.warning("disposing the async engine failed: %s", exc)


class _Crashed(Exception):
    """Raised inside `Fencing.write_many`'s transaction to roll it back: the replica
    crashed while it was written."""


def _refusal(run: Run, crashed: bool) -> LeaseLost | TimedOut | None:
    """Why ``run`` may not write in a transaction opening now (as `Fencing.transaction`
    refuses it before its lease check), or ``None``."""
    name = run.ctx.name
    if crashed:
        return LeaseLost(f"job {name!r}: the replica crashed")
    cause = run.ctx.cause
    if isinstance(cause, TimedOut):
        return TimedOut(*cause.args)
    if run.token is not None and run.ended:
        return lease_lost(name, "the round no longer holds it")
    return None


def _refuse_timed_out(run: Run) -> None:
    """Refuse a transaction of a round its timeout cancelled, at its start and before it
    commits: the round's time is over, though its lease is still held (until it ends).

    Raises:
        TimedOut: the round's cancellation, as ``ctx.check()`` raises it.
    """
    cause = run.ctx.cause
    if isinstance(cause, TimedOut):
        raise TimedOut(*cause.args)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
