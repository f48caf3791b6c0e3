"""The Dramatiq publisher: one message for an occurrence, put on the application's broker.

The message is built by actor name and queue (a `dramatiq.Message`), so the replica
needs the broker, not the worker's actor code. What it carries:

- ``message_id``: the occurrence id (the same on every send of the occurrence);
- ``args`` and ``kwargs``: the user's, as given to `send`;
- ``options``: the user's options, and three of ours: ``cronjob_instant`` (the scheduled
  instant, RFC 3339 UTC with ``Z``), ``cronjob_name`` (the job's name) and ``trace_ctx`` (the
  round's W3C trace context, ``traceparent`` and ``tracestate``, the carrier the
  OpenTelemetry Dramatiq instrumentation reads), absent when no trace context is known;
  ``cronjob_app`` when the application is named, ``cronjob_trigger`` when the round was
  not a scheduled one (``manual``, ``backfill``).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dramatiq import Message
from dramatiq.broker import Broker

from ..._exceptions import RegistrationError
from .._handoff import Occurrence
from .._instant import format_instant

__all__ = [
    "APP_OPTION",
    "INSTANT_OPTION",
    "NAME_OPTION",
    "TRACE_OPTION",
    "TRIGGER_OPTION",
    "DramatiqPublisher",
]

#: The message option that holds the scheduled instant (RFC 3339 UTC with ``Z``,
#: `cronjob.contrib.format_instant`).
INSTANT_OPTION: Final = "cronjob_instant"
#: The message option that holds the job's name.
NAME_OPTION: Final = "cronjob_name"
#: The message option that holds the application's name (``Scheduler(app=...)``), when set.
APP_OPTION: Final = "cronjob_app"
#: The message option that holds the round's trigger (``manual``, ``backfill``), unless
#: it was a scheduled round.
TRIGGER_OPTION: Final = "cronjob_trigger"
#: The message option that holds the round's W3C trace context (a dict of headers).
TRACE_OPTION: Final = "trace_ctx"

#: Dramatiq's own rule for queue names (`dramatiq.actor` applies it to an actor's queue).
_QUEUE_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9._-]*")

#: Options refused with a reason of their own (anything else unknown is refused as such).
_REFUSED: Final[Mapping[str, str]] = {
    "delay": (
        "a delay counts from each send, so a send retried by the outbox would run later "
        "again; schedule the job at the time the work should start (or give it jitter=)"
    ),
    "eta": "Dramatiq computes it from delay, which is refused too",
    "priority": (
        "Dramatiq's priority is an actor setting the worker reads from its own actor, "
        "never from the message; on RabbitMQ a message's priority is broker_priority"
    ),
    "message_id": "the message id is the occurrence id",
    "queue_name": "it is the queue_name argument",
    "retries": "Dramatiq counts the retries of a message itself",
    "redis_message_id": "the Redis broker sets it on each send",
    INSTANT_OPTION: "cronjob puts the scheduled instant there",
    NAME_OPTION: "cronjob puts the job's name there",
    TRACE_OPTION: "cronjob puts the round's trace context there",
}


class DramatiqPublisher:
    """Publish an occurrence as a message for a Dramatiq actor, by name, on ``broker``.

    Everything is checked here, when the job is built (at import time), so a bad option
    fails the import and the process at start-up, naming the actor.

    Args:
        broker: The application's broker (`RabbitmqBroker` built with
            ``confirm_delivery=True``, `RedisBroker`, or another `dramatiq.broker.Broker`).
        actor_name: The actor the worker declared (``actor_name=``, by default its
            function's name). The replica needs no actor code.
        args: Positional arguments for the actor, JSON-able.
        kwargs: Keyword arguments for the actor, JSON-able, string keys.
        queue_name: The actor's queue.
        **options: Message options read by the broker's middleware (``max_retries``,
            ``time_limit``, ``max_age``, …: the names in ``broker.actor_options``), JSON-able;
            on a `RabbitmqBroker` with ``max_priority``, ``broker_priority`` too.

    Raises:
        RegistrationError: an empty actor name, a bad queue name, arguments or options
            that are not JSON, an option the broker does not know or that cronjob sets
            itself (``delay``, ``priority``: the message says why), or a `RabbitmqBroker`
            without publisher confirms.
        TypeError: ``broker`` is not a Dramatiq broker.
    """

    def __init__(
        self,
        broker: Broker,
        actor_name: str,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        queue_name: str = "default",
        **options: Any,
    ) -> None:
        if not isinstance(broker, Broker):
            raise TypeError(f"broker must be a Dramatiq broker, got {broker!r}")
        if not isinstance(actor_name, str) or not actor_name:
            raise RegistrationError(
                f"a Dramatiq actor name must be a non-empty string, got {actor_name!r}"
            )
        where = f"Dramatiq actor {actor_name!r}"
        _check_queue(where, queue_name)
        if _is_rabbitmq(broker) and not getattr(broker, "confirm_delivery", False):
            raise RegistrationError(
                f"{where}: the RabbitmqBroker must be built with confirm_delivery=True, so that "
                "a send returns only once RabbitMQ has confirmed the message"
            )
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise RegistrationError(f"{where}: args must be a list or tuple, got {args!r}")
        kwargs = dict(kwargs or {})
        if not all(isinstance(key, str) for key in kwargs):
            raise RegistrationError(
                f"{where}: kwargs keys must be strings, got {sorted(map(repr, kwargs))}"
            )
        _check_json(where, "args", list(args))
        _check_json(where, "kwargs", kwargs)
        for option, value in options.items():
            _check_option(where, broker, option, value)
        self._broker = broker
        self._actor_name = actor_name
        self._queue_name = queue_name
        self._args = tuple(args)
        self._kwargs = kwargs
        self._options = dict(options)

    @property
    def target(self) -> str:
        """``"dramatiq"``."""
        return "dramatiq"

    def describe(self) -> dict[str, Any]:
        """The actor, queue, broker class and options (never the arguments, never a URL)."""
        return {
            "actor": self._actor_name,
            "queue": self._queue_name,
            "broker": type(self._broker).__name__,
            "options": dict(self._options),
        }

    def message(self, occurrence: Occurrence) -> Message[Any]:
        """The message `publish` sends for ``occurrence`` (the same for every send)."""
        options: dict[str, Any] = {
            **self._options,
            INSTANT_OPTION: format_instant(occurrence.instant),
            NAME_OPTION: occurrence.name,
        }
        if occurrence.app:
            options[APP_OPTION] = occurrence.app
        if occurrence.trigger != "schedule":
            options[TRIGGER_OPTION] = occurrence.trigger
        if occurrence.headers:
            options[TRACE_OPTION] = dict(occurrence.headers)
        return Message(
            queue_name=self._queue_name,
            actor_name=self._actor_name,
            args=self._args,
            kwargs=dict(self._kwargs),
            options=options,
            message_id=occurrence.id,
        )

    def publish(self, occurrence: Occurrence) -> None:
        """Enqueue the message for ``occurrence``; return once the broker has it.

        On RabbitMQ the channel is in confirm mode (checked at build), so
        `RabbitmqBroker.enqueue` returns only after RabbitMQ confirmed the message as
        routed to the durable queue, and raises otherwise (after its own reconnection
        attempts). On Redis it returns once the enqueue script ran on the server.

        Raises:
            dramatiq.errors.BrokerError: RabbitMQ refused or could not be reached
                (`ConnectionClosed`).
            Exception: whatever the broker's client raises (``redis.ConnectionError``, …):
                any failure propagates; nothing is swallowed.
        """
        # The queue is declared as an actor would declare it: the Redis broker only notes
        # it; RabbitMQ's enqueue then creates it (and its delay and dead-letter queues)
        # on the server if needed, so the first message of a fresh queue is not lost.
        self._broker.declare_queue(self._queue_name)
        self._broker.enqueue(self.message(occurrence))

    def __repr__(self) -> str:
        return f"DramatiqPublisher(actor={self._actor_name!r}, queue={self._queue_name!r})"


def _is_rabbitmq(broker: Broker) -> bool:
    """Whether ``broker`` is a `RabbitmqBroker` (its module is loaded if one exists;
    never imported here, so pika stays optional)."""
    module = sys.modules.get("dramatiq.brokers.rabbitmq")
    return module is not None and isinstance(broker, module.RabbitmqBroker)


def _check_queue(where: str, queue_name: object) -> None:
    if not isinstance(queue_name, str) or not _QUEUE_NAME.fullmatch(queue_name):
        raise RegistrationError(
            f"{where}: queue_name {queue_name!r} is not a Dramatiq queue name "
            "(a letter or _, then letters, digits, ., _ or -)"
        )
    if queue_name.endswith((".DQ", ".XQ")):
        raise RegistrationError(
            f"{where}: queue_name {queue_name!r} names a delay or dead-letter queue; "
            "give the actor's own queue"
        )


def _check_json(where: str, what: str, value: object) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise RegistrationError(f"{where}: {what} must be JSON-able ({exc})") from exc


def _check_option(where: str, broker: Broker, option: str, value: object) -> None:
    if option in _REFUSED:
        raise RegistrationError(f"{where}: option {option!r} is refused: {_REFUSED[option]}")
    if option == "broker_priority":
        top = getattr(broker, "max_priority", None) if _is_rabbitmq(broker) else None
        if top is None:
            raise RegistrationError(
                f"{where}: option 'broker_priority' needs a RabbitmqBroker built with "
                "max_priority (Redis has no message priorities)"
            )
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
            raise RegistrationError(
                f"{where}: broker_priority must be a whole number from 0 to {top}, got {value!r}"
            )
        return
    if option not in broker.actor_options:
        known = ", ".join(sorted(broker.actor_options))
        raise RegistrationError(
            f"{where}: unknown option {option!r}; the broker's middleware reads: {known}"
        )
    _check_json(where, f"option {option!r}", value)
