"""`CeleryPublisher`: put one Celery task message on the broker for an occurrence.

The message is an ordinary Celery task message (protocol 2) for the task name, with
the user's args and kwargs, and:

- ``task_id`` = the occurrence id, so the worker's ``self.request.id`` is it;
- the header ``cronjob_instant`` = the scheduled instant, RFC 3339 UTC
  (``2026-03-08T06:00:00Z``), and ``cronjob_name`` = the job's name; a task reads
  them as ``self.request.cronjob_instant`` / ``self.request.get("cronjob_instant")``;
  ``cronjob_app`` the application's name when set, ``cronjob_trigger`` the round's
  trigger unless it was scheduled (``manual``, ``backfill``);
- the round's W3C trace context (``traceparent``, ``tracestate``) as message headers,
  where OpenTelemetry's Celery instrumentation (and any worker that extracts from
  ``task.request``) finds it.

It publishes on a connection of its own, opened on first use with the app's broker
settings plus kombu's ``confirm_publish`` transport option: on RabbitMQ (py-amqp) the
channel is in confirm mode and ``basic_publish`` returns only once the broker has
acknowledged the message, raising on a nack or a timeout; on Redis the message is an
``LPUSH`` that has returned. Celery's own publish retries are off: a failure raises at
once and the caller (the outbox) retries with the same id.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .._handoff import Occurrence
from .._instant import format_instant

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["OPTIONS", "CeleryPublisher", "OptionError"]

#: The options a message may carry (``send(..., queue=...)``, a beat entry's ``options``).
OPTIONS = frozenset({"queue", "routing_key", "exchange", "priority", "expires"})
#: The header that carries the scheduled instant (RFC 3339 UTC with ``Z``,
#: `cronjob.contrib.format_instant`).
INSTANT_HEADER = "cronjob_instant"
#: The header that carries the job's name.
NAME_HEADER = "cronjob_name"
#: The header that carries the application's name (``Scheduler(app=...)``), when set.
APP_HEADER = "cronjob_app"
#: The header that carries the round's trigger (``manual``, ``backfill``), unless it was
#: a scheduled round.
TRIGGER_HEADER = "cronjob_trigger"


class OptionError(ValueError):
    """Raised when a Celery target is built with an option it cannot honour."""


class CeleryPublisher:
    """Publish one Celery task message per occurrence (a `Publisher` for the outbox).

    Args:
        app: The Celery application whose broker settings (``broker_url``,
            ``broker_transport_options``, routes, queues) the message follows.
        task_name: The registered name of the task to run (``"proj.tasks.export"``).
        args: Its positional arguments (JSON-able).
        kwargs: Its keyword arguments (JSON-able).
        options: Message options: ``queue``, ``routing_key``, ``exchange`` (names),
            ``priority`` (0-255), ``expires`` (seconds or a `timedelta`, counted from the
            scheduled instant, so a republish after a long outage expires as the first
            send would have).

    Raises:
        OptionError: An option that is not one of `OPTIONS` (named), or a bad value.
        TypeError: ``task_name`` is not a non-empty string, args/kwargs not JSON-able.
    """

    def __init__(
        self,
        app: Celery,
        task_name: str,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(task_name, str) or not task_name:
            raise TypeError(f"task_name must be a non-empty string, got {task_name!r}")
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise TypeError(f"args of {task_name!r} must be a list or tuple, got {args!r}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs of {task_name!r} must be a mapping, got {kwargs!r}")
        try:
            json.dumps([list(args), dict(kwargs or {})])
        except (TypeError, ValueError) as exc:
            raise TypeError(f"args and kwargs of {task_name!r} must be JSON-able: {exc}") from None
        self._app = app
        self.task_name = task_name
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.options = _checked_options(task_name, dict(options or {}))
        self._lock = threading.Lock()
        self._connection: Any = None  # a kombu Connection, once opened

    @property
    def target(self) -> str:
        """Always ``"celery"``."""
        return "celery"

    def describe(self) -> dict[str, Any]:
        """The task name and options, and how many args and which kwargs (never their
        values, which may be secrets, nor the broker URL)."""
        options = {
            key: value.total_seconds() if isinstance(value, timedelta) else value
            for key, value in self.options.items()
        }
        return {
            "task": self.task_name,
            "args": len(self.args),
            "kwargs": sorted(self.kwargs),
            **options,
        }

    def publish(self, occurrence: Occurrence) -> None:
        """Send the task message for ``occurrence``; return once the broker accepted it.

        Raises:
            Exception: Whatever kombu/py-amqp/redis raise when the broker cannot be
                reached, refuses, or does not confirm (``amqp.exceptions.MessageNacked``,
                ``kombu.exceptions.OperationalError``, ``TimeoutError``...). The
                connection is dropped and opened again by the next call.
        """
        headers = {
            **occurrence.headers,
            INSTANT_HEADER: format_instant(occurrence.instant),
            NAME_HEADER: occurrence.name,
        }
        if occurrence.app:
            headers[APP_HEADER] = occurrence.app
        if occurrence.trigger != "schedule":
            headers[TRIGGER_HEADER] = occurrence.trigger
        options = dict(self.options)
        expires = options.pop("expires", None)
        if expires is not None:
            seconds = expires.total_seconds() if isinstance(expires, timedelta) else expires
            options["expires"] = occurrence.instant + timedelta(seconds=seconds)
        with self._lock:
            connection = self._connect()
            try:
                self._app.send_task(
                    self.task_name,
                    args=self.args,
                    kwargs=self.kwargs,
                    task_id=occurrence.id,
                    connection=connection,
                    headers=headers,
                    retry=False,
                    add_to_parent=False,
                    **options,
                )
            except BaseException:
                self._drop()
                raise

    def close(self) -> None:
        """Close the publisher's broker connection (a later `publish` opens another)."""
        with self._lock:
            self._drop()

    def _connect(self) -> Any:
        if self._connection is None:
            connection = self._app.connection_for_write(
                transport_options={"confirm_publish": True},
            )
            try:
                # No reconnect loop here: the first failure raises, the outbox retries.
                connection.ensure_connection(max_retries=0)
            except BaseException:
                connection.release()
                raise
            self._connection = connection
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            # A connection that broke may fail to close: it is gone anyway.
            with contextlib.suppress(Exception):
                connection.release()

    def __repr__(self) -> str:
        return f"CeleryPublisher({self.task_name!r}, {self.options!r})"


def _checked_options(task_name: str, options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise OptionError(
            f"task {task_name!r}: unknown option {unknown[0]!r}; "
            f"the options are {', '.join(sorted(OPTIONS))}"
        )
    for key in ("queue", "routing_key", "exchange"):
        value = options.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise OptionError(
                f"task {task_name!r}: {key} must be a non-empty string, not {value!r}"
            )
    priority = options.get("priority")
    if priority is not None and (
        not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 255
    ):
        raise OptionError(f"task {task_name!r}: priority must be an int 0-255, not {priority!r}")
    expires = options.get("expires")
    if expires is not None:
        seconds = (
            expires.total_seconds()
            if isinstance(expires, timedelta)
            else expires
            if isinstance(expires, int | float) and not isinstance(expires, bool)
            else None
        )
        if seconds is None or seconds <= 0:
            raise OptionError(
                f"task {task_name!r}: expires must be positive seconds or a timedelta, "
                f"not {expires!r}"
            )
    return {key: value for key, value in options.items() if value is not None}
