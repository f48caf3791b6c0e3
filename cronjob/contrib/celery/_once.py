"""`once`: run a Celery task's body once per task id (the occurrence id)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

from .._once import STALE_AFTER, run_claimed, run_once
from .._validation import Claim, claim_of

__all__ = ["once"]

P = ParamSpec("P")
T = TypeVar("T")


@overload
def once(fn: Callable[P, T], /) -> Callable[P, T | None]: ...


@overload
def once(
    fn: None = None, /, *, database: str | None = None, stale_after: float = STALE_AFTER
) -> Callable[[Callable[P, T]], Callable[P, T | None]]: ...


def once(
    fn: Callable[P, T] | None = None,
    /,
    *,
    database: str | None = None,
    stale_after: float = STALE_AFTER,
) -> Callable[P, T | None] | Callable[[Callable[P, T]], Callable[P, T | None]]:
    """Make a Celery task's body run once per task id, however often it is delivered.

    Put it under ``@app.task`` (with or without ``bind=True``)::

        @app.task(acks_late=True)
        @once
        def export(full: bool) -> None: ...

    Each call reads the running task's ``request.id`` (for a task `send` published,
    the occurrence id) and runs the body through ``cronjob.contrib._once.run_once``: an
    insert-if-new in the lease database, so a second delivery of the same id returns
    ``None`` without running the body; a body that raised is not marked done, and runs
    again on a redelivery. A worker killed in the body leaves it *running*: a delivery
    within ``stale_after`` seconds of its start raises
    `cronjob.contrib.OccurrenceBusy` (give the task
    ``autoretry_for=(OccurrenceBusy,)`` and ``acks_late=True`` so that Celery tries it
    again), one after that runs it. Called outside a worker (no request id), the body
    just runs.

    A message cronjob published (its headers ``cronjob_name`` and ``cronjob_instant``)
    is checked first (``cronjob.contrib._once.run_claimed``): an id that is not the one
    of its app, name and instant, or an instant that is no firing of the schedule's
    current spec (unless ``cronjob_trigger`` is ``manual``), raises
    `cronjob.contrib.InvalidOccurrence` and runs nothing; an occurrence never started
    whose schedule nothing names any more (no registered job, no schedule row) returns
    ``None`` without running: acknowledged as obsolete.

    Args:
        fn: The task function (the bare ``@once`` form).
        database: The lease database's URL; ``None`` reads ``$CRONJOB_DATABASE_URL``
            (as ``cronjob run`` does).
        stale_after: Seconds after which a body still marked running is taken to be
            dead and may run again (an hour by default): longer than the body takes.

    Raises:
        ValueError: ``stale_after`` is not a number of seconds > 0 (at decoration).
    """
    _check_stale_after(stale_after)

    def decorate(body: Callable[P, T]) -> Callable[P, T | None]:
        @functools.wraps(body)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T | None:
            from celery import current_task

            task = current_task
            task_id = _task_id(task)
            if task_id is None:
                return body(*args, **kwargs)
            claim = _claim(task, task_id)
            if claim is not None:
                return run_claimed(
                    claim,
                    str(task.name),
                    lambda: body(*args, **kwargs),
                    database=database,
                    stale_after=stale_after,
                )
            return run_once(
                task_id,
                str(task.name),
                lambda: body(*args, **kwargs),
                database=database,
                stale_after=stale_after,
            )

        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate


def _check_stale_after(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"once: stale_after must be a number of seconds > 0, got {value!r}")


def _task_id(task: Any) -> str | None:
    """The running task's id; ``None`` outside a worker (a direct call)."""
    request = getattr(task, "request", None)
    value = getattr(request, "id", None)
    return str(value) if value else None


def _claim(task: Any, task_id: str) -> Claim | None:
    """The claim of the running task's cronjob headers; ``None`` without them."""
    request = getattr(task, "request", None)
    return claim_of(
        app=getattr(request, "cronjob_app", None),
        schedule=getattr(request, "cronjob_name", None),
        instant=getattr(request, "cronjob_instant", None),
        occurrence_id=task_id,
        trigger=getattr(request, "cronjob_trigger", None),
    )
