"""The outbox: each instant of a job handed to RQ is recorded before it is sent, sent with
its occurrence id as the job's id, marked once Redis accepted it, and sent again by the
sweep (any replica, one at a time) until it is; on every database, with real Redis."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider

import cronjob
import lease
from cronjob.contrib import Occurrence, handoff
from cronjob.testing import FakeClock
from tests._proxy import Proxy

rq = pytest.importorskip("rq")
redis = pytest.importorskip("redis")
from cronjob.contrib.rq import META_KEY, enqueue  # noqa: E402

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTE = "0 * * * * *"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def queue(redis_url: str) -> Iterator[rq.Queue]:
    """An RQ queue of the test's own name (no other run sees its jobs)."""
    connection = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    queue = rq.Queue(f"cronjob-test-{uuid.uuid4().hex[:12]}", connection=connection)
    yield queue
    queue.empty()
    connection.close()


@pytest.fixture
def name() -> str:
    """A job name of the test's own. RQ keeps a job under ``rq:job:<id>`` whatever its
    queue, and an occurrence id is a function of (name, instant): with one name, the same
    test on another database (``-n 3``) or in another run shares the key, and its
    ``queue.empty()`` deletes this test's job (``fetch_job`` then returns None)."""
    return f"export-{uuid.uuid4().hex[:12]}"


def outbox(url: str) -> list[dict[str, object]]:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(lease.metadata.tables["cronjob_outbox"])).mappings()
            return [dict(row) for row in rows]
    finally:
        engine.dispose()


def record(url: str, name: str, instant: datetime, *, next_try: datetime) -> str:
    """Put an unsent row of ``name`` on record, as a round leaves it; its id."""
    oid = cronjob.occurrence_id(name, instant)
    engine = lease.create_engine(url)
    try:
        lease.migrate(engine)
        with engine.begin() as conn:
            lease.record_publication(
                conn,
                id=oid,
                name=name,
                instant=instant,
                target="rq",
                payload={"headers": {}},
                now_ms=round(instant.timestamp() * 1000),
                hold_ms=round((next_try - instant).total_seconds() * 1000),
            )
    finally:
        engine.dispose()
    return oid


def at(minute: int) -> datetime:
    return START + timedelta(minutes=minute)


class TestRecordedSentMarked:
    def test_each_instant_is_one_rq_job_whose_id_is_the_occurrence_id(
        self, name, db_url, replicas, clock, queue
    ):
        registry = cronjob.Registry()
        registry.register(enqueue(queue, "tests.rq_tasks.traced", args=("x",)), MINUTE, name)
        replicas(registry, "a")
        clock.advance(125)  # 09:01 and 09:02
        ids = [cronjob.occurrence_id(name, at(m)) for m in (1, 2)]
        assert queue.job_ids == ids
        job = queue.fetch_job(ids[0])
        assert job.args == ("x",)
        assert job.meta[META_KEY]["instant"] == "2026-03-02T09:01:00Z"
        assert job.meta[META_KEY]["name"] == name
        rows = sorted(outbox(db_url), key=lambda row: row["instant_ms"])
        assert [row["id"] for row in rows] == ids
        assert all(row["sent_ms"] is not None for row in rows)
        assert rows[0]["target"] == "rq"

    def test_two_replicas_publish_each_instant_once(self, name, db_url, replicas, clock, queue):
        registry = cronjob.Registry()
        registry.register(enqueue(queue, "tests.rq_tasks.traced", args=("x",)), MINUTE, name)
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(185)
        assert queue.job_ids == [cronjob.occurrence_id(name, at(m)) for m in (1, 2, 3)]

    def test_the_round_s_trace_context_is_in_the_job(self, name, db_url, replicas, clock, queue):
        provider = TracerProvider()
        seen: list[str] = []
        registry = cronjob.Registry()
        handoff = enqueue(queue, "tests.rq_tasks.traced", args=("x",))

        def job(ctx: cronjob.Round) -> None:
            seen.append(ctx.trace_id)
            handoff(ctx)

        registry.register(job, MINUTE, name)
        replicas(registry, "a", tracer_provider=provider)
        clock.advance(65)
        [job_id] = queue.job_ids
        headers = queue.fetch_job(job_id).meta[META_KEY]["headers"]
        assert headers["traceparent"].split("-")[1] == seen[0]


class TestBrokerDown:
    def test_a_refused_send_is_left_unsent_then_the_sweep_sends_it_with_its_id(
        self, name, db_url, replicas, clock, redis_url
    ):
        proxy = Proxy(("127.0.0.1", 6379))
        connection = redis.Redis(port=proxy.port, socket_timeout=2, socket_connect_timeout=2)
        queue = rq.Queue(f"cronjob-test-{uuid.uuid4().hex[:12]}", connection=connection)
        try:
            proxy.cut()
            registry = cronjob.Registry()
            handoff = enqueue(queue, "tests.rq_tasks.traced", args=("x",), retry_within=3)
            registry.register(handoff, MINUTE, name)
            replicas(registry, "a")
            clock.advance(65)  # 09:01: refused, retried for 3 s, left to the sweep
            [row] = outbox(db_url)
            assert row["sent_ms"] is None and row["tries"] >= 1
            # Refused, or given up on past the 3 s (the client's own retries take longer).
            assert "ConnectionError" in str(row["error"]) or "TimeoutError" in str(row["error"])
            proxy.restore()
            # The sweeps (once the client answered a send given up on, which holds its
            # row meanwhile: in real seconds).
            # On a slow machine the clock may pass 09:02 meanwhile: its row is its own.
            first = cronjob.occurrence_id(name, at(1))

            def sent() -> object:
                return next(r["sent_ms"] for r in outbox(db_url) if r["id"] == first)

            deadline = time.monotonic() + 60
            while sent() is None and time.monotonic() < deadline:
                clock.advance(15)
                time.sleep(0.2)
            assert sent() is not None
            assert queue.job_ids[0] == first and queue.job_ids.count(first) == 1
        finally:
            queue.empty()
            proxy.close()

    def test_a_row_another_replica_left_unsent_is_sent_by_this_one_s_sweep(
        self, name, db_url, replicas, clock, queue
    ):
        """As a replica killed between its record and its send leaves it."""
        instant = at(0) - timedelta(minutes=5)
        oid = record(db_url, name, instant, next_try=instant + timedelta(minutes=1))
        registry = cronjob.Registry()
        registry.register(enqueue(queue, "tests.rq_tasks.traced", args=("x",)), "0 0 0 1 1 *", name)
        replicas(registry, "b")
        clock.advance(20)
        assert queue.job_ids == [oid]
        [row] = outbox(db_url)
        assert row["sent_ms"] is not None


class TestOutboxRows:
    def test_only_one_of_two_retriers_claims_a_row(self, migrated_engine):
        with migrated_engine.begin() as conn:
            row, new = lease.record_publication(
                conn,
                id="id-1",
                name="job",
                instant=START,
                target="rq",
                payload={"headers": {"traceparent": "x"}},
                now_ms=1000,
                hold_ms=500,
            )
        assert new and row.next_try_ms == 1500
        with migrated_engine.begin() as conn:
            again, new = lease.record_publication(
                conn,
                id="id-1",
                name="job",
                instant=START,
                target="rq",
                payload={},
                now_ms=9000,
                hold_ms=500,
            )
        assert not new and again.created_ms == 1000 and again.payload["headers"]
        with migrated_engine.begin() as conn:
            [due] = lease.due_publications(conn, now_ms=1500, limit=10)
            assert lease.due_publications(conn, now_ms=1499, limit=10) == []
        with migrated_engine.begin() as conn:
            first = lease.claim_publication(
                conn, "id-1", seen_next_try_ms=due.next_try_ms, next_try_ms=5000
            )
        with migrated_engine.begin() as conn:
            second = lease.claim_publication(
                conn, "id-1", seen_next_try_ms=due.next_try_ms, next_try_ms=5000
            )
        assert (first, second) == (True, False)
        with migrated_engine.begin() as conn:
            assert lease.outbox_summary(conn) == lease.OutboxSummary(unsent=1, oldest_ms=1000)
            assert lease.mark_published(conn, "id-1", now_ms=2000)
            assert not lease.mark_published(conn, "id-1", now_ms=2001)
            assert lease.outbox_summary(conn) == lease.OutboxSummary(unsent=0, oldest_ms=None)
        assert lease.prune_outbox(migrated_engine, before_ms=2000) == 0
        assert lease.prune_outbox(migrated_engine, before_ms=2001) == 1


def test_payload_is_json(migrated_engine):
    with migrated_engine.begin() as conn:
        lease.record_publication(
            conn,
            id="i",
            name="n",
            instant=START,
            target="rq",
            payload={"a": [1]},
            now_ms=0,
            hold_ms=0,
        )
    with migrated_engine.connect() as conn:
        text = conn.execute(sa.text("SELECT payload FROM cronjob_outbox")).scalar()
    assert json.loads(text) == {"a": [1]}


class TestStatus:
    def test_status_counts_the_unsent_and_exits_1_once_the_oldest_is_past_the_option(
        self, migrated_engine, db_url, capsys
    ):
        from cronjob import admin
        from cronjob.admin._cli import main

        recorded = START - timedelta(minutes=10)
        with migrated_engine.begin() as conn:
            lease.record_publication(
                conn,
                id="i",
                name="n",
                instant=recorded,
                target="rq",
                payload={},
                now_ms=round(recorded.timestamp() * 1000),
                hold_ms=0,
            )
        report = admin.status(db_url, now=START)
        assert report.outbox == admin.OutboxStatus(unsent=1, oldest=recorded)
        assert not report.outbox.overdue(START, after=601)
        assert report.outbox.overdue(START, after=599)
        assert main(["status", "--database-url", db_url, "--unsent-after", "1e9"]) == 0
        assert main(["status", "--database-url", db_url, "--json", "--unsent-after", "60"]) == 1
        out, err = capsys.readouterr()
        assert '"unsent": 1' in out
        assert "outbox: 1 occurrence(s) unsent" in err


def test_done_once_rows_are_pruned_and_running_ones_stay(migrated_engine):
    for id_ in ("done", "running"):
        token, _ = lease.begin_once(
            migrated_engine, id_, task="t", holder="w", now_ms=1000, stale_ms=10
        )
        if id_ == "done":
            with migrated_engine.begin() as conn:
                assert lease.finish_once(conn, id_, token, now_ms=1500)
    assert lease.prune_outbox(migrated_engine, before_ms=1500) == 0
    assert lease.prune_outbox(migrated_engine, before_ms=10**12) == 1
    again, state = lease.begin_once(
        migrated_engine, "running", task="t", holder="w2", now_ms=1005, stale_ms=10
    )
    assert (again, state) == (None, lease.ONCE_RUNNING)
    taken, _ = lease.begin_once(
        migrated_engine, "running", task="t", holder="w2", now_ms=1010, stale_ms=10
    )
    assert taken is not None


class _Recorder:
    """A publisher of this test's own: what it was asked to send."""

    target = "test"

    def __init__(self) -> None:
        self.sent: list[str] = []

    def describe(self) -> dict[str, object]:
        return {}

    def publish(self, occurrence: Occurrence) -> None:
        self.sent.append(occurrence.id)


def test_the_outbox_sweep_is_not_due_before_the_database_is_ready(migrated_engine, clock):
    """Until start-up's catch-up is sent, no outbox sweep is due: a due one that cannot
    run would wake the dispatcher without end while the database is down."""
    from cronjob.engine._control import Control, Inbox
    from cronjob.engine._republish import Republisher
    from cronjob.engine._state import JobState

    registry = cronjob.Registry()
    registry.register(handoff(_Recorder()), "0 * * * * *", "hand-off")
    [job] = registry._freeze(by="test")
    control = Control(clock, Inbox(clock))
    try:
        republisher = Republisher(
            clock=clock,
            store=lease.LeaseStore(migrated_engine, clock=clock.lease_clock()),
            control=control,
            states={"hand-off": JobState(job)},
        )
        assert republisher.next_wake(draining=False) is None
        republisher.begin()
        assert republisher.next_wake(draining=False) == clock.monotonic()
        republisher.close()
    finally:
        control.shutdown(wait=5)


def _recorded(engine: sa.Engine, ids: list[str]) -> None:
    with engine.begin() as conn:
        for i, id_ in enumerate(ids):
            lease.record_publication(
                conn,
                id=id_,
                name=f"n-{i}",
                instant=datetime(2026, 3, 2, 9, tzinfo=UTC),
                target="test",
                payload={},
                now_ms=1000,
                hold_ms=500,
            )


def test_mark_published_many_gives_each_row_its_own_time_and_leaves_sent_ones(
    migrated_engine,
):
    ids = [f"id-{i}" for i in range(4)]
    _recorded(migrated_engine, ids)
    with migrated_engine.begin() as conn:
        assert lease.mark_published(conn, "id-0", now_ms=1500)
        assert lease.mark_published_many(conn, {"id-0": 2000, "id-1": 2001, "id-2": 2002}) == 2
        assert lease.mark_published_many(conn, {"id-3": 2003, "nobody": 2004}) == 1
        sent = dict(conn.execute(sa.text("SELECT id, sent_ms FROM cronjob_outbox")).all())
    assert sent == {"id-0": 1500, "id-1": 2001, "id-2": 2002, "id-3": 2003}


def test_the_marks_of_rounds_that_wait_are_written_together(migrated_engine):
    """While one mark is written, the marks that come meanwhile wait and are written
    by one of them in one transaction, each with its own time; each caller returns once
    its own is written."""
    from cronjob.contrib import _marks, _outbox

    ids = [f"id-{i}" for i in range(8)]
    _recorded(migrated_engine, ids)
    updates: list[int] = []
    release = threading.Event()

    @sa.event.listens_for(migrated_engine, "before_cursor_execute")
    def hold_the_first(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE CRONJOB_OUTBOX"):
            updates.append(1)
            if len(updates) == 1:
                assert release.wait(10)

    threads = [
        threading.Thread(target=_outbox.mark, args=(migrated_engine, id_, 5000 + i))
        for i, id_ in enumerate(ids)
    ]
    threads[0].start()
    _until(lambda: len(updates) == 1)
    for thread in threads[1:]:
        thread.start()
    _until(lambda: len(_marks._by_engine[migrated_engine]._pending) == len(ids) - 1)
    release.set()
    for thread in threads:
        thread.join(10)
    assert len(updates) == 2  # the first alone, then the seven that waited
    with migrated_engine.connect() as conn:
        sent = dict(conn.execute(sa.text("SELECT id, sent_ms FROM cronjob_outbox")).all())
    assert sent == {id_: 5000 + i for i, id_ in enumerate(ids)}


def test_a_batch_that_fails_raises_in_each_of_its_rounds(migrated_engine):
    from cronjob.contrib import _outbox

    @sa.event.listens_for(migrated_engine, "before_cursor_execute")
    def refuse(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE CRONJOB_OUTBOX"):
            raise RuntimeError("the database is gone")

    _recorded(migrated_engine, ["id-0"])
    with pytest.raises(RuntimeError, match="the database is gone"):
        _outbox.mark(migrated_engine, "id-0", 5000)
    sa.event.remove(migrated_engine, "before_cursor_execute", refuse)
    _outbox.mark(migrated_engine, "id-0", 6000)  # the next batch is written
    with migrated_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT sent_ms FROM cronjob_outbox")).scalar() == 6000


def _until(condition) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.01)
