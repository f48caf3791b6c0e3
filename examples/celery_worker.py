"""A Celery worker whose task's span joins the trace of the cronjob round that sent it.

cronjob's `send` puts the round's W3C trace context on the message (``traceparent``, and
``tracestate`` when there is one) beside ``cronjob_instant`` and ``cronjob_name``. A Celery
worker merges a message's headers into the task's request, as attributes: `trace_context`
reads them back for OpenTelemetry. (With OpenTelemetry's Celery instrumentation installed
on the worker, it does this for you.)

Run it with ``celery -A examples.celery_worker worker``; the replica registers
``send(app, "examples.export", kwargs={"full": True})``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from opentelemetry import propagate, trace
from opentelemetry.context import Context

app = Celery("examples", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest@127.0.0.1//"))
tracer = trace.get_tracer(__name__)


class RequestGetter:
    """Read a trace header from a Celery request, where message headers are attributes."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return []


def trace_context(request: Any) -> Context:
    """The round's trace context carried by a task's ``request`` (``self.request`` in a
    bound task); an empty context for a message cronjob did not send."""
    return propagate.extract(request, getter=RequestGetter())


@app.task(name="examples.export", bind=True)
def export(self: Any, full: bool = False) -> None:
    # The span is a child of the round's: one trace from the replica to the worker.
    with tracer.start_as_current_span("export", context=trace_context(self.request)):
        instant = self.request.get("cronjob_instant")  # "2026-03-08T02:00:00Z"
        print(f"export of {instant}, full={full}")
