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
    retry_within: float | None = None,
    hold: float | None = None,
    send_timeout: float | None = None,
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
        retry_within: Seconds the round retries a refused send before it leaves it to
            the sweep; ``None``: derived from the period (see
            [handoff][cronjob.contrib.handoff]).
        hold: Seconds an attempt keeps its row from the other retriers; ``None``:
            derived (see [handoff][cronjob.contrib.handoff]).
        send_timeout: Seconds one send waits for the broker's answer, below ``hold``;
            ``None``: derived (see [handoff][cronjob.contrib.handoff]).
        **options: ``queue``, ``routing_key``, ``exchange``, ``priority``, ``expires``.

    Raises:
        OptionError: An unknown option (named) or a bad option value, at the call.
        TypeError: A bad task name, or args/kwargs that are not JSON-able.
        RegistrationError: ``retry_within``, ``hold`` or ``send_timeout`` out of range.
    """
    return handoff(
        CeleryPublisher(app, task_name, args=args, kwargs=kwargs, options=options),
        retry_within=retry_within,
        hold=hold,
        send_timeout=send_timeout,
    )
