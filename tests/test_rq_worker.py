"""A real ``rq worker`` process runs what the replicas hand over: its span continues the
round's trace, and ``once`` runs a task's body once per occurrence id (a redelivery runs
nothing, a failed body runs again, a dead worker's body runs after its stale time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cronjob
import lease
from cronjob.testing import FakeClock

rq = pytest.importorskip("rq")
redis = pytest.importorskip("redis")
from cronjob.contrib.rq import enqueue  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def queue(redis_url: str) -> Iterator[rq.Queue]:
    connection = redis.Redis.from_url(redis_url, socket_timeout=5)
    queue = rq.Queue(f"cronjob-test-{uuid.uuid4().hex[:12]}", connection=connection)
    yield queue
    queue.empty()
    rq.registry.FailedJobRegistry(queue=queue).cleanup()
    connection.close()


def unique(stem: str) -> str:
    """An id of this test's own: RQ keeps a job under ``rq:job:<id>`` whatever its queue,
    so the same test on another database (``-n 3``) or in another run would share the key,
    and its ``queue.empty()`` would delete this test's job."""
    return f"{stem}-{uuid.uuid4().hex[:12]}"


def work(queue: rq.Queue, redis_url: str, out: Path, db_url: str | None = None) -> None:
    """Run a real ``rq worker`` in burst mode: it runs every job queued, then ends.

    Once it says it is done it is killed: its exit joins a Redis pub/sub thread that at
    times waits out its whole 60 s poll (seen under ``-n 3``), after the work is done."""
    env = {**os.environ, "CRONJOB_TEST_OUT": str(out), "PYTHONPATH": str(ROOT)}
    if db_url is not None:
        env["CRONJOB_DATABASE_URL"] = db_url
    log = out.with_name(f"{out.stem}-worker-{uuid.uuid4().hex[:8]}.log")
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", redis_url, queue.name],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    try:
        while worker.poll() is None and b"done, quitting" not in log.read_bytes():
            assert time.monotonic() < deadline, f"rq worker not done: {log.read_text()[-2000:]}"
            time.sleep(0.05)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(15)
    assert worker.returncode in (0, -9), log.read_text()[-2000:]


def lines(out: Path) -> list[dict[str, object]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_workers_span_is_under_the_rounds_trace(
    db_url, replicas, clock, queue, redis_url, tmp_path
):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = cronjob.Registry()
    name = unique("job")
    registry.register(enqueue(queue, "tests.rq_tasks.traced", args=("t",)), "0 * * * * *", name)
    replicas(registry, "a", tracer_provider=provider)
    clock.advance(65)
    out = tmp_path / "out.jsonl"
    work(queue, redis_url, out)
    [round_span] = [s for s in exporter.get_finished_spans() if s.parent is None]
    [seen] = [line for line in lines(out) if "job_id" in line]
    [span] = [line for line in lines(out) if "span" in line]
    assert seen["job_id"] == cronjob.occurrence_id(name, datetime(2026, 3, 2, 9, 1, tzinfo=UTC))
    assert span["trace_id"] == format(round_span.context.trace_id, "032x")
    assert span["parent"] is not None


class TestOnce:
    def _enqueue(self, queue: rq.Queue, job_id: str, **kwargs: object) -> None:
        queue.enqueue_call("tests.rq_tasks.counted", args=("c",), kwargs=kwargs, job_id=job_id)

    def test_a_second_delivery_of_an_id_runs_nothing(
        self, migrated_engine, db_url, queue, redis_url, tmp_path
    ):
        out = tmp_path / "out.jsonl"
        one, two = unique("occ-1"), unique("occ-2")
        self._enqueue(queue, one)
        work(queue, redis_url, out, db_url)
        self._enqueue(queue, one)  # a republish with the same id
        self._enqueue(queue, two)
        work(queue, redis_url, out, db_url)
        assert [line["body"] for line in lines(out)] == [one, two]

    def test_a_body_that_raised_runs_again_on_redelivery(
        self, migrated_engine, db_url, queue, redis_url, tmp_path
    ):
        out = tmp_path / "out.jsonl"
        one = unique("occ-1")
        self._enqueue(queue, one, fail=True)
        work(queue, redis_url, out, db_url)
        self._enqueue(queue, one)
        work(queue, redis_url, out, db_url)
        self._enqueue(queue, one)
        work(queue, redis_url, out, db_url)
        assert [line["body"] for line in lines(out)] == [one, one]

    def test_a_dead_workers_body_runs_after_its_stale_time_and_not_before(
        self, migrated_engine, db_url, queue, redis_url, tmp_path
    ):
        out = tmp_path / "out.jsonl"
        now_ms = round(datetime.now(UTC).timestamp() * 1000)
        # As a worker killed in the body leaves them: one just now, one two hours ago.
        fresh, stale = unique("fresh"), unique("stale")
        for id_, started in ((fresh, now_ms), (stale, now_ms - 7_200_000)):
            token, _state = lease.begin_once(
                migrated_engine, id_, task="c", holder="dead", now_ms=started, stale_ms=1
            )
            assert token is not None
        self._enqueue(queue, fresh)
        self._enqueue(queue, stale)
        work(queue, redis_url, out, db_url)
        assert [line["body"] for line in lines(out)] == [stale]
        failed = rq.registry.FailedJobRegistry(queue=queue)
        assert failed.get_job_ids() == [fresh]
        assert "OccurrenceBusy" in (queue.fetch_job(fresh).latest_result().exc_string or "")
