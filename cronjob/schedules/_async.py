"""The same calls on an `AsyncConnection` or `AsyncEngine`: each runs the sync call on
the async connection's own transaction (``run_sync``), so it joins it as the sync call
joins a `Connection`'s."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection

from .._policy import CatchUp, Overlap
from .._registry import Registry
from . import _api
from ._check import New

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = [
    "add_async",
    "add_many_async",
    "get_async",
    "list_async",
    "remove_async",
    "update_async",
]

_T = TypeVar("_T")


async def _run(db: AsyncConnection | AsyncEngine, call: Callable[[Connection], _T]) -> _T:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    if isinstance(db, AsyncConnection):
        return await db.run_sync(call)
    if isinstance(db, AsyncEngine):
        async with db.begin() as conn:
            return await conn.run_sync(call)
    raise TypeError(f"expected an AsyncConnection or AsyncEngine, got {type(db).__name__}")


async def add_async(
    db: AsyncConnection | AsyncEngine,
    id: str,
    *,
    task: str,
    spec: str | None = None,
    at: datetime | None = None,
    args: dict[str, Any] | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    paused: bool = False,
    if_exists: _api.IfExists = "error",
    registry: Registry | None = None,
    overlap: Overlap | str | None = None,
    catch_up: CatchUp | str | None = None,
    catch_up_window: float | timedelta | None = None,
    jitter: float | timedelta | None = None,
    heartbeat: str | None = None,
    now: datetime | None = None,
) -> bool:
    """[add][cronjob.schedules.add] on an `AsyncConnection` (joining its transaction) or
    an `AsyncEngine`."""
    return await _run(
        db,
        lambda conn: _api.add(
            conn,
            id,
            task=task,
            spec=spec,
            at=at,
            args=args,
            start=start,
            end=end,
            paused=paused,
            if_exists=if_exists,
            registry=registry,
            overlap=overlap,
            catch_up=catch_up,
            catch_up_window=catch_up_window,
            jitter=jitter,
            heartbeat=heartbeat,
            now=now,
        ),
    )


async def add_many_async(
    db: AsyncConnection | AsyncEngine,
    schedules: Iterable[New],
    *,
    if_exists: _api.IfExists = "error",
    registry: Registry | None = None,
    now: datetime | None = None,
) -> int:
    """[add_many][cronjob.schedules.add_many], asynchronously."""
    news = builtins.list(schedules)
    return await _run(
        db,
        lambda conn: _api.add_many(conn, news, if_exists=if_exists, registry=registry, now=now),
    )


async def update_async(db: AsyncConnection | AsyncEngine, id: str, **changes: Any) -> bool:
    """[update][cronjob.schedules.update], asynchronously (the same keywords, ``now``
    too)."""
    return await _run(db, lambda conn: _api.update(conn, id, **changes))


async def remove_async(
    db: AsyncConnection | AsyncEngine, id: str, *, now: datetime | None = None
) -> bool:
    """[remove][cronjob.schedules.remove], asynchronously."""
    return await _run(db, lambda conn: _api.remove(conn, id, now=now))


async def get_async(db: AsyncConnection | AsyncEngine, id: str) -> _api.ScheduleRecord | None:
    """[get][cronjob.schedules.get], asynchronously."""
    return await _run(db, lambda conn: _api.get(conn, id))


async def list_async(
    db: AsyncConnection | AsyncEngine, *, task: str | None = None, prefix: str | None = None
) -> builtins.list[_api.ScheduleRecord]:
    """[list][cronjob.schedules.list], asynchronously."""
    return await _run(db, lambda conn: _api.list(conn, task=task, prefix=prefix))
