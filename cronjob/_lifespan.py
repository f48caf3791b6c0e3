"""``cronjob.lifespan``: run the scheduler inside an ASGI application's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from ._scheduler import Scheduler

__all__ = ["lifespan"]


def lifespan(
    database: Any = None, **options: Any
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """Return an ASGI lifespan that starts a scheduler with the app and drains it on exit.

    ``FastAPI(lifespan=cronjob.lifespan())`` or ``Starlette(lifespan=...)``. Arguments are
    those of :class:`Scheduler`; async jobs run on the application's own event loop, sync
    jobs in the scheduler's worker threads. Start-up and drain run in a thread so the
    loop keeps serving meanwhile.
    """

    @contextlib.asynccontextmanager
    async def _lifespan(app: Any) -> AsyncIterator[None]:
        options.setdefault("loop", asyncio.get_running_loop())
        scheduler = Scheduler(database, **options)
        await asyncio.to_thread(scheduler.start)
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)

    return _lifespan
