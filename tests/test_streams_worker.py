"""Real ``cronjob stream-worker`` processes on a real Redis Stream and each database:
every entry gets its disposition (forged ones included), a handler runs once per
occurrence id, the descriptor pinned at admission governs later deliveries, a dead
consumer's entry is taken over, and SIGTERM drains."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease

redis = pytest.importorskip("redis")

from tests._streams import WorkerProcess, fields, lines, new_stream, wait_for  # noqa: E402

NINE_ONE = datetime(2026, 3, 2, 9, 1, tzinfo=UTC)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, socket_timeout=5, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def stream(client: redis.Redis) -> Iterator[str]:
    yield from new_stream(client)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = lease.create_engine(db_url)
    lease.migrate(engine)
    yield engine
    engine.dispose()


def pending(client: redis.Redis, stream: str, group: str = "workers") -> int:
    try:
        return int(client.xpending(stream, group)["pending"])
    except redis.ResponseError:
        return 0


def dead(client: redis.Redis, stream: str) -> list[dict[str, str]]:
    return [entry for _, entry in client.xrange(stream + ":dead")]


class TestDispositions:
    def test_each_entry_gets_its_disposition_in_order(
        self, client, stream, engine, db_url, redis_url, tmp_path
    ):
        """Valid, forged (wrong id, fractional second, non-firing instant), removed,
        unhandled and failing entries, read by one real worker."""
        out = tmp_path / "out.jsonl"
        at = NINE_ONE
        forged = {
            "wrong id": fields("minutely", at, occurrence_id=str(uuid.uuid4())),
            "fractional": fields("minutely", at, scheduled_at="2026-03-02T09:01:00.500Z"),
            "not firing": fields("minutely", at + timedelta(seconds=30)),
            "bad source": fields("minutely", at, source="somebody.else"),
        }
        client.xadd(stream, fields("minutely", at))
        for entry in forged.values():
            client.xadd(stream, entry)
        client.xadd(stream, fields("removed-long-ago", at))
        client.xadd(stream, fields("unhandled", at))
        client.xadd(stream, fields("flaky", at))
        client.xadd(stream, fields("minutely", at))  # a second delivery of the first id
        worker = WorkerProcess(redis_url, stream, db_url, out)
        try:
            wait_for(lambda: len(dead(client, stream)) == 5, "5 dead letters")
            wait_for(lambda: pending(client, stream) == 1, "only the unhandled entry pending")
        finally:
            assert worker.terminate() == 0, worker.output()
        ran = lines(out)
        assert [line["handler"] for line in ran if line["handler"] == "minutely"] == ["minutely"]
        assert [line["attempt"] for line in ran if line["handler"] == "flaky"] == [1, 2]
        reasons = [letter["reason"] for letter in dead(client, stream)]
        assert reasons[0].startswith("occurrence_id ")
        assert reasons[1] == (
            "scheduled_at '2026-03-02T09:01:00.500Z' is not RFC 3339 UTC to the whole "
            "second (YYYY-MM-DDTHH:MM:SSZ)"
        )
        assert reasons[2] == "2026-03-02T09:01:30+00:00 is not a firing of 'minutely' (0 * * * * *)"
        assert reasons[3] == "source is 'somebody.else', not 'cronjob.schedule'"
        assert reasons[4].startswith("handler 'flaky' failed 2 time(s): RuntimeError(")
        assert dead(client, stream)[2]["schedule"] == "minutely"  # the fields are kept
        detail = client.xpending_range(stream, "workers", min="-", max="+", count=10)
        [entry] = detail
        assert (
            client.xrange(stream, entry["message_id"], entry["message_id"])[0][1]["schedule"]
            == "unhandled"
        )

    def test_a_data_schedules_entry_runs_its_tasks_handler_with_its_args(
        self, client, stream, engine, db_url, redis_url, tmp_path
    ):
        out = tmp_path / "out.jsonl"
        sid = f"tenant-{uuid.uuid4().hex[:6]}"
        cronjob.schedules.add(
            engine,
            sid,
            task="report",
            spec="0 0 * * * *",
            args={"tenant": 7},
            registry=_task_registry(),
        )
        at = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
        client.xadd(stream, fields(sid, at, args='{"tenant":7}'))
        client.xadd(stream, fields(sid, at + timedelta(minutes=1)))  # not a firing
        worker = WorkerProcess(redis_url, stream, db_url, out)
        try:
            wait_for(lambda: len(lines(out)) == 1 and len(dead(client, stream)) == 1, "run")
        finally:
            assert worker.terminate() == 0, worker.output()
        assert lines(out) == [{"handler": "report", "schedule": sid, "args": {"tenant": 7}}]

    def test_an_admitted_occurrence_runs_on_after_its_schedule_is_removed(
        self, client, stream, engine, db_url, redis_url, tmp_path
    ):
        """Obsolete is for occurrences never admitted: a pinned one keeps its contract."""
        sid = f"tenant-{uuid.uuid4().hex[:6]}"
        at = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
        occurrence = cronjob.occurrence_id(sid, at)
        lease.admit(
            engine,
            occurrence,
            schedule=sid,
            handler="report",
            timeout_ms=5000,
            retries=0,
            now_ms=0,
        )
        client.xadd(stream, fields(sid, at))
        client.xadd(stream, fields(f"{sid}-never-admitted", at))
        out = tmp_path / "out.jsonl"
        worker = WorkerProcess(redis_url, stream, db_url, out)
        try:
            wait_for(lambda: len(lines(out)) == 1 and pending(client, stream) == 0, "run")
        finally:
            assert worker.terminate() == 0, worker.output()
        assert dead(client, stream) == []


def _task_registry() -> cronjob.Registry:
    registry = cronjob.Registry()
    registry.register_task(lambda ctx: None, "report")
    return registry


class TestPinnedDescriptor:
    def test_a_redelivery_adopts_the_descriptor_of_the_first_claim(
        self, client, stream, engine, db_url, redis_url, tmp_path
    ):
        """The first claim pins two retries; a worker whose handler now allows none still
        retries under the pinned budget instead of dead-lettering."""
        out = tmp_path / "out.jsonl"
        client.xadd(stream, fields("flaky", NINE_ONE))
        first = WorkerProcess(redis_url, stream, db_url, out, env={"STREAM_RETRIES": "2"})
        try:
            wait_for(lambda: len(lines(out)) == 1, "the first run")
        finally:
            assert first.terminate() == 0, first.output()
        later = WorkerProcess(redis_url, stream, db_url, out, env={"STREAM_RETRIES": "0"})
        try:
            wait_for(lambda: len(dead(client, stream)) == 1, "the dead letter", within=60)
        finally:
            assert later.terminate() == 0, later.output()
        assert [line["attempt"] for line in lines(out)] == [1, 2, 3]
        admission = lease.read_admission(engine, cronjob.occurrence_id("flaky", NINE_ONE))
        assert admission is not None
        assert (admission.handler, admission.retries, admission.failures) == ("flaky", 2, 3)


class TestTakeover:
    def test_a_consumer_killed_mid_handler_has_its_entry_reclaimed(
        self, client, stream, engine, db_url, redis_url, tmp_path
    ):
        out = tmp_path / "out.jsonl"
        client.xadd(stream, fields("slow", NINE_ONE))
        env = {"STREAM_SLEEP": "60", "STREAM_TIMEOUT": "2"}
        killed = WorkerProcess(redis_url, stream, db_url, out, env=env)
        wait_for(lambda: len(lines(out)) == 1, "the handler started", within=60)
        killed.kill()
        other = WorkerProcess(redis_url, stream, db_url, out, env={"STREAM_TIMEOUT": "600"})
        try:
            wait_for(lambda: pending(client, stream) == 0, "the entry done", within=60)
        finally:
            assert other.terminate() == 0, other.output()
        starts = [line for line in lines(out) if line["at"] == "start"]
        assert len(starts) == 2
        assert starts[0]["pid"] != starts[1]["pid"]
        assert [line["at"] for line in lines(out)][-1] == "end"

    def test_sigterm_drains_the_handler_in_hand(
        self, client, stream, engine, db_url, redis_url, tmp_path
    ):
        out = tmp_path / "out.jsonl"
        client.xadd(stream, fields("slow", NINE_ONE))
        worker = WorkerProcess(redis_url, stream, db_url, out, env={"STREAM_SLEEP": "2"})
        wait_for(lambda: len(lines(out)) == 1, "the handler started", within=60)
        assert worker.terminate() == 0, worker.output()
        assert [line["at"] for line in lines(out)] == ["start", "end"]
        assert pending(client, stream) == 0


def test_the_command_refuses_a_module_it_cannot_import(redis_url, sqlite_url, capsys):
    from cronjob.admin._cli import main

    status = main(
        ["stream-worker", "no.such.module", "--redis", redis_url, "--stream", "s", "--group", "g"]
    )
    assert status == 2
    assert capsys.readouterr().err.startswith(
        "cronjob: error: cannot import module 'no.such.module': ModuleNotFoundError"
    )
