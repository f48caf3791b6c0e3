"""Tests for execctx: the unit of work, its root span, and log annotation."""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import queue
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

import execctx

HEX32 = r"[0-9a-f]{32}"


@dataclass
class Otel:
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> dict[str, ReadableSpan]:
        return {span.name: span for span in self.exporter.get_finished_spans()}


@pytest.fixture
def otel() -> Iterator[Otel]:
    """An SDK provider of the test's own, exporting finished spans to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Otel(provider, exporter)
    provider.shutdown()


def hex_trace_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return trace.format_trace_id(span.context.trace_id)


def hex_span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return trace.format_span_id(span.context.span_id)


class TestWorkUnit:
    def test_it_rejects_a_trace_id_not_in_w3c_form(self):
        with pytest.raises(ValueError, match=r"^trace_id must be 32 lowercase hex digits"):
            execctx.WorkUnit(kind="round", name="a", trace_id="ABCDEF" * 5 + "AB")
        with pytest.raises(ValueError, match=r"not all zero: '0{32}'$"):
            execctx.WorkUnit(kind="round", name="a", trace_id="0" * 32)

    def test_it_rejects_an_empty_name(self):
        with pytest.raises(ValueError, match=r"^name must be a non-empty string, got ''$"):
            execctx.WorkUnit(kind="round", name="", trace_id="1" * 32)

    def test_it_rejects_an_attribute_that_is_not_str_int_or_bool(self):
        with pytest.raises(TypeError, match=r"^attribute 'x' must be str, int or bool, got 1.5$"):
            execctx.WorkUnit(kind="round", name="a", trace_id="1" * 32, attributes={"x": 1.5})  # type: ignore[dict-item]

    def test_its_attributes_are_a_read_only_copy(self):
        source: dict[str, str | int | bool] = {"attempt": 1}
        unit = execctx.WorkUnit(kind="round", name="a", trace_id="1" * 32, attributes=source)
        source["attempt"] = 2
        assert unit.attributes == {"attempt": 1}
        with pytest.raises(TypeError):
            unit.attributes["attempt"] = 3  # type: ignore[index]
        assert hash(unit) == hash(
            execctx.WorkUnit(kind="round", name="a", trace_id="1" * 32, attributes=source)
        )


class TestRootSpan:
    def test_a_unit_that_succeeds_is_one_root_span_with_its_attributes(self, otel):
        with execctx.work(
            "round",
            "refresh-report",
            attributes={"attempt": 1, "replica": "a"},
            tracer_provider=otel.provider,
        ) as work:
            assert execctx.current() is work.unit
            work.set_outcome("ran to its end")

        (span,) = otel.exporter.get_finished_spans()
        assert span.name == "round refresh-report"
        assert span.parent is None
        assert span.kind is trace.SpanKind.INTERNAL
        assert dict(span.attributes or {}) == {
            "attempt": 1,
            "replica": "a",
            "work.kind": "round",
            "work.name": "refresh-report",
            "work.outcome": "ran to its end",
        }
        assert span.status.status_code is StatusCode.OK
        assert span.events == ()
        assert work.unit == execctx.WorkUnit(
            kind="round",
            name="refresh-report",
            trace_id=hex_trace_id(span),
            span_id=hex_span_id(span),
            attributes={"attempt": 1, "replica": "a"},
        )

    def test_a_unit_without_an_outcome_leaves_the_status_unset(self, otel):
        with execctx.work("round", "a", span_name="custom", tracer_provider=otel.provider):
            pass
        assert otel.spans()["custom"].status.status_code is StatusCode.UNSET

    def test_an_exception_escaping_the_block_is_recorded_and_reraised(self, otel):
        with (
            pytest.raises(ZeroDivisionError),
            execctx.work("round", "a", tracer_provider=otel.provider),
        ):
            1 / 0  # noqa: B018

        (span,) = otel.exporter.get_finished_spans()
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ZeroDivisionError: division by zero"
        (event,) = span.events
        assert event.name == "exception"
        assert dict(event.attributes or {})["exception.type"] == "ZeroDivisionError"
        assert dict(event.attributes or {})["exception.escaped"] == "True"

    def test_a_unit_cut_short_carries_the_outcome_and_cause_the_caller_sets(self, otel):
        cause = TimeoutError("lease lost")
        with execctx.work("round", "a", tracer_provider=otel.provider) as work:
            work.set_outcome("cut short", error=cause)

        (span,) = otel.exporter.get_finished_spans()
        assert dict(span.attributes or {})["work.outcome"] == "cut short"
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "TimeoutError: lease lost"
        (event,) = span.events
        assert dict(event.attributes or {})["exception.message"] == "lease lost"
        assert dict(event.attributes or {})["exception.escaped"] == "False"

    def test_an_error_both_set_and_escaping_is_recorded_once(self, otel):
        cause = RuntimeError("boom")
        with (
            pytest.raises(RuntimeError),
            execctx.work("round", "a", tracer_provider=otel.provider) as work,
        ):
            work.set_outcome("failed", error=cause)
            raise cause

        (span,) = otel.exporter.get_finished_spans()
        assert len(span.events) == 1
        assert span.status.status_code is StatusCode.ERROR

    def test_an_exception_escaping_after_an_ok_outcome_still_makes_the_status_error(self, otel):
        with (
            pytest.raises(KeyError),
            execctx.work("round", "a", tracer_provider=otel.provider) as work,
        ):
            work.set_outcome("ran to its end")
            raise KeyError("late")

        (span,) = otel.exporter.get_finished_spans()
        assert span.status.status_code is StatusCode.ERROR
        assert dict(span.attributes or {})["work.outcome"] == "ran to its end"

    def test_set_outcome_refuses_after_the_unit_ended(self, otel):
        with execctx.work("round", "a", tracer_provider=otel.provider) as work:
            pass
        with pytest.raises(RuntimeError, match=r"^the unit of work 'a' has already ended$"):
            work.set_outcome("late")

    def test_a_span_the_job_opens_is_a_child_of_the_root(self, otel):
        job_tracer = otel.provider.get_tracer("job")
        with (
            execctx.work("round", "a", tracer_provider=otel.provider) as work,
            job_tracer.start_as_current_span("child"),
        ):
            pass

        spans = otel.spans()
        root, child = spans["round a"], spans["child"]
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id
        assert hex_trace_id(child) == hex_trace_id(root) == work.unit.trace_id

    def test_each_unit_starts_a_new_trace_even_inside_another_span(self, otel):
        outer_tracer = otel.provider.get_tracer("outer")
        with (
            outer_tracer.start_as_current_span("outer"),
            execctx.work("round", "a", tracer_provider=otel.provider),
        ):
            pass

        spans = otel.spans()
        assert spans["round a"].parent is None
        assert hex_trace_id(spans["round a"]) != hex_trace_id(spans["outer"])

    def test_an_explicit_parent_is_honoured(self, otel):
        outer_tracer = otel.provider.get_tracer("outer")
        with outer_tracer.start_as_current_span("outer") as outer:
            parent = trace.set_span_in_context(outer, otel_context.Context())
        with execctx.work("round", "a", parent=parent, tracer_provider=otel.provider) as work:
            pass

        root = otel.spans()["round a"]
        assert root.parent is not None
        assert root.parent.span_id == outer.get_span_context().span_id
        assert work.unit.trace_id == trace.format_trace_id(outer.get_span_context().trace_id)

    def test_bad_values_fail_on_entry_and_leave_no_span(self, otel):
        with (
            pytest.raises(ValueError, match=r"^kind must be a non-empty string, got ''$"),
            execctx.work("", "a", tracer_provider=otel.provider),
        ):
            pass  # pragma: no cover
        assert otel.exporter.get_finished_spans() == ()
        assert execctx.current() is None


class TestWithoutSdk:
    def test_the_trace_id_is_a_fresh_w3c_id_for_each_unit(self):
        no_sdk = trace.NoOpTracerProvider()
        ids = []
        for _ in range(3):
            with execctx.work("round", "a", tracer_provider=no_sdk) as work:
                assert not work.span.get_span_context().is_valid
                ids.append(work.unit.trace_id)
                assert work.unit.span_id is None
        for trace_id in ids:
            assert re.fullmatch(HEX32, trace_id)
            assert trace_id.strip("0")
        assert len(set(ids)) == 3

    def test_a_unit_inside_a_span_of_another_trace_still_hides_it(self):
        """No SDK, but a valid span current (a propagated request's): inside the unit
        that span is not current (a new trace), and it is current again after."""
        outer = trace.NonRecordingSpan(
            trace.SpanContext(
                trace_id=0x0AF7651916CD43DD8448EB211C80319C,
                span_id=0xB7AD6B7169203331,
                is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            )
        )
        with trace.use_span(outer):
            with execctx.work("round", "a", tracer_provider=trace.NoOpTracerProvider()) as w:
                assert trace.get_current_span() is w.span
                assert not trace.get_current_span().get_span_context().is_valid
                assert w.unit.trace_id != "0af7651916cd43dd8448eb211c80319c"
            assert trace.get_current_span() is outer

    def test_with_no_span_around_the_unit_leaves_the_otel_context_as_it_is(self):
        """No SDK and no span current: the unit's span is the invalid span, current
        already, so the OpenTelemetry context is not replaced (a cost per round saved);
        the unit itself is current all the same."""
        before = otel_context.get_current()
        with execctx.work("round", "a", tracer_provider=trace.NoOpTracerProvider()) as w:
            assert otel_context.get_current() is before
            assert trace.get_current_span() is w.span
            assert execctx.current() is w.unit
        assert otel_context.get_current() is before
        assert execctx.current() is None

    def test_the_global_provider_is_used_by_default(self, monkeypatch):
        """With no provider passed, spans go to the global one (set here, then restored)."""
        # The API lets a process set its global provider once; reset that guard for this
        # test only, as opentelemetry's own test utilities do.
        monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
        # execctx's module-level tracer, as new: a proxy until the provider is set.
        monkeypatch.setattr(execctx._tracing, "_global_tracer", trace.get_tracer("execctx"))
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)

        with execctx.work("round", "a") as work:
            pass

        (span,) = exporter.get_finished_spans()
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == "execctx"
        assert work.unit.trace_id == hex_trace_id(span)


class TestNoLeaks:
    def test_nothing_is_current_after_a_unit_succeeds_or_fails(self, otel):
        with execctx.work("round", "a", tracer_provider=otel.provider):
            pass
        assert execctx.current() is None
        assert not trace.get_current_span().get_span_context().is_valid

        with pytest.raises(ValueError), execctx.work("round", "b", tracer_provider=otel.provider):
            raise ValueError
        assert execctx.current() is None
        assert not trace.get_current_span().get_span_context().is_valid

    def test_a_nested_unit_restores_the_outer_one(self, otel):
        with execctx.work("round", "outer", tracer_provider=otel.provider) as outer:
            with execctx.work("round", "inner", tracer_provider=otel.provider) as inner:
                assert execctx.current() is inner.unit
            assert execctx.current() is outer.unit
            assert trace.get_current_span() is outer.span
        assert inner.unit.trace_id != outer.unit.trace_id


class TestConcurrency:
    def test_two_threads_never_see_each_others_unit(self, otel):
        barrier = threading.Barrier(2, timeout=10)
        tracer = otel.provider.get_tracer("job")

        def job(name: str) -> tuple[str, str | None, str]:
            assert execctx.current() is None  # a new thread starts outside any unit
            with execctx.work("round", name, tracer_provider=otel.provider) as work:
                barrier.wait()  # both units are open now
                with tracer.start_as_current_span(f"child {name}"):
                    seen = execctx.current()
                    barrier.wait()
            assert execctx.current() is None
            assert seen is not None
            return seen.name, seen.span_id, work.unit.trace_id

        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(job, ["a", "b"])

        spans = otel.spans()
        assert a == ("a", hex_span_id(spans["round a"]), hex_trace_id(spans["child a"]))
        assert b == ("b", hex_span_id(spans["round b"]), hex_trace_id(spans["child b"]))
        assert a[2] != b[2]

    def test_two_asyncio_tasks_never_see_each_others_unit(self, otel):
        tracer = otel.provider.get_tracer("job")

        async def job(name: str, barrier: asyncio.Barrier) -> tuple[str, str]:
            with execctx.work("round", name, tracer_provider=otel.provider) as work:
                await barrier.wait()  # both units are open now
                with tracer.start_as_current_span(f"child {name}"):
                    await asyncio.sleep(0)
                    seen = execctx.current()
                    await barrier.wait()
            assert execctx.current() is None
            assert seen is work.unit
            return seen.name, seen.trace_id

        async def main() -> list[tuple[str, str]]:
            barrier = asyncio.Barrier(2)
            results = await asyncio.gather(job("a", barrier), job("b", barrier))
            assert execctx.current() is None
            return list(results)

        (name_a, trace_a), (name_b, trace_b) = asyncio.run(main())
        spans = otel.spans()
        assert (name_a, name_b) == ("a", "b")
        assert trace_a == hex_trace_id(spans["child a"]) == hex_trace_id(spans["round a"])
        assert trace_b == hex_trace_id(spans["child b"]) == hex_trace_id(spans["round b"])
        assert trace_a != trace_b

    def test_a_sync_job_run_via_to_thread_from_a_unit_stays_in_it(self, otel):
        tracer = otel.provider.get_tracer("job")

        def sync_job() -> execctx.WorkUnit | None:
            with tracer.start_as_current_span("child"):
                return execctx.current()

        async def main() -> tuple[execctx.WorkUnit, execctx.WorkUnit | None]:
            with execctx.work("round", "a", tracer_provider=otel.provider) as work:
                return work.unit, await asyncio.to_thread(sync_job)

        unit, seen = asyncio.run(main())
        assert seen is unit
        spans = otel.spans()
        assert spans["child"].parent is not None
        assert spans["child"].parent.span_id == spans["round a"].context.span_id


class TestLogFilter:
    def test_records_in_a_unit_carry_its_ids_and_the_current_span(self, otel, caplog):
        execctx.install_log_filter(caplog.handler)
        log = logging.getLogger("test_execctx.job")
        with caplog.at_level(logging.INFO, logger="test_execctx.job"):
            with execctx.work("round", "refresh", tracer_provider=otel.provider) as work:
                log.info("in the root")
                with otel.provider.get_tracer("job").start_as_current_span("child") as child:
                    log.info("in a child")
            log.info("outside")

        root, in_child, outside = caplog.records
        assert (root.work_kind, root.work_name) == ("round", "refresh")
        assert root.trace_id == in_child.trace_id == work.unit.trace_id
        assert root.span_id == work.unit.span_id
        assert in_child.span_id == trace.format_span_id(child.get_span_context().span_id)
        assert (outside.work_kind, outside.work_name, outside.trace_id, outside.span_id) == (
            "",
            "",
            "",
            "",
        )

    def test_a_format_string_naming_the_fields_never_fails(self):
        handler = logging.StreamHandler(stream := _Sink())
        handler.setFormatter(logging.Formatter("%(work_name)s|%(trace_id)s|%(message)s"))
        execctx.install_log_filter(handler)
        log = logging.getLogger("test_execctx.format")
        log.addHandler(handler)
        log.propagate = False
        try:
            log.warning("outside")
            with execctx.work("round", "a", tracer_provider=trace.NoOpTracerProvider()) as work:
                log.warning("inside")
        finally:
            log.removeHandler(handler)
        assert stream.lines == ["||outside", f"a|{work.unit.trace_id}|inside"]

    def test_install_adds_one_filter_to_each_handler_of_a_logger(self):
        log = logging.getLogger("test_execctx.install")
        first, second = logging.NullHandler(), logging.NullHandler()
        log.addHandler(first)
        log.addHandler(second)
        try:
            execctx.install_log_filter(log)
            execctx.install_log_filter(log)
        finally:
            log.removeHandler(first)
            log.removeHandler(second)
        for handler in (first, second):
            assert [type(f) for f in handler.filters] == [execctx.LogFilter]

    def test_install_refuses_a_logger_without_handlers(self):
        with pytest.raises(
            ValueError,
            match=r"^logger 'test_execctx.bare' has no handlers; add them first"
            r" \(e\.g\. logging\.basicConfig\(\)\) or pass a handler$",
        ):
            execctx.install_log_filter(logging.getLogger("test_execctx.bare"))

    def test_fields_set_where_the_record_was_made_survive_a_queue(self):
        """A filter on the QueueHandler annotates in the job's thread; the listener's keeps it."""
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        queue_handler = logging.handlers.QueueHandler(records)
        execctx.install_log_filter(queue_handler)
        log = logging.getLogger("test_execctx.queue")
        log.addHandler(queue_handler)
        log.propagate = False
        try:
            with execctx.work("round", "a", tracer_provider=trace.NoOpTracerProvider()) as work:
                log.warning("queued")
        finally:
            log.removeHandler(queue_handler)
        record = records.get_nowait()
        assert execctx.current() is None
        assert execctx.LogFilter().filter(record)  # the listener side, outside any unit
        assert (record.work_name, record.trace_id) == ("a", work.unit.trace_id)


class TestStructlogProcessor:
    def test_it_adds_the_unit_and_keeps_bound_keys(self, otel):
        with execctx.work("round", "a", tracer_provider=otel.provider) as work:
            event = execctx.add_context(None, "info", {"event": "hi", "work_name": "mine"})
        assert event == {
            "event": "hi",
            "work_kind": "round",
            "work_name": "mine",
            "trace_id": work.unit.trace_id,
            "span_id": work.unit.span_id,
        }

    def test_it_adds_nothing_outside_a_unit(self):
        assert execctx.add_context(None, "info", {"event": "hi"}) == {"event": "hi"}

    def test_it_leaves_out_the_span_id_without_an_sdk(self):
        with execctx.work("round", "a", tracer_provider=trace.NoOpTracerProvider()):
            event = execctx.add_context(None, "info", {})
        assert set(event) == {"work_kind", "work_name", "trace_id"}


class TestSurface:
    def test_the_public_names_are_pinned_and_name_the_public_module(self):
        assert execctx.__all__ == [
            "LogFilter",
            "Work",
            "WorkUnit",
            "add_context",
            "current",
            "install_log_filter",
            "instrument",
            "uninstrument",
            "work",
        ]
        for name in execctx.__all__:
            assert getattr(execctx, name).__module__ == "execctx"


class _Sink:
    """A text stream collecting the lines written to it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.extend(line for line in text.splitlines() if line)

    def flush(self) -> None:
        pass
