"""The outbox sweep's recovery rules (issue 47): a row that cannot be sent is kept and
never holds the others back; a broker that refused is probed, and its rows go out within
seconds of its return; a row held by a replica that died is sent once its hold ends, not
on the next 15 s cadence; and each case is measured. On every database, on a fake clock,
with real Redis (behind a proxy the test cuts) where the behaviour is about the broker."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

import cronjob
import lease
from cronjob.contrib import Occurrence, handoff
from cronjob.contrib._outbox import count_accepted
from cronjob.engine import _republish
from cronjob.testing import FakeClock
from tests._proxy import Proxy
from tests.test_outbox import _Recorder as Recorder

rq = pytest.importorskip("rq")
redis = pytest.importorskip("redis")
from cronjob.contrib.rq import enqueue  # noqa: E402

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
YEARLY = "0 0 0 1 1 *"  # no round runs in these tests but where said: the sweep sends
#: The hold of the replica that died in these tests (``HOLD_SECONDS`` of issue 47).
HOLD = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START, settle_timeout=10)


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def meters(reader: InMemoryMetricReader) -> MeterProvider:
    return MeterProvider(metric_readers=[reader])


def unique(stem: str) -> str:
    """A job name of the test's own (RQ keys a job by its id alone, whatever its queue)."""
    return f"{stem}-{uuid.uuid4().hex[:12]}"


def ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def record(url: str, name: str, instant: datetime, *, now: datetime, hold: float, **kw) -> str:
    """Put an unsent row of ``name`` for ``instant`` on record at ``now``, held ``hold``
    seconds, as a round leaves it; its id (``id=`` another one: a row under a wrong id)."""
    oid = kw.pop("id", None) or cronjob.occurrence_id(name, instant)
    engine = lease.create_engine(url)
    try:
        lease.migrate(engine)
        with engine.begin() as conn:
            lease.record_publication(
                conn,
                id=oid,
                name=name,
                instant=instant,
                target=kw.pop("target", "test"),
                payload=kw.pop("payload", {"headers": {}}),
                now_ms=ms(now),
                hold_ms=round(hold * 1000),
            )
    finally:
        engine.dispose()
    return oid


def spoil(url: str, id_: str, **values: object) -> None:
    """Write ``values`` into the row ``id_`` by hand, as a bad edit or a bug would."""
    engine = lease.create_engine(url)
    try:
        table = lease.metadata.tables["cronjob_outbox"]
        with engine.begin() as conn:
            conn.execute(table.update().where(table.c.id == id_).values(**values))
    finally:
        engine.dispose()


def rows(url: str) -> dict[str, sa.RowMapping]:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.select(lease.metadata.tables["cronjob_outbox"])).mappings()
            return {row["id"]: row for row in found}
    finally:
        engine.dispose()


def measured(reader: InMemoryMetricReader, name: str, **attributes: str) -> float:
    """The sum of metric ``name`` (values, or histogram sums) over the points whose
    attributes include ``attributes`` (``cronjob_job`` stands for ``cronjob.job``)."""
    wanted = {key.replace("_", "."): value for key, value in attributes.items()}
    data = reader.get_metrics_data()
    total = 0.0
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    found = {k: str(v) for k, v in (point.attributes or {}).items()}
                    if wanted.items() <= found.items():
                        value = point.sum if isinstance(point, HistogramDataPoint) else point.value
                        total += value
    return total


class TestRowsThatCannotBeSent:
    def test_the_good_rows_are_sent_in_the_same_sweep_and_the_bad_ones_kept_and_named(
        self, db_url, replicas, clock, meters, reader, caplog
    ):
        name, recorder = unique("export"), Recorder()
        old = START - timedelta(minutes=10)

        def at(minute: int) -> datetime:
            return old + timedelta(minutes=minute)

        good = [record(db_url, name, at(m), now=at(m), hold=0) for m in (0, 5)]
        not_json = record(db_url, name, at(1), now=at(1), hold=0)
        spoil(db_url, not_json, payload="{not json")
        no_instant = record(db_url, name, at(2), now=at(2), hold=0)
        spoil(db_url, no_instant, instant_ms=10**15)  # past year 9999
        mistyped = record(db_url, name, at(3), now=at(3), hold=0, payload={"headers": "x"})
        # Its id is another instant's: sent as it is, it would be a duplicate of that one.
        wrong_id = record(
            db_url, name, at(4), now=at(4), hold=0, id=cronjob.occurrence_id(name, at(9))
        )
        bad = [not_json, no_instant, mistyped, wrong_id]
        registry = cronjob.Registry()
        registry.register(handoff(recorder), YEARLY, name)
        caplog.set_level(logging.ERROR, logger="cronjob")
        replicas(registry, "a", meter_provider=meters)
        clock.advance(0.5)  # the first sweep only
        assert sorted(recorder.sent) == sorted(good)
        found = rows(db_url)
        assert all(found[id_]["sent_ms"] is not None for id_ in good)
        for id_ in bad:  # kept, unsent, not resolved, put off, the reason on record
            assert found[id_]["sent_ms"] is None and found[id_]["obsolete_ms"] is None
            assert str(found[id_]["error"]).startswith("invalid: ")
            assert found[id_]["next_try_ms"] > ms(START)
            [logged] = [r for r in caplog.records if id_ in r.getMessage()]
            assert logged.levelno == logging.ERROR
        assert "not JSON" in str(found[not_json]["error"])
        assert "instant" in str(found[no_instant]["error"])
        assert "headers" in str(found[mistyped]["error"])
        assert "not the occurrence id" in str(found[wrong_id]["error"])
        assert measured(reader, "cronjob.outbox.invalid", cronjob_job=name) == 4
        assert measured(reader, "cronjob.outbox.republished", cronjob_job=name) == 2

        clock.advance(15)  # the next sweeps read the bad rows only, the oldest 9 min old
        assert measured(reader, "cronjob.outbox.unsent") == 4
        # As the latest sweep read it (they come at most a hold, 10 s, apart).
        assert 9 * 60 + 5 <= measured(reader, "cronjob.outbox.oldest_unsent_age") <= 9 * 60 + 15

        clock.advance(105)  # many sweeps: never sent, and logged on a back-off
        assert sorted(recorder.sent) == sorted(good)
        found = rows(db_url)
        assert all(found[id_]["sent_ms"] is None for id_ in bad)
        # Put off 5 s, then 10, 20, 40 s: not read again by every sweep of those 2 min.
        logged = [r for r in caplog.records if not_json in r.getMessage()]
        assert 2 <= len(logged) <= 6

    def test_a_second_run_does_not_send_a_row_under_an_id_that_is_not_its_own(
        self, migrated_engine, db_url, clock
    ):
        from cronjob.testing import make_round

        name, recorder = unique("export"), Recorder()
        oid = cronjob.occurrence_id(name, START)
        record(db_url, name, START, now=START, hold=0, payload={"headers": {}, "app": "other"})
        fn = handoff(recorder)
        with pytest.raises(ValueError, match="not the occurrence id"):
            fn(make_round(name, START, engine=migrated_engine, clock=clock, attempt=2))
        assert recorder.sent == []
        assert rows(db_url)[oid]["sent_ms"] is None


class TestABrokerThatComesBack:
    """Redis behind a proxy the test cuts: the broker's network goes, Redis stays."""

    @pytest.fixture
    def proxied(self, redis_url: str) -> Iterator[tuple[Proxy, rq.Queue, rq.Queue]]:
        """The proxy, the queue the replica sends to through it, and the same queue read
        straight from Redis."""
        proxy = Proxy(("127.0.0.1", 6379))
        connection = redis.Redis(port=proxy.port, socket_timeout=2, socket_connect_timeout=2)
        direct = redis.Redis.from_url(redis_url, socket_timeout=5)
        queue = rq.Queue(unique("cronjob-test"), connection=connection)
        try:
            yield proxy, queue, rq.Queue(queue.name, connection=direct)
        finally:
            rq.Queue(queue.name, connection=direct).empty()
            proxy.close()
            connection.close()
            direct.close()

    def test_its_rows_are_sent_by_the_first_sweep_after_a_probe_succeeds(
        self, db_url, replicas, clock, meters, reader, proxied
    ):
        proxy, queue, seen = proxied
        name = unique("export")
        old = START - timedelta(minutes=10)
        ids = [
            record(db_url, name, old + timedelta(minutes=m), now=old, hold=0, target="rq")
            for m in range(4)
        ]
        registry = cronjob.Registry()
        registry.register(enqueue(queue, "tests.rq_tasks.traced"), YEARLY, name)
        proxy.cut()
        replicas(registry, "a", meter_provider=meters)
        clock.advance(0.5)  # the first sweep: its probe is refused, the rest put off
        found = rows(db_url)
        assert sum(found[id_]["tries"] for id_ in ids) == 1  # one send, not one per row
        first = ms(START) + round(_republish.DEFER_FIRST * 1000)
        assert {found[id_]["next_try_ms"] for id_ in ids} == {first}
        clock.advance_to(START + timedelta(seconds=_republish.DEFER_FIRST + 0.5))
        found = rows(db_url)  # the second probe, refused: put off twice as long
        assert sum(found[id_]["tries"] for id_ in ids) == 2
        second = first + round(2 * _republish.DEFER_FIRST * 1000)
        assert {found[id_]["next_try_ms"] for id_ in ids} == {second}
        assert seen.job_ids == []
        proxy.restore()  # the broker is back
        back = clock.now()
        clock.advance_to(START + timedelta(seconds=3 * _republish.DEFER_FIRST + 0.5))
        found = rows(db_url)
        assert sorted(seen.job_ids) == sorted(ids)  # all of them, in the probe's sweep
        sent = {found[id_]["sent_ms"] for id_ in ids}
        assert None not in sent and max(sent) - min(sent) < 1000
        assert max(sent) - ms(back) <= 10_000  # seconds after the broker's return
        assert measured(reader, "cronjob.outbox.refused", cronjob_job=name) == 2
        assert measured(reader, "cronjob.outbox.republished", cronjob_job=name) == 4
        expected = sum((max(sent) - ms(old + timedelta(minutes=m))) / 1000 for m in range(4))
        assert measured(reader, "cronjob.outbox.latency", cronjob_job=name) == pytest.approx(
            expected, abs=0.01
        )

    def test_a_refused_probe_puts_off_by_a_back_off_that_doubles_to_4_s(self):
        """Never more than 4 s: a broker that is back gets its rows within 10 s, even
        when a probe in flight at its return first waits out its 5 s send timeout."""
        pauses = [_republish.defer_pause(n) for n in range(1, 8)]
        assert pauses == [2, 4, 4, 4, 4, 4, 4]


class TestARowHeldByAReplicaThatDied:
    def test_another_replica_sends_it_once_its_hold_ends_not_on_the_15_s_cadence(
        self, db_url, replicas, clock, meters, reader, redis_url
    ):
        """The dead replica recorded the row (held ``HOLD`` seconds) just after the other
        replica's sweep read the outbox, and sent nothing."""
        name = unique("export")
        connection = redis.Redis.from_url(redis_url, socket_timeout=5)
        queue = rq.Queue(unique("cronjob-test"), connection=connection)
        try:
            registry = cronjob.Registry()
            registry.register(enqueue(queue, "tests.rq_tasks.traced", hold=HOLD), YEARLY, name)
            replicas(registry, "b", meter_provider=meters)
            clock.advance(1)  # b's first sweep is behind it
            killed = clock.now()
            oid = record(db_url, name, killed, now=killed, hold=HOLD, target="rq")
            clock.advance(HOLD - 0.5)
            assert queue.job_ids == []  # held: nobody sends it before its hold ends
            clock.advance(2.5)
            assert queue.job_ids == [oid]
            sent = rows(db_url)[oid]["sent_ms"]
            assert ms(killed) + HOLD * 1000 <= sent <= ms(killed) + (HOLD + 2) * 1000
            assert measured(reader, "cronjob.outbox.republished", cronjob_job=name) == 1
            assert measured(reader, "cronjob.outbox.latency", cronjob_job=name) == (
                pytest.approx((sent - ms(killed)) / 1000)
            )
        finally:
            queue.empty()
            connection.close()


class TestMeasured:
    def test_a_row_nobody_registers_any_more_is_counted_obsolete(
        self, db_url, replicas, clock, meters, reader
    ):
        gone, old = unique("gone"), START - timedelta(minutes=5)
        record(db_url, gone, old, now=old, hold=0)
        registry = cronjob.Registry()
        registry.register(handoff(Recorder()), YEARLY, unique("export"))
        replicas(registry, "a", meter_provider=meters)
        clock.advance(1)
        assert measured(reader, "cronjob.outbox.obsolete", cronjob_job=gone) == 1
        assert measured(reader, "cronjob.outbox.unsent") == 0

    def test_a_round_s_publication_is_counted_published_then_republished_on_a_second_run(
        self, db_url, replicas, clock, meters, reader
    ):
        """What a hand-off's round measures through `count_accepted`, from its Round."""

        def job(ctx: cronjob.Round) -> None:
            occurrence = Occurrence(
                id=ctx.occurrence_id,
                name=ctx.name,
                instant=ctx.instant,
                headers={},
                again=ctx.attempt > 1,
            )
            count_accepted(ctx, occurrence, "test", clock.now() + timedelta(seconds=0.25))

        registry = cronjob.Registry()
        registry.register(job, "0 * * * * *", "export")
        replicas(registry, "a", meter_provider=meters)
        clock.advance(61)
        assert measured(reader, "cronjob.outbox.published", cronjob_job="export") == 1
        assert measured(reader, "cronjob.outbox.republished", cronjob_job="export") == 0
        assert measured(
            reader, "cronjob.outbox.latency", cronjob_job="export", cronjob_target="test"
        ) == pytest.approx(0.25)
