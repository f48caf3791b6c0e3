"""A manual round (``cronjob trigger``) published to a Redis Stream: its entry says
``trigger=manual``, so the stream worker runs it although its instant (the request's
moment) is no firing; the identity check still applies, an entry without the field is a
scheduled one, an unknown trigger is dead-lettered. The job is named by the record of a
replica on a fake clock (seen in March, whatever the worker's clock says)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import admin
from cronjob.testing import FakeClock

redis = pytest.importorskip("redis")
from cronjob.contrib import streams  # noqa: E402
from cronjob.contrib.streams import Disposition, Handlers, Worker  # noqa: E402
from tests._streams import fields, new_stream  # noqa: E402

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


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


def wait_for(check, what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ran_by_a_worker(client, stream: str, engine, name: str) -> list[str]:
    """The occurrence ids a worker whose own registry is empty runs in one step: the
    replica's record (seen on its fake clock, months ago for the worker's real one) names
    the job."""
    ran: list[str] = []
    handlers = Handlers()
    handlers.register(lambda occ: ran.append(occ.occurrence_id), name)
    worker = Worker(
        client,
        stream=stream,
        group="workers",
        database=engine,
        registry=cronjob.Registry(),
        handlers=handlers,
    )
    worker.ensure_group()
    assert worker.step() == 1
    return ran


def test_a_manual_round_reaches_the_stream_marked_and_is_run(
    db_url, engine, replicas, clock, client, stream, redis_url
):
    name = f"report-{uuid.uuid4().hex[:8]}"
    registry = cronjob.Registry()
    registry.register(streams.publish(redis_url, stream=stream), "0 0 * * * *", name)
    replicas(registry, "a")
    clock.advance(5)
    asked = clock.now()
    admin.trigger(db_url, name, by="ops", now=asked)
    clock.advance(15)
    wait_for(lambda: client.xlen(stream) == 1, "the manual round's entry")
    [(_, entry)] = client.xrange(stream)
    assert entry["trigger"] == "manual"
    assert entry["scheduled_at"] == asked.strftime("%Y-%m-%dT%H:%M:%SZ")

    assert ran_by_a_worker(client, stream, engine, name) == [entry["occurrence_id"]]
    assert client.xlen(stream + ":dead") == 0


def test_a_manual_round_asked_within_a_second_keeps_its_fraction_and_is_run(
    db_url, engine, replicas, clock, client, stream, redis_url
):
    """A real ``cronjob trigger`` is asked at a moment with milliseconds: its entry is
    published with them (RFC 3339, ``Z``), its id checks out, and the worker runs it."""
    name = f"report-{uuid.uuid4().hex[:8]}"
    registry = cronjob.Registry()
    registry.register(streams.publish(redis_url, stream=stream), "0 0 * * * *", name)
    replicas(registry, "a")
    clock.advance(5.518)
    asked = clock.now()
    admin.trigger(db_url, name, by="ops", now=asked)
    clock.advance(15)
    wait_for(lambda: client.xlen(stream) == 1, "the manual round's entry")
    [(_, entry)] = client.xrange(stream)
    assert entry["scheduled_at"] == "2026-03-02T09:00:05.518000Z"
    assert entry["occurrence_id"] == cronjob.occurrence_id(name, asked)
    assert ran_by_a_worker(client, stream, engine, name) == [entry["occurrence_id"]]
    assert client.xlen(stream + ":dead") == 0


class TestEntries:
    """Forged and earlier entries of a job a fake-clock replica registers."""

    @pytest.fixture
    def worker(self, engine, replicas, client, stream):
        self.name = f"report-{uuid.uuid4().hex[:8]}"
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", self.name)
        replicas(registry, "a")
        wait_for(lambda: lease.definition(engine, self.name) is not None, "the record")
        self.ran: list[str] = []
        handlers = Handlers()
        handlers.register(lambda occ: self.ran.append(occ.occurrence_id), self.name)
        return Worker(
            client,
            stream=stream,
            group="workers",
            database=engine,
            registry=cronjob.Registry(),
            handlers=handlers,
        )

    def test_a_scheduled_entry_of_a_fake_clock_replicas_job_runs(self, worker):
        at = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
        assert worker.handle("1-1", fields(self.name, at)) is Disposition.DONE

    def test_without_the_field_the_firing_check_applies(self, worker):
        at = datetime(2026, 3, 2, 10, 7, 3, tzinfo=UTC)
        assert worker.handle("1-1", fields(self.name, at)) is Disposition.INVALID
        assert worker.handle("1-2", fields(self.name, at, trigger="manual")) is Disposition.DONE
        later = at + timedelta(seconds=1)  # another id: the one above was admitted
        assert worker.handle("1-3", fields(self.name, later, trigger="backfill")) is (
            Disposition.INVALID
        )

    def test_a_manual_entry_still_needs_its_id(self, worker):
        at = datetime(2026, 3, 2, 10, 7, 3, tzinfo=UTC)
        forged = fields(self.name, at, trigger="manual", occurrence_id=str(uuid.uuid4()))
        assert worker.handle("1-1", forged) is Disposition.INVALID

    def test_an_unknown_trigger_is_dead_lettered(self, worker, client, stream):
        at = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
        assert worker.handle("1-1", fields(self.name, at, trigger="soon")) is Disposition.INVALID
        [(_, letter)] = client.xrange(stream + ":dead")
        assert letter["reason"].startswith("trigger 'soon' is not one of")
