"""The worker's side of the RQ tests: tasks a real ``rq worker`` runs, which write what
they saw to a file (``$CRONJOB_TEST_OUT``), and an OpenTelemetry SDK set up on import
whose spans go to that file too, so a test reads the worker's trace ids."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from rq import get_current_job

from cronjob.contrib.rq import META_KEY, once, trace_context


def _write(record: dict[str, object]) -> None:
    with open(os.environ["CRONJOB_TEST_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


class FileExporter(SpanExporter):
    """Each finished span as a line of the test's file."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            parent = span.parent
            _write(
                {
                    "span": span.name,
                    "trace_id": format(span.context.trace_id, "032x"),
                    "parent": None if parent is None else format(parent.span_id, "016x"),
                }
            )
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
tracer = _provider.get_tracer(__name__)


def traced(label: str) -> None:
    """Record the job's id and meta, in a span that continues the round's trace."""
    job = get_current_job()
    assert job is not None
    with tracer.start_as_current_span("worker " + label, context=trace_context(job)):
        _write({"job_id": job.id, "label": label, "meta": job.meta.get(META_KEY)})


@once
def counted(label: str, sleep: float = 0.0, fail: bool = False) -> str:
    """Run once per occurrence: a line per body run; may sleep, or fail."""
    job = get_current_job()
    assert job is not None
    _write({"body": job.id, "label": label})
    if sleep:
        time.sleep(sleep)
    if fail:
        raise RuntimeError(f"{label} failed")
    return label


@once(stale_after=15)
def counted_stale(label: str, sleep: float = 0.0) -> str:
    """`counted` with a stale time of 15 s (a killed worker's body runs again after it);
    its line names the process that runs the body (RQ's work horse)."""
    job = get_current_job()
    assert job is not None
    _write({"body": job.id, "label": label, "pid": os.getpid()})
    if sleep:
        time.sleep(sleep)
    return label
