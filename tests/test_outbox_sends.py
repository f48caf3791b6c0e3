"""The outbox's sends: a second run of an instant sends nothing an attempt holds, rows
nobody here can send never hold the others back, and a broker that does not answer
holds neither the ``cronjob-outbox`` thread nor, while it may still answer, its row
(nobody else sends it meanwhile); on every database, with real Redis behind a proxy."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.contrib import Occurrence, handoff
from cronjob.engine import _republish
from cronjob.testing import FakeClock, make_round
from tests._proxy import Proxy
from tests.test_outbox import _Recorder as Recorder
from tests.test_outbox import record

rq = pytest.importorskip("rq")
redis = pytest.importorskip("redis")
from cronjob.contrib.rq import enqueue  # noqa: E402

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
YEARLY = "0 0 0 1 1 *"  # no round runs in these tests: only the sweep sends


@pytest.fixture
def clock() -> FakeClock:
    # A sweep stuck in a send never settles: fail in 10 s, not the default 30 s.
    return FakeClock(START, settle_timeout=10)


def unique(stem: str) -> str:
    """A job name of the test's own (RQ keys a job by its id alone, whatever its queue)."""
    return f"{stem}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def queue(redis_url: str) -> Iterator[rq.Queue]:
    connection = redis.Redis.from_url(redis_url, socket_timeout=5)
    queue = rq.Queue(unique("cronjob-test"), connection=connection)
    yield queue
    queue.empty()
    connection.close()


def ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def rows(url: str) -> dict[str, sa.RowMapping]:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.select(lease.metadata.tables["cronjob_outbox"])).mappings()
            return {row["id"]: row for row in found}
    finally:
        engine.dispose()


class Gate(Recorder):
    """Its first send waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.open = threading.Event()

    def publish(self, occurrence: Occurrence) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.open.wait(30)
        super().publish(occurrence)


class Refusing(Recorder):
    """A broker that refuses every send."""

    def publish(self, occurrence: Occurrence) -> None:
        self.sent.append(occurrence.id)
        raise ConnectionError("refused")


class TestSecondRun:
    def test_a_second_run_sends_nothing_while_the_first_one_s_send_is_in_progress(
        self, migrated_engine
    ):
        """The re-run of a round cut short in its send finds the row held: not sent again."""
        clock, name, gate = FakeClock(START), unique("export"), Gate()
        fn = handoff(gate, hold=60, send_timeout=30)
        first = threading.Thread(
            target=fn, args=(make_round(name, START, engine=migrated_engine, clock=clock),)
        )
        first.start()
        try:
            assert gate.entered.wait(10)
            clock.advance(1)
            fn(make_round(name, START, engine=migrated_engine, clock=clock, attempt=2))
        finally:
            gate.open.set()
            first.join(30)
        oid = cronjob.occurrence_id(name, START)
        assert gate.sent == [oid]
        with migrated_engine.connect() as conn:
            assert lease.due_publications(conn, now_ms=ms(START) + 10**9, limit=5) == []

    def test_a_second_run_sends_a_row_nobody_holds_once(self, migrated_engine, db_url):
        name, recorder = unique("export"), Recorder()
        oid = record(db_url, name, START, next_try=START)  # a first run cut short, due
        clock = FakeClock(START + timedelta(seconds=5))
        fn = handoff(recorder)
        fn(make_round(name, START, engine=migrated_engine, clock=clock, attempt=2))
        fn(make_round(name, START, engine=migrated_engine, clock=clock, attempt=3))
        assert recorder.sent == [oid]
        assert rows(db_url)[oid]["sent_ms"] == ms(clock.now())


class TestSendGivenUpOn:
    def test_a_round_does_not_send_again_what_the_broker_accepted_late(
        self, migrated_engine, db_url
    ):
        """The round gives up on its send (past ``send_timeout``) and waits to retry; the
        broker accepts the first send meanwhile: the retry sends nothing."""
        clock, name, gate = FakeClock(START), unique("export"), Gate()
        fn = handoff(gate, hold=60, send_timeout=0.2)
        oid = cronjob.occurrence_id(name, START)
        ctx = make_round(name, START, engine=migrated_engine, clock=clock)
        round_ = threading.Thread(target=fn, args=(ctx,))
        round_.start()
        try:
            until(lambda: str(rows(db_url).get(oid, {}).get("error")).startswith("TimeoutError"))
            gate.open.set()  # the answer comes, late: the row is marked sent
            until(lambda: rows(db_url)[oid]["sent_ms"] is not None)
            clock.advance(2)  # the round's pause ends
        finally:
            gate.open.set()
            round_.join(30)
        assert not round_.is_alive()
        assert gate.sent == [oid]


def until(condition: Callable[[], bool]) -> None:
    """Wait, in real time, for what another thread does in real time (10 s at most)."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.02)


class TestNoStarvation:
    """The sweep reads at most `REPUBLISH_LIMIT` rows (2 here), the longest due first."""

    @pytest.fixture(autouse=True)
    def _limit(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(_republish, "REPUBLISH_LIMIT", 2)

    def test_rows_of_a_job_no_replica_here_registers_do_not_hold_back_the_others(
        self, db_url, replicas, clock
    ):
        gone, name, recorder = unique("gone"), unique("export"), Recorder()
        for minute in (1, 2, 3):
            instant = START - timedelta(hours=1, minutes=minute)
            record(db_url, gone, instant, next_try=instant)
        instant = START - timedelta(minutes=5)
        oid = record(db_url, name, instant, next_try=instant)
        registry = cronjob.Registry()
        registry.register(handoff(recorder), YEARLY, name)
        replicas(registry, "a")
        clock.advance(20)  # two sweeps
        assert recorder.sent == [oid]
        assert sum(row["sent_ms"] is None for row in rows(db_url).values()) == 3

    def test_rows_of_a_broker_that_refuses_do_not_hold_back_another_broker_s(
        self, db_url, replicas, clock
    ):
        down, up = unique("down"), unique("up")
        refusing, recorder = Refusing(), Recorder()
        downs = []
        for minute in (3, 2, 1):
            instant = START - timedelta(hours=1, minutes=minute)
            downs.append(record(db_url, down, instant, next_try=instant))
        instant = START - timedelta(minutes=5)
        oid = record(db_url, up, instant, next_try=instant)
        registry = cronjob.Registry()
        registry.register(handoff(refusing), YEARLY, down)
        registry.register(handoff(recorder), YEARLY, up)
        replicas(registry, "a")
        # Two sweeps (a full read is followed by the next a second later): each tries one
        # row of the refusing broker, its probe (before the first put-off, 2 s, ends).
        clock.advance(1.5)
        assert recorder.sent == [oid]
        # Each probe published twice: once more at once (a stale connection), then refused.
        assert refusing.sent == [downs[0], downs[0], downs[2], downs[2]]
        found = rows(db_url)
        # The row put off untried counts no try; it is tried after DEFER_FIRST.
        assert [found[id_]["tries"] for id_ in downs] == [1, 0, 1]
        deferred = ms(START) + round(_republish.DEFER_FIRST * 1000)
        assert found[downs[1]]["next_try_ms"] >= deferred


class TestBrokerThatDoesNotAnswer:
    """Redis behind a proxy that holds every byte back (`Proxy.stall`); the client has
    no timeout of its own, so only the send's bound ends its wait."""

    def test_it_holds_the_outbox_thread_for_the_send_timeout_and_the_sweeps_go_on(
        self, db_url, replicas, clock, queue
    ):
        proxy = Proxy(("127.0.0.1", 6379))
        stuck_redis = redis.Redis(port=proxy.port)  # no socket timeout: waits forever
        try:
            stuck_redis.ping()
            proxy.stall()
            hung, fine = unique("hung"), unique("fine")
            stuck_queue = rq.Queue(queue.name, connection=stuck_redis)
            registry = cronjob.Registry()
            registry.register(
                enqueue(stuck_queue, "tests.rq_tasks.traced", send_timeout=0.5), YEARLY, hung
            )
            registry.register(enqueue(queue, "tests.rq_tasks.traced"), YEARLY, fine)
            old = START - timedelta(minutes=10)
            stuck = record(db_url, hung, old, next_try=old)
            first = record(db_url, fine, old, next_try=old + timedelta(minutes=1))
            replicas(registry, "a")
            clock.advance(1)  # the first sweep: the hung send is given up on, then the next
            assert queue.job_ids == [first]
            found = rows(db_url)
            assert found[stuck]["sent_ms"] is None
            assert str(found[stuck]["error"]).startswith("TimeoutError: rq gave no answer")
            later = START + timedelta(seconds=2)
            second = record(db_url, fine, later, next_try=later)
            clock.advance(15)  # the next sweep runs: nothing waits on the broker
            assert queue.job_ids == [first, second]
        finally:
            proxy.close()
            stuck_redis.close()

    def test_a_send_answered_after_the_hold_is_delivered_once(self, db_url, replicas, clock, queue):
        """Replica a's send waits on the broker far past the hold: b's sweeps do not send
        the row meanwhile, and the late answer marks it sent."""
        proxy = Proxy(("127.0.0.1", 6379))
        slow_redis = redis.Redis(port=proxy.port)
        try:
            slow_redis.ping()
            proxy.stall()
            name = unique("export")
            slow = rq.Queue(queue.name, connection=slow_redis)
            old = START - timedelta(minutes=10)
            oid = record(db_url, name, old, next_try=old)
            # a sweeps at 0, 15, 30…; b at 8, 23, 38, 53…: the first to find the row due
            # once a's hold of 52 s has run out would be b, at 53, if a did not keep it.
            for replica, on in (("a", slow), ("b", queue)):
                registry = cronjob.Registry()
                registry.register(
                    enqueue(on, "tests.rq_tasks.traced", hold=52, send_timeout=0.5), YEARLY, name
                )
                replicas(registry, replica)
                clock.advance(8)  # a's first sweep takes the row, and gives up on the send
            clock.advance(150)  # far past the hold: b sweeps ten times
            assert queue.job_ids == []
            assert rows(db_url)[oid]["sent_ms"] is None
            proxy.restore()  # the answer comes
            until(lambda: rows(db_url)[oid]["sent_ms"] is not None)  # a's sender marks it
            clock.advance(150)
            assert queue.job_ids == [oid]  # one delivery: a push per send
        finally:
            proxy.close()
            slow_redis.close()
