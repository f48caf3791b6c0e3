"""Tests for execctx's SQL comments, on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import execctx

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

#: Names a job might have that would break out of a naively built comment.
HOSTILE_NAMES = [
    "*/; DROP TABLE x; --",
    "it's a 'quoted' name",
    'double "quoted"',
    "two\nlines\r\n-- and a comment",
    "100% %s %(name)s ?",
    "/* nested */ */",
    "ünïcødé ✓",
]

COMMENT = re.compile(r" /\*(?P<body>[^*]*)\*/(?P<semicolon>;?)$")


def parse_comment(statement: str) -> dict[str, str]:
    """Decode the sqlcommenter comment at the end of ``statement`` (fails if none)."""
    match = COMMENT.search(statement)
    assert match, f"no comment at the end of {statement!r}"
    pairs = {}
    for pair in match["body"].split(","):
        key, quoted = pair.split("=", 1)
        # Only URL-safe characters between the quotes: nothing that could end either.
        assert re.fullmatch(r"'[A-Za-z0-9_.~%-]*'", quoted), quoted
        pairs[key] = unquote(quoted[1:-1])
    return pairs


@pytest.fixture
def sdk() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    yield provider
    provider.shutdown()


@pytest.fixture
def sqlite() -> Iterator[tuple[sa.Engine, list[str]]]:
    """An instrumented in-memory SQLite engine and the statements its cursor ran."""
    engine = sa.create_engine("sqlite://")
    execctx.instrument(engine)
    seen: list[str] = []

    @sa.event.listens_for(engine, "after_cursor_execute")
    def capture(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    yield engine, seen
    engine.dispose()


@pytest.fixture(scope="module")
def postgres() -> Iterator[sa.Engine]:
    """An instrumented engine on the test server; fails in CI when it is unreachable."""
    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        engine.dispose()
        message = f"PostgreSQL is not reachable at {POSTGRES_URL}: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    execctx.instrument(engine)
    yield engine
    engine.dispose()


class TestCommentOnSqlite:
    def test_a_statement_in_a_unit_carries_its_name_and_ids(self, sqlite, sdk):
        engine, seen = sqlite
        with (
            execctx.work("round", "refresh-report", tracer_provider=sdk) as work,
            engine.connect() as conn,
        ):
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
        span = work.span.get_span_context()
        assert seen == [
            "SELECT 1 /*job='refresh-report',"
            f"trace_id='{work.unit.trace_id}',"
            f"traceparent='00-{work.unit.trace_id}-{work.unit.span_id}-{span.trace_flags:02x}'*/"
        ]

    def test_traceparent_names_the_current_child_span(self, sqlite, sdk):
        engine, seen = sqlite
        with (
            execctx.work("round", "a", tracer_provider=sdk),
            sdk.get_tracer("job").start_as_current_span("child") as child,
            engine.connect() as conn,
        ):
            conn.execute(sa.text("SELECT 1"))
        span_id = trace.format_span_id(child.get_span_context().span_id)
        assert parse_comment(seen[-1])["traceparent"].split("-")[2] == span_id

    def test_without_an_sdk_there_is_no_traceparent(self, sqlite):
        engine, seen = sqlite
        no_sdk = trace.NoOpTracerProvider()
        with execctx.work("round", "a", tracer_provider=no_sdk) as work, engine.connect() as c:
            c.execute(sa.text("SELECT 1"))
        assert seen == [f"SELECT 1 /*job='a',trace_id='{work.unit.trace_id}'*/"]

    def test_a_statement_outside_a_unit_is_untouched(self, sqlite):
        engine, seen = sqlite
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        assert seen == ["SELECT 1"]

    def test_the_comment_goes_before_a_final_semicolon(self, sqlite, sdk):
        engine, seen = sqlite
        with execctx.work("round", "a", tracer_provider=sdk), engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1;  \n")
        assert COMMENT.search(seen[0])
        assert seen[0].startswith("SELECT 1 /*job='a',")
        assert seen[0].endswith("*/;")

    def test_instrumenting_twice_adds_one_comment(self, sqlite, sdk):
        engine, seen = sqlite
        execctx.instrument(engine)
        with execctx.work("round", "a", tracer_provider=sdk), engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        assert seen[0].count("/*") == 1

    def test_uninstrument_and_enabled_false_turn_it_off(self, sqlite, sdk):
        engine, seen = sqlite
        execctx.uninstrument(engine)
        execctx.uninstrument(engine)  # harmless when already off
        execctx.instrument(engine)
        execctx.instrument(engine, enabled=False)
        with execctx.work("round", "a", tracer_provider=sdk), engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        assert seen == ["SELECT 1"]

    @pytest.mark.parametrize("name", HOSTILE_NAMES)
    def test_a_hostile_name_is_encoded_and_round_trips(self, sqlite, name):
        engine, seen = sqlite
        with execctx.work("round", name) as work, engine.connect() as conn:
            assert conn.execute(sa.text("SELECT :v"), {"v": 7}).scalar() == 7
        assert parse_comment(seen[0]) == {"job": name, "trace_id": work.unit.trace_id}
        assert seen[0].count("*/") == 1


@pytest.mark.postgres
class TestCommentOnPostgres:
    def test_the_server_sees_the_comment_in_pg_stat_activity(self, postgres, sdk):
        """A statement held on a lock is read from a second connection, as a DBA would."""
        lock_key = 0x65786563  # arbitrary, private to this test

        def job() -> tuple[int, str, str]:
            with (
                execctx.work("round", "refresh-report", tracer_provider=sdk) as work,
                postgres.connect() as conn,
            ):
                pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
                pids.put(pid)
                conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": lock_key})
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": lock_key})
                traceparent = f"00-{work.unit.trace_id}-{work.unit.span_id}-"
                return pid, work.unit.trace_id, traceparent

        pids: queue.SimpleQueue[int] = queue.SimpleQueue()
        with postgres.connect() as observer, ThreadPoolExecutor(1) as pool:
            observer.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": lock_key})
            observer.commit()
            running = pool.submit(job)
            pid = pids.get(timeout=10)
            deadline = time.monotonic() + 10
            query = None
            while time.monotonic() < deadline:
                query = observer.execute(
                    sa.text(
                        "SELECT query FROM pg_stat_activity"
                        " WHERE pid = :pid AND wait_event_type = 'Lock'"
                    ),
                    {"pid": pid},
                ).scalar()
                observer.rollback()  # a fresh snapshot of pg_stat_activity each time
                if query is not None:
                    break
                time.sleep(0.01)
            observer.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": lock_key})
            observer.commit()
            _, trace_id, traceparent = running.result(timeout=10)

        assert query is not None, "the job's statement never waited on the lock"
        assert query.startswith(
            f"SELECT pg_advisory_lock($1) /*job='refresh-report',trace_id='{trace_id}',"
            f"traceparent='{traceparent}"
        )
        assert query.endswith("'*/")

    @pytest.mark.parametrize("name", HOSTILE_NAMES)
    def test_a_hostile_name_cannot_change_the_statement(self, postgres, sdk, name):
        with execctx.work("round", name, tracer_provider=sdk) as work, postgres.connect() as conn:
            conn.execute(sa.text("CREATE TEMPORARY TABLE x (v int)"))
            conn.execute(sa.text("INSERT INTO x VALUES (:v)"), {"v": 41})
            seen_by_server, value = conn.execute(
                sa.text("SELECT current_query(), v + 1 FROM x")
            ).one()
            assert conn.execute(sa.text("SELECT count(*) FROM x")).scalar_one() == 1
            conn.rollback()
        assert value == 42
        assert seen_by_server.startswith("SELECT current_query(), v + 1 FROM x /*job='")
        assert parse_comment(seen_by_server)["job"] == name
        assert parse_comment(seen_by_server)["trace_id"] == work.unit.trace_id

    @pytest.mark.parametrize(
        "run",
        [
            pytest.param(lambda c: c.execute(sa.text("SELECT current_query()")), id="text"),
            pytest.param(
                lambda c: c.execute(sa.text("SELECT current_query() WHERE :t"), {"t": True}),
                id="text-with-parameters",
            ),
            pytest.param(lambda c: c.exec_driver_sql("SELECT current_query()"), id="driver-sql"),
            pytest.param(
                lambda c: c.execution_options(no_parameters=True).exec_driver_sql(
                    "SELECT current_query()"
                ),
                id="driver-sql-no-parameters",
            ),
        ],
    )
    def test_the_server_sees_percent_encoding_unchanged_on_every_path(self, postgres, run):
        """psycopg reads `%` as a placeholder only when it interpolates; neither case leaks `%%`."""
        name = "a b%c"
        with execctx.work("round", name) as work, postgres.connect() as conn:
            seen_by_server = run(conn).scalar_one()
        assert seen_by_server.endswith(f" /*job='a%20b%25c',trace_id='{work.unit.trace_id}'*/")

    def test_executemany_runs_with_the_comment(self, postgres):
        with execctx.work("round", "100%") as work, postgres.connect() as conn:
            conn.execute(sa.text("CREATE TEMPORARY TABLE y (v int)"))
            conn.execute(sa.text("INSERT INTO y VALUES (:v)"), [{"v": 1}, {"v": 2}])
            total = conn.execute(sa.text("SELECT sum(v) FROM y")).scalar_one()
            conn.rollback()
        assert total == 3
        assert work.unit.name == "100%"

    def test_two_threads_tag_their_own_statements(self, postgres, sdk):
        barrier = threading.Barrier(2, timeout=10)

        def job(name: str) -> tuple[dict[str, str], str]:
            with execctx.work("round", name, tracer_provider=sdk) as work:
                with postgres.connect() as conn:
                    barrier.wait()  # both units are open now
                    seen = conn.execute(sa.text("SELECT current_query()")).scalar_one()
                    barrier.wait()
                return parse_comment(seen), work.unit.trace_id

        with ThreadPoolExecutor(2) as pool:
            (a, trace_a), (b, trace_b) = pool.map(job, ["a", "b"])
        assert (a["job"], a["trace_id"]) == ("a", trace_a)
        assert (b["job"], b["trace_id"]) == ("b", trace_b)
        assert trace_a != trace_b
