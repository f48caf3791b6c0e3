"""Each round is traceable: its root span, its log records, its SQL statements."""

from __future__ import annotations

import logging
import re
import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import cronjob
import execctx
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def scheduler(tmp_path, registry, clock, provider, **options) -> cronjob.Scheduler:
    return cronjob.Scheduler(
        f"sqlite:///{tmp_path / 'trace.sqlite'}",
        registry=registry,
        clock=clock,
        replica_id="r1",
        tracer_provider=provider,
        **options,
    )


def roots(exporter: InMemorySpanExporter):
    return [s for s in exporter.get_finished_spans() if s.parent is None]


class TestRootSpan:
    def test_a_round_that_succeeds_is_one_root_span_with_its_children(
        self, tmp_path, exporter, provider
    ):
        clock = FakeClock(START)
        trace_ids: list[str] = []

        def job(ctx: cronjob.Round) -> None:
            trace_ids.append(ctx.trace_id)
            with provider.get_tracer("app").start_as_current_span("child"):
                pass

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "hourly")
        with scheduler(tmp_path, registry, clock, provider):
            clock.advance(3600)
        [root] = roots(exporter)
        [child] = [s for s in exporter.get_finished_spans() if s.parent is not None]
        assert root.name == "cronjob hourly"
        assert dict(root.attributes or {}) == {
            "cronjob.job": "hourly",
            "cronjob.instant": "2026-03-02T10:00:00+00:00",
            "cronjob.attempt": 1,
            "cronjob.replica": "r1",
            "cronjob.reason": "schedule",
            "work.kind": "round",
            "work.name": "hourly",
            "work.outcome": "succeeded",
        }
        assert root.status.status_code is StatusCode.OK
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
        assert trace_ids == [trace.format_trace_id(root.context.trace_id)]

    def test_a_round_that_fails_records_the_exception_with_status_error(
        self, tmp_path, exporter, provider
    ):
        clock = FakeClock(START)

        def job(ctx: cronjob.Round) -> None:
            raise ValueError("no data")

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "hourly")
        with scheduler(tmp_path, registry, clock, provider):
            clock.advance(3600)
        [root] = roots(exporter)
        assert root.attributes is not None and root.attributes["work.outcome"] == "failed"
        assert root.status.status_code is StatusCode.ERROR
        [event] = [e for e in root.events if e.name == "exception"]
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == "no data"

    def test_a_round_cut_short_says_so_and_why(self, tmp_path, exporter, provider):
        clock = FakeClock(START)

        def job(ctx: cronjob.Round) -> None:
            if ctx.wait(60):
                ctx.check()

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "hourly")
        with scheduler(tmp_path, registry, clock, provider):
            clock.advance(3600)
        [root] = roots(exporter)
        assert root.attributes is not None
        assert root.attributes["work.outcome"] == "cut short"
        assert root.attributes["cronjob.cause"] == (
            "Shutdown: job 'hourly': the scheduler is draining"
        )

    def test_each_round_has_a_trace_of_its_own(self, tmp_path, exporter, provider):
        clock = FakeClock(START)
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 */20 * * * *", "often")
        with scheduler(tmp_path, registry, clock, provider):
            clock.advance(3600)
        trace_ids = {s.context.trace_id for s in roots(exporter)}
        assert len(trace_ids) == 3


class TestLogsAndSql:
    def test_log_records_inside_a_round_carry_its_name_and_trace_id(self, tmp_path, provider):
        clock = FakeClock(START)
        records: list[logging.LogRecord] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record)

        handler = Keep()
        execctx.install_log_filter(handler)
        seen: list[str] = []

        def job(ctx: cronjob.Round) -> None:
            seen.append(ctx.trace_id)
            logging.getLogger("app").warning("working")

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "hourly")
        root = logging.getLogger()
        root.addHandler(handler)
        level = root.level
        root.setLevel(logging.DEBUG)  # a round's own start and end lines are DEBUG
        try:
            with scheduler(tmp_path, registry, clock, provider):
                clock.advance(3600)
        finally:
            root.removeHandler(handler)
            root.setLevel(level)
        inside = [r for r in records if r.getMessage() == "working"]
        own = ("ran to its end", "started on")
        library = [r for r in records if any(text in r.getMessage() for text in own)]
        outside = [r for r in records if "started:" in r.getMessage()]
        assert len(inside) == 1 and len(library) == 2
        for record in inside + library:
            assert (record.work_name, record.trace_id) == ("hourly", seen[0])
        assert outside and outside[0].work_name == ""

    def test_a_scheduled_round_logs_only_the_summary_at_info(self, tmp_path, provider, caplog):
        """Its start and end lines are DEBUG; the dispatcher's summary counts them."""
        clock = FakeClock(START)
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 */20 * * * *", "often")
        with (
            caplog.at_level(logging.INFO, logger="cronjob"),
            scheduler(tmp_path, registry, clock, provider),
        ):
            clock.advance(3600)
        messages = [r.getMessage() for r in caplog.records if r.name == "cronjob"]
        assert not [m for m in messages if "started on" in m or "ran to its end" in m]
        summaries = [m for m in messages if m.startswith("rounds in the last")]
        counts = [re.search(r"(\d+) started, (\d+) ended", m).groups() for m in summaries]
        assert sum(int(s) for s, _ in counts) == sum(int(e) for _, e in counts) == 3

    def test_statements_of_a_round_carry_a_comment_naming_it(self, tmp_path, provider):
        clock = FakeClock(START)
        statements: list[tuple[str, str | None]] = []
        lock = threading.Lock()
        trace_ids: list[str] = []

        def job(ctx: cronjob.Round) -> None:
            trace_ids.append(ctx.trace_id)
            with ctx.transaction() as conn:
                conn.execute(sa.text("SELECT 42"))

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "it's */ odd")
        sched = scheduler(tmp_path, registry, clock, provider)
        with sched:
            assert sched.engine is not None

            @sa.event.listens_for(sched.engine, "after_cursor_execute")
            def capture(conn, cursor, statement, parameters, context, executemany):
                unit = execctx.current()
                with lock:
                    statements.append((statement, unit.name if unit else None))

            clock.advance(3600)
        ours = [s for s, unit in statements if "SELECT 42" in s]
        assert len(ours) == 1
        trace_id = trace_ids[0]
        comment = (
            rf"/\*job='it%27s%20%2A%2F%20odd',trace_id='{trace_id}',"
            rf"traceparent='00-{trace_id}-[0-9a-f]{{16}}-[0-9a-f]{{2}}'\*/$"
        )
        assert re.search(comment, ours[0]), ours[0]
        outside = [s for s, unit in statements if unit is None]
        assert outside and all("/*" not in s for s in outside)

    def test_sql_comments_can_be_turned_off(self, tmp_path, provider):
        clock = FakeClock(START)
        statements: list[str] = []

        def job(ctx: cronjob.Round) -> None:
            with ctx.transaction() as conn:
                conn.execute(sa.text("SELECT 42"))

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "hourly")
        sched = scheduler(tmp_path, registry, clock, provider, sql_comments=False)
        with sched:
            assert sched.engine is not None
            sa.event.listen(
                sched.engine,
                "after_cursor_execute",
                lambda conn, cursor, statement, *rest: statements.append(statement),
            )
            clock.advance(3600)
        assert [s for s in statements if "SELECT 42" in s] == ["SELECT 42"]


def test_without_an_sdk_the_trace_id_is_a_fresh_w3c_id(tmp_path):
    clock = FakeClock(START)
    ids: list[str] = []
    registry = cronjob.Registry()
    registry.register(lambda ctx: ids.append(ctx.trace_id), "0 */30 * * * *", "often")
    with cronjob.Scheduler(
        f"sqlite:///{tmp_path / 'plain.sqlite'}",
        registry=registry,
        clock=clock,
        tracer_provider=trace.NoOpTracerProvider(),
    ):
        clock.advance(timedelta(hours=1).total_seconds())
    assert len(ids) == 2 and ids[0] != ids[1]
    assert all(len(i) == 32 and int(i, 16) for i in ids)
