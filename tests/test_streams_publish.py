"""Publish-if-new to a real Redis Stream: one entry per occurrence however often it is
sent, with the fields a worker checks, through the outbox of real replicas."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import cronjob
from cronjob.contrib import Occurrence as Handed
from cronjob.testing import FakeClock

redis = pytest.importorskip("redis")
from cronjob.contrib import streams  # noqa: E402

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
NINE_ONE = START + timedelta(minutes=1)


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
    """A stream of this test's own; it and its dedup keys are deleted after."""
    name = f"cronjob-test:{uuid.uuid4().hex[:12]}"
    ids: list[str] = []
    yield name
    for _entry_id, fields in client.xrange(name):
        ids.append(fields.get("occurrence_id", ""))
    client.delete(name, *(streams.DEDUP_PREFIX + i for i in ids if i))


def handed(name: str, instant: datetime, *, app: str = "", again: bool = False) -> Handed:
    return Handed(
        id=cronjob.occurrence_id(name, instant, app=app),
        name=name,
        instant=instant,
        headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        app=app,
        again=again,
    )


def counted(reader: InMemoryMetricReader) -> dict[str, int]:
    found: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name.startswith("cronjob.stream."):
                    total = sum(point.value for point in metric.data.data_points)
                    found[metric.name.removeprefix("cronjob.stream.")] = total
    return found


class TestPublishIfNew:
    def test_a_republish_finds_the_key_and_adds_no_second_entry(self, client, stream, redis_url):
        reader = InMemoryMetricReader()
        publisher = streams.StreamPublisher(
            redis_url, stream=stream, meter_provider=MeterProvider(metric_readers=[reader])
        )
        name = f"job-{uuid.uuid4().hex[:8]}"
        first = publisher.publish_if_new(handed(name, NINE_ONE))
        again = publisher.publish_if_new(handed(name, NINE_ONE, again=True))
        assert first is not None
        assert again is None
        assert [entry_id for entry_id, _ in client.xrange(stream)] == [first]
        assert counted(reader) == {"published": 1, "duplicate": 1, "republished": 1}

    def test_the_dedup_key_lives_a_week_and_names_the_entry(self, client, stream, redis_url):
        publisher = streams.StreamPublisher(redis_url, stream=stream)
        occurrence = handed(f"job-{uuid.uuid4().hex[:8]}", NINE_ONE)
        entry_id = publisher.publish_if_new(occurrence)
        key = streams.DEDUP_PREFIX + occurrence.id
        assert client.get(key) == entry_id
        assert 7 * 86400 - 5 < client.ttl(key) <= 7 * 86400

    def test_the_entry_carries_the_fields_a_worker_checks(self, client, stream, redis_url):
        publisher = streams.StreamPublisher(redis_url, stream=stream, args={"full": True})
        occurrence = handed("nightly", NINE_ONE, app="billing")
        publisher.publish(occurrence)
        [(_, fields)] = client.xrange(stream)
        assert fields == {
            "source": "cronjob.schedule",
            "app": "billing",
            "schedule": "nightly",
            "occurrence_id": cronjob.occurrence_id("nightly", NINE_ONE, app="billing"),
            "scheduled_at": "2026-03-02T09:01:00Z",
            "args": '{"full":true}',
            "traceparent": occurrence.headers["traceparent"],
        }

    def test_the_stream_is_capped_approximately(self, client, stream, redis_url):
        publisher = streams.StreamPublisher(redis_url, stream=stream, maxlen=10)
        name = f"job-{uuid.uuid4().hex[:8]}"
        for minute in range(300):
            publisher.publish(handed(name, START + timedelta(minutes=minute)))
        assert client.xlen(stream) < 300
        client.delete(
            *(
                streams.DEDUP_PREFIX + cronjob.occurrence_id(name, START + timedelta(minutes=m))
                for m in range(300)
            )
        )

    def test_a_manual_rounds_instant_keeps_its_fraction(self, stream, redis_url):
        """The moment a manual round was asked for is its instant, to the millisecond:
        the entry carries it (the worker's structure check takes a fraction only with
        ``trigger=manual``), instead of the publisher refusing every manual round."""
        publisher = streams.StreamPublisher(redis_url, stream=stream)
        asked = NINE_ONE + timedelta(milliseconds=518)
        occurrence = dataclasses.replace(handed("x", asked), trigger="manual")
        fields = streams.entry_fields(occurrence)
        assert fields["scheduled_at"] == "2026-03-02T09:01:00.518000Z"
        assert fields["trigger"] == "manual"
        publisher.publish(occurrence)


class TestAppInIds:
    def test_an_empty_app_gives_the_id_of_the_releases_before(self):
        assert cronjob.occurrence_id("nightly", NINE_ONE, app="") == cronjob.occurrence_id(
            "nightly", NINE_ONE
        )
        assert cronjob.occurrence_id("nightly", NINE_ONE) == "52f56ec2-35bd-5c71-91cf-abc7a483ab34"

    def test_two_apps_with_a_same_named_job_get_two_ids(self):
        one = cronjob.occurrence_id("nightly", NINE_ONE, app="billing")
        two = cronjob.occurrence_id("nightly", NINE_ONE, app="search")
        assert len({one, two, cronjob.occurrence_id("nightly", NINE_ONE)}) == 3

    def test_it_refuses_an_app_with_a_colon(self):
        with pytest.raises(ValueError, match=r"^app must be empty or 1 to 63"):
            cronjob.occurrence_id("nightly", NINE_ONE, app="a:b")

    def test_the_scheduler_reads_cronjob_app(self, monkeypatch, sqlite_url):
        monkeypatch.setenv("CRONJOB_APP", "billing")
        assert cronjob.Scheduler(sqlite_url, registry=cronjob.Registry()).app == "billing"
        assert cronjob.Scheduler(sqlite_url, registry=cronjob.Registry(), app="").app == ""


class TestThroughTheOutbox:
    def test_replicas_put_one_entry_per_instant_with_the_app_in_its_id(
        self, replicas, clock, client, stream, redis_url
    ):
        registry = cronjob.Registry()
        name = f"job-{uuid.uuid4().hex[:8]}"
        registry.register(streams.publish(redis_url, stream=stream), "0 * * * * *", name)
        replicas(registry, "a", app="billing")
        replicas(registry, "b", app="billing")
        clock.advance(65)
        clock.advance(60)
        entries = client.xrange(stream)
        assert [fields["scheduled_at"] for _, fields in entries] == [
            "2026-03-02T09:01:00Z",
            "2026-03-02T09:02:00Z",
        ]
        for _, fields in entries:
            instant = datetime.fromisoformat(fields["scheduled_at"])
            assert fields["occurrence_id"] == cronjob.occurrence_id(name, instant, app="billing")
            assert json.loads(fields["args"]) == {}
