"""``cronjob.lifespan``: run the scheduler inside an ASGI application's lifespan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from ._logging import check_level, visible_logs
from .engine import Scheduler

__all__ = ["APP_STATE_ATTRIBUTE", "lifespan"]

#: Where `lifespan` puts the scheduler on the application: ``app.state.<this>``.
APP_STATE_ATTRIBUTE = "cronjob_scheduler"


def lifespan(
    database: Any = None, *, log_level: int | str | None = None, **options: Any
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """Return an ASGI lifespan that starts a scheduler with the app and drains it on exit.

    ``FastAPI(lifespan=cronjob.lifespan())`` or ``Starlette(lifespan=...)``. Arguments are
    those of [Scheduler][cronjob.Scheduler]; async jobs run on the application's own event
    loop, sync jobs in the scheduler's worker threads. Start-up and drain run in a thread so
    the loop keeps serving meanwhile.

    Each start of the application builds a new scheduler (two ``TestClient(app)`` blocks,
    two ``asyncio.run``: each on its own loop), and puts it on ``app.state.cronjob_scheduler``
    when the application has a ``state`` (for a readiness probe: ``.ready``). Inside a
    lifespan of your own, use ``async with cronjob.Scheduler(...) as scheduler:`` instead.

    Args:
        database: As `Scheduler`'s.
        log_level: ``None`` (the default) leaves logging to the application. A level
            (``"INFO"``, ``logging.INFO``) shows cronjob's lines at that level and above
            while the application runs: the ``cronjob``, ``lease`` and ``execctx`` loggers
            are set to it, and, only if neither they nor the root logger has a handler
            (uvicorn's and gunicorn's default logging configure their own loggers
            alone), a handler writing ``time LEVEL logger: message`` lines to standard
            error is added to them. A configured application keeps its handlers and
            format. Levels and handler are put back when the lifespan ends.
        **options: As `Scheduler`'s.

    Raises:
        ValueError: ``log_level`` is not a logging level (at the call, not at start).

    Raises (on entering):
        lease.DatabaseRefused: as [Scheduler.start][cronjob.Scheduler.start]; the
            application does not start.
    """
    level = None if log_level is None else check_level(log_level)

    @contextlib.asynccontextmanager
    async def _lifespan(app: Any) -> AsyncIterator[None]:
        # A new scheduler, and the running loop, on every start: the options are the
        # caller's and never changed here (an earlier version kept the first start's
        # loop in them, and the second start ran its rounds on that closed loop).
        with visible_logs(level):  # around the scheduler: its started and stopped lines
            async with Scheduler(database, **options) as scheduler:
                state = getattr(app, "state", None)
                if state is not None:
                    setattr(state, APP_STATE_ATTRIBUTE, scheduler)
                yield

    return _lifespan
