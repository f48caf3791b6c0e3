"""The Celery app of the real-worker tests (``celery -A tests.celery_worker worker``).

Its broker is ``$CELERY_TEST_BROKER``. The task ``cronjob_test.record`` appends one JSON
line to ``$CELERY_TEST_LOG`` with what it received: its request id, the headers cronjob
puts on the message, its args, kwargs, expiry and priority. With ``$CELERY_TEST_SPANS``
set, the worker is instrumented with the OpenTelemetry SDK: the task extracts the W3C
trace context from its request (where message headers land) with the documented
example's ``examples.celery_worker.trace_context`` and records its own span,
one JSON line per span in that file. ``cronjob_test.once_record`` and
``cronjob_test.once_flaky`` are wrapped in ``cronjob.contrib.celery.once`` on the lease
database ``$CELERY_TEST_DB``; so is ``cronjob_test.once_killed`` (tests/faults), with a
stale time of ``$CELERY_TEST_STALE_AFTER`` seconds, acknowledged late and retried while
its occurrence is busy.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from typing import Any

from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import cronjob
from cronjob.contrib import OccurrenceBusy
from cronjob.contrib.celery import once
from examples.celery_worker import trace_context
from tests import _killed_body as killed


def _published(ctx: cronjob.Round) -> None:
    """What the replicas run (they hand the instant over); the worker reads its name."""


# The jobs the replicas register, as the worker's own code would import them: ``once``
# runs a message only while something names its schedule (else it is obsolete).
cronjob.register(_published, "0 0 * * * *", "nightly")
cronjob.register(_published, "* * * * * *", killed.ONCE_KILLED)  # tests/faults

app = Celery("cronjob_test", broker=os.environ.get("CELERY_TEST_BROKER", "memory://"))
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)


def _append(path: str, line: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


class _FileExporter(SpanExporter):
    """Write each finished span's ids as a JSON line (what the test compares)."""

    def __init__(self, path: str) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            context = span.get_span_context()
            assert context is not None
            _append(
                self._path,
                {
                    "name": span.name,
                    "trace_id": format(context.trace_id, "032x"),
                    "parent_span_id": format(span.parent.span_id, "016x") if span.parent else None,
                },
            )
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
if os.environ.get("CELERY_TEST_SPANS"):
    _provider.add_span_processor(
        SimpleSpanProcessor(_FileExporter(os.environ["CELERY_TEST_SPANS"]))
    )
_tracer = _provider.get_tracer(__name__)


@app.task(name="cronjob_test.record", bind=True)
def record(self: Any, *args: Any, **kwargs: Any) -> None:
    parent = trace_context(self.request)  # the documented example's, so a test runs it
    with _tracer.start_as_current_span(f"run {self.name}", context=parent):
        request = self.request
        _append(
            os.environ["CELERY_TEST_LOG"],
            {
                "id": request.id,
                "instant": request.get("cronjob_instant"),
                "name": request.get("cronjob_name"),
                "traceparent": request.get("traceparent"),
                "args": list(args),
                "kwargs": kwargs,
                "expires": request.expires,
                "priority": (request.delivery_info or {}).get("priority"),
                "queue": (request.delivery_info or {}).get("routing_key"),
                "trace_id": format(trace.get_current_span().get_span_context().trace_id, "032x"),
            },
        )


@app.task(name="cronjob_test.once_record", bind=True)
@once(database=os.environ.get("CELERY_TEST_DB"))
def once_record(self: Any, *args: Any) -> None:
    """Record each run of the body (``once``: one per task id)."""
    _append(os.environ["CELERY_TEST_LOG"], {"id": self.request.id, "args": list(args)})


@app.task(name="cronjob_test.once_flaky")
@once(database=os.environ.get("CELERY_TEST_DB"))
def once_flaky(marker: str) -> str:
    """Fail the first run (leaving ``marker``), then record and succeed."""
    _append(os.environ["CELERY_TEST_LOG"] + ".attempts", {"marker": marker})
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first run fails")
    _append(os.environ["CELERY_TEST_LOG"], {"marker": marker})
    return "done"


@once(
    database=os.environ.get("CELERY_TEST_DB"),
    stale_after=float(os.environ.get("CELERY_TEST_STALE_AFTER") or 3600),
)
def _killed_body(task_id: str, marker: str) -> str:
    return killed.body(functools.partial(_append, os.environ["CELERY_TEST_LOG"]), task_id, marker)


# Acknowledged after the body, so the message of a killed worker goes back to the queue;
# a delivery that finds the body running elsewhere is retried after 1 s.
@app.task(
    name="cronjob_test.once_killed",
    bind=True,
    acks_late=True,
    autoretry_for=(OccurrenceBusy,),
    default_retry_delay=1,
    max_retries=120,
    retry_backoff=False,
    retry_jitter=False,
)
def once_killed(self: Any, marker: str) -> None:
    log = functools.partial(_append, os.environ["CELERY_TEST_LOG"])
    killed.deliver(log, self.request.id, lambda: _killed_body(self.request.id, marker))
