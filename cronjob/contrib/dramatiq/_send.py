"""`send`: the job function that hands each instant to a Dramatiq actor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dramatiq.broker import Broker

from .._handoff import Handoff, handoff
from ._publisher import DramatiqPublisher

__all__ = ["send"]


def send(
    broker: Broker,
    actor_name: str,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    queue_name: str = "default",
    retry_within: float | None = None,
    hold: float | None = None,
    send_timeout: float | None = None,
    **options: Any,
) -> Handoff:
    """A job function that sends one message per instant to the actor ``actor_name``.

    Register it like any job: ``cronjob.register(send(broker, "export", kwargs={"full":
    True}), "0 0 3 * * *", "nightly-export")``. The round that claims an instant records
    the occurrence in the lease database (the outbox), then enqueues a
    `dramatiq.Message` whose ``message_id`` is the occurrence id, with the instant, the
    job's name and the round's trace context in its options (see
    [DramatiqPublisher][cronjob.contrib.dramatiq.DramatiqPublisher]); a send that fails
    is retried with the same id until the broker has the message.

    Args:
        broker: The application's Dramatiq broker (RabbitMQ: ``confirm_delivery=True``).
        actor_name: The actor's name, as the workers declare it.
        args: Positional arguments for the actor (JSON).
        kwargs: Keyword arguments for the actor (JSON).
        queue_name: The actor's queue.
        retry_within: Seconds the round retries a refused send before it leaves it to
            the sweep; ``None``: derived from the period (see
            [handoff][cronjob.contrib.handoff]).
        hold: Seconds an attempt keeps its row from the other retriers; ``None``:
            derived (see [handoff][cronjob.contrib.handoff]).
        send_timeout: Seconds one send waits for the broker's answer, below ``hold``;
            ``None``: derived (see [handoff][cronjob.contrib.handoff]).
        **options: Message options for the broker's middleware (``max_retries``,
            ``time_limit``, …; ``broker_priority`` on RabbitMQ with ``max_priority``).

    Raises:
        RegistrationError: bad input, at once (see `DramatiqPublisher`), or
            ``retry_within``, ``hold`` or ``send_timeout`` out of range.
    """
    publisher = DramatiqPublisher(
        broker, actor_name, args=args, kwargs=kwargs, queue_name=queue_name, **options
    )
    return handoff(publisher, retry_within=retry_within, hold=hold, send_timeout=send_timeout)
