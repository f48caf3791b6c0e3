"""`send`: the job function that hands each instant to a Celery task."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._handoff import Handoff, handoff
from ._publisher import CeleryPublisher

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["send"]


def send(
    app: Celery,
    task_name: str,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Handoff:
    """Build a job function that publishes the task ``task_name`` once per instant.

    ``cronjob.register(send(app, "proj.tasks.export", kwargs={"full": True}),
    "0 0 3 * * *", "nightly-export")``: the replica that claims an instant records it
    in the outbox, publishes one message (its task id the occurrence id, the instant in
    the ``cronjob_instant`` header, the round's trace context in ``traceparent``), and
    marks it sent once the broker accepted it; see `CeleryPublisher`.

    Args:
        app: The Celery application (its broker and routing settings).
        task_name: The task's registered name.
        args: The task's positional arguments (JSON-able).
        kwargs: The task's keyword arguments (JSON-able).
        **options: ``queue``, ``routing_key``, ``exchange``, ``priority``, ``expires``.

    Raises:
        OptionError: An unknown option (named) or a bad option value, at the call.
        TypeError: A bad task name, or args/kwargs that are not JSON-able.
    """
    return handoff(CeleryPublisher(app, task_name, args=args, kwargs=kwargs, options=options))
