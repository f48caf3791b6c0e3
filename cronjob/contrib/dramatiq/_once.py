"""`once`: a Dramatiq actor's body run once per message id (the occurrence id)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import ParamSpec, TypeVar, overload

from dramatiq.middleware import CurrentMessage

from .._once import STALE_AFTER, run_claimed, run_once
from .._validation import claim_of

__all__ = ["once"]

P = ParamSpec("P")
T = TypeVar("T")


@overload
def once(fn: Callable[P, T], /) -> Callable[P, T | None]: ...


@overload
def once(
    *, database: str | None = None, stale_after: float = STALE_AFTER
) -> Callable[[Callable[P, T]], Callable[P, T | None]]: ...


def once(
    fn: Callable[P, T] | None = None,
    /,
    *,
    database: str | None = None,
    stale_after: float = STALE_AFTER,
) -> Callable[P, T | None] | Callable[[Callable[P, T]], Callable[P, T | None]]:
    """Run an actor's body once per message id: ``@dramatiq.actor`` over ``@once``.

    Dramatiq delivers a message at least once (a worker killed mid-message, a lost ack,
    a republished occurrence). With ``once`` the body of a message runs once per
    ``message_id``, the occurrence id for messages sent by
    [send][cronjob.contrib.dramatiq.send], through an insert-if-new in the lease
    database; a delivery of an id already done returns ``None`` without running it. A
    body that raises is not marked done: Dramatiq's retry runs it again.

    ```python
    @dramatiq.actor(queue_name="exports")
    @once
    def export(full: bool) -> None: ...
    ```

    The broker needs the `CurrentMessage` middleware (``broker.add_middleware(
    CurrentMessage())``): the id comes from it. The task name kept with the id is the
    message's actor name.

    A message cronjob published (its options ``cronjob_name`` and ``cronjob_instant``)
    is checked first (``cronjob.contrib._once.run_claimed``): an id that is not the one
    of its app, name and instant, or an instant that is no firing of the schedule's
    current spec (unless ``cronjob_trigger`` is ``manual``), raises
    `cronjob.contrib.InvalidOccurrence` and runs nothing; an occurrence never started
    whose schedule nothing names any more returns ``None`` without running (obsolete).

    Args:
        fn: The actor's function (sync; async actors are refused).
        database: The lease database's URL; ``None``: ``$CRONJOB_DATABASE_URL``.
        stale_after: Seconds after which a body still marked running is taken to be
            dead and may run again (an hour by default): longer than the body takes.

    Raises:
        TypeError: ``fn`` is a coroutine function (at decoration).
        ValueError: ``stale_after`` is not a number of seconds > 0 (at decoration).
        RuntimeError: (at a call) no current message: the broker lacks `CurrentMessage`,
            or the function was called outside a worker.
    """

    if (
        isinstance(stale_after, bool)
        or not isinstance(stale_after, int | float)
        or not stale_after > 0
    ):
        raise ValueError(f"once: stale_after must be a number of seconds > 0, got {stale_after!r}")

    def decorate(fn: Callable[P, T]) -> Callable[P, T | None]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"once: {fn.__qualname__} is async; once runs sync actors (the body's end "
                "must be known before the message counts as done)"
            )

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> T | None:
            message = CurrentMessage.get_current_message()
            if message is None:
                raise RuntimeError(
                    f"once: {fn.__qualname__} has no current Dramatiq message; add "
                    "dramatiq.middleware.CurrentMessage() to the broker's middleware"
                )
            options = message.options
            claim = claim_of(
                app=options.get("cronjob_app"),
                schedule=options.get("cronjob_name"),
                instant=options.get("cronjob_instant"),
                occurrence_id=message.message_id,
                trigger=options.get("cronjob_trigger"),
            )
            if claim is not None:
                return run_claimed(
                    claim,
                    message.actor_name,
                    functools.partial(fn, *args, **kwargs),
                    database=database,
                    stale_after=stale_after,
                )
            result: T | None = run_once(
                message.message_id,
                message.actor_name,
                functools.partial(fn, *args, **kwargs),
                database=database,
                stale_after=stale_after,
            )
            return result

        return run

    return decorate if fn is None else decorate(fn)
