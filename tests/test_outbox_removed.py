"""An occurrence recorded in the outbox and not yet accepted, whose schedule is then
removed: its task's publisher sends it while any replica registers the task, and it is
otherwise resolved obsolete on record (not counted unsent, no exit 1 from ``status``);
on every database, with real Redis behind a proxy."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import cronjob.schedules
import lease
from cronjob import admin
from cronjob.admin._cli import main
from cronjob.contrib import handoff
from cronjob.testing import FakeClock
from tests._proxy import Proxy
from tests.test_outbox import _Recorder as Recorder

rq = pytest.importorskip("rq")
redis = pytest.importorskip("redis")
from cronjob.contrib.rq import enqueue  # noqa: E402

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTE = "0 * * * * *"
YEARLY = "0 0 0 1 1 *"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def queue(redis_url: str) -> Iterator[rq.Queue]:
    connection = redis.Redis.from_url(redis_url, socket_timeout=5)
    queue = rq.Queue(f"cronjob-test-{uuid.uuid4().hex[:12]}", connection=connection)
    yield queue
    queue.empty()
    connection.close()


def outbox(url: str) -> dict[str, sa.RowMapping]:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.select(lease.metadata.tables["cronjob_outbox"])).mappings()
            return {row["id"]: row for row in found}
    finally:
        engine.dispose()


class TestRemovedSchedule:
    def test_its_unsent_occurrence_is_sent_by_the_task_s_publisher(
        self, migrated_engine, db_url, replicas, clock, queue
    ):
        task, schedule = f"export-{uuid.uuid4().hex[:12]}", f"tenant-{uuid.uuid4().hex[:12]}"
        proxy = Proxy(("127.0.0.1", 6379))
        connection = redis.Redis(port=proxy.port, socket_timeout=2, socket_connect_timeout=2)
        down = rq.Queue(queue.name, connection=connection)
        try:
            proxy.cut()
            registry = cronjob.Registry()
            registry.register_task(
                enqueue(down, "tests.rq_tasks.traced", args=("x",), retry_within=10), task
            )
            cronjob.schedules.add(db_url, schedule, task=task, spec=MINUTE, registry=registry)
            replicas(registry, "a")
            clock.advance(65)  # 09:01: recorded, refused, left to the sweep
            oid = cronjob.occurrence_id(schedule, START + timedelta(minutes=1))
            assert outbox(db_url)[oid]["sent_ms"] is None
            assert cronjob.schedules.remove(db_url, schedule)
            clock.advance(5)  # the replica sees the removal: no job of that name any more
            proxy.restore()
            # The sweeps: the task's publisher sends it (once the client has answered the
            # send given up on, which held its row meanwhile: in real seconds).
            deadline = time.monotonic() + 60
            while outbox(db_url)[oid]["sent_ms"] is None and time.monotonic() < deadline:
                clock.advance(15)
                time.sleep(0.2)
            row = outbox(db_url)[oid]
            assert row["sent_ms"] is not None and row["obsolete_ms"] is None
            assert queue.job_ids == [oid]
            assert row["task"] == task  # recorded by the round
        finally:
            proxy.close()
            connection.close()

    def test_with_no_live_replica_registering_its_task_it_is_resolved_obsolete(
        self, db_url, replicas, clock, capsys
    ):
        """Recorded by a round of a schedule of a task this deployment no longer has."""
        engine = lease.create_engine(db_url)
        instant = START - timedelta(minutes=5)
        try:
            lease.migrate(engine)
            with engine.begin() as conn:
                lease.record_publication(
                    conn,
                    id="gone-occurrence",
                    name="tenant-gone",
                    instant=instant,
                    target="rq",
                    payload={"headers": {}},
                    now_ms=round(instant.timestamp() * 1000),
                    hold_ms=60_000,
                    task="export-gone",
                )
        finally:
            engine.dispose()
        registry = cronjob.Registry()
        recorder = Recorder()
        registry.register(handoff(recorder), YEARLY, "other-export")
        replicas(registry, "a")
        clock.advance(20)  # due for 4 min already, but this replica has not seen a sweep
        row = outbox(db_url)["gone-occurrence"]
        assert row["obsolete_ms"] is not None and row["sent_ms"] is None
        assert recorder.sent == []
        report = admin.status(db_url, now=clock.now())
        assert report.outbox.unsent == 0
        assert main(["status", "--database-url", db_url, "--unsent-after", "60"]) == 0
        capsys.readouterr()

    def test_it_is_left_unsent_while_its_schedule_is_on_record(
        self, migrated_engine, db_url, replicas, clock
    ):
        """A schedule whose task no live replica registers is unavailable, not obsolete."""
        registry = cronjob.Registry()
        registry.register_task(handoff(Recorder()), "export-elsewhere")
        cronjob.schedules.add(
            db_url, "tenant-kept", task="export-elsewhere", spec=YEARLY, registry=registry
        )
        engine = lease.create_engine(db_url)
        instant = START - timedelta(minutes=5)
        try:
            with engine.begin() as conn:
                lease.record_publication(
                    conn,
                    id="kept-occurrence",
                    name="tenant-kept",
                    instant=instant,
                    target="test",
                    payload={"headers": {}},
                    now_ms=round(instant.timestamp() * 1000),
                    hold_ms=0,
                    task="export-elsewhere",
                )
        finally:
            engine.dispose()
        other = cronjob.Registry()
        other.register(handoff(Recorder()), YEARLY, "other-export")
        replicas(other, "a")
        clock.advance(120)
        row = outbox(db_url)["kept-occurrence"]
        assert row["obsolete_ms"] is None and row["sent_ms"] is None
