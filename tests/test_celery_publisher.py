"""The Celery target's message: a real ``celery worker`` on RabbitMQ and on Redis
receives the task with the occurrence id as its request id, the instant, the args, and
continues the round's trace; the broker's refusal raises."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from amqp.exceptions import MessageNacked
from kombu import Queue
from kombu.exceptions import OperationalError
from opentelemetry.sdk.trace import TracerProvider

import cronjob
from cronjob.contrib._handoff import Occurrence
from cronjob.contrib.celery import CeleryPublisher, OptionError
from cronjob.testing import FakeClock
from tests._celery import BROKERS, RABBITMQ_URL, client_app, delete_queue, new_queue, require_broker
from tests._celery import start_worker as _start_worker

TASK = "cronjob_test.record"
INSTANT = datetime(2026, 3, 8, 6, 0, tzinfo=UTC)


@pytest.fixture(params=BROKERS)
def broker_url(request: pytest.FixtureRequest) -> str:
    url: str = request.param
    require_broker(url)
    return url


@pytest.fixture
def queue(broker_url: str):
    name = new_queue()
    yield name
    delete_queue(broker_url, name)


@pytest.fixture
def worker(broker_url: str, queue: str, tmp_path):
    yield from _start_worker(broker_url, queue, tmp_path)


def occurrence(name: str = "nightly", instant: datetime = INSTANT, **headers: str) -> Occurrence:
    return Occurrence(
        id=cronjob.occurrence_id(name, instant), name=name, instant=instant, headers=headers
    )


class TestTheMessage:
    def test_the_worker_gets_the_occurrence_id_the_instant_and_the_args(
        self, broker_url, queue, worker
    ):
        publisher = CeleryPublisher(
            client_app(broker_url),
            TASK,
            args=(1, "two"),
            kwargs={"full": True},
            options={"queue": queue},
        )
        sent = occurrence()
        publisher.publish(sent)
        publisher.close()
        [got] = worker.wait_for(1)
        assert got["id"] == sent.id
        assert got["instant"] == "2026-03-08T06:00:00Z"
        assert got["name"] == "nightly"
        assert got["args"] == [1, "two"]
        assert got["kwargs"] == {"full": True}

    def test_priority_and_expires_reach_the_worker_expires_counted_from_the_instant(
        self, broker_url, queue, worker
    ):
        instant = datetime.now(UTC).replace(microsecond=0)
        publisher = CeleryPublisher(
            client_app(broker_url),
            TASK,
            options={"queue": queue, "priority": 5, "expires": 3600},
        )
        publisher.publish(occurrence(instant=instant))
        publisher.close()
        [got] = worker.wait_for(1)
        assert datetime.fromisoformat(got["expires"]) == instant + timedelta(hours=1)
        assert got["priority"] == 5

    def test_each_instant_is_one_message_with_its_own_id(self, broker_url, queue, worker):
        publisher = CeleryPublisher(client_app(broker_url), TASK, options={"queue": queue})
        sent = [occurrence(instant=INSTANT + timedelta(minutes=i)) for i in range(3)]
        for one in sent:
            publisher.publish(one)
        publisher.close()
        got = worker.wait_for(3)
        assert sorted(r["id"] for r in got) == sorted(o.id for o in sent)


class TestTheTrace:
    def test_the_workers_span_is_under_the_rounds_trace(self, broker_url, queue, worker, tmp_path):
        """A real round (fake clock, SQLite) publishes through the outbox's handoff;
        the instrumented worker's span has the round's trace id."""
        from cronjob.contrib.celery import send

        trace_ids: list[str] = []
        job = send(client_app(broker_url), TASK, queue=queue)

        def round_(ctx: cronjob.Round) -> None:
            trace_ids.append(ctx.trace_id)
            job(ctx)

        registry = cronjob.Registry()
        registry.register(round_, "0 * * * * *", "traced")
        clock = FakeClock(INSTANT)
        with cronjob.Scheduler(
            f"sqlite:///{tmp_path / 'db.sqlite'}",
            registry=registry,
            clock=clock,
            replica_id="r1",
            tracer_provider=TracerProvider(),
        ):
            clock.advance(60)
        [got] = worker.wait_for(1)
        [span] = worker.span_records(1)
        assert trace_ids and len(trace_ids[0]) == 32
        assert got["traceparent"].split("-")[1] == trace_ids[0]
        assert span["trace_id"] == trace_ids[0]
        assert span["parent_span_id"] == got["traceparent"].split("-")[2]
        assert got["id"] == cronjob.occurrence_id("traced", INSTANT + timedelta(minutes=1))


class TestFailures:
    def test_a_broker_that_cannot_be_reached_raises(self, broker_url):
        unreachable = broker_url.replace(":5672", ":1").replace(":6379", ":1")
        publisher = CeleryPublisher(client_app(unreachable), TASK, options={"queue": new_queue()})
        with pytest.raises(Exception) as caught:
            publisher.publish(occurrence())
        assert "refused" in str(caught.value).lower() or "111" in str(caught.value)

    def test_a_message_rabbitmq_refuses_raises_rather_than_vanish(self):
        """A queue full with ``reject-publish`` makes RabbitMQ nack the message: only a
        publisher waiting for the confirm can know, and it raises."""
        require_broker(RABBITMQ_URL)
        name = new_queue()
        app = client_app(
            RABBITMQ_URL,
            task_queues=[
                Queue(name, queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
            ],
        )
        publisher = CeleryPublisher(app, TASK, options={"queue": name})
        try:
            # Celery's own send, without confirms, returns as if all were well.
            app.send_task(TASK, queue=name, retry=False)
            with pytest.raises(OperationalError) as caught:
                publisher.publish(occurrence())
            assert isinstance(caught.value.__cause__, MessageNacked)
        finally:
            publisher.close()
            delete_queue(RABBITMQ_URL, name)


class TestBuilding:
    def test_it_rejects_an_unknown_option_naming_it(self):
        with pytest.raises(
            OptionError,
            match=r"^task 'proj.t': unknown option 'countdown'; the options are "
            r"exchange, expires, priority, queue, routing_key$",
        ):
            CeleryPublisher(client_app("memory://"), "proj.t", options={"countdown": 5})

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"priority": 256}, "priority must be an int 0-255, not 256"),
            ({"priority": True}, "priority must be an int 0-255, not True"),
            ({"expires": 0}, "expires must be positive seconds or a timedelta, not 0"),
            ({"expires": "1h"}, "expires must be positive seconds or a timedelta, not '1h'"),
            ({"queue": ""}, "queue must be a non-empty string, not ''"),
        ],
    )
    def test_it_rejects_a_bad_option_value(self, options, message):
        with pytest.raises(OptionError, match=f"^task 'proj.t': {message}$"):
            CeleryPublisher(client_app("memory://"), "proj.t", options=options)

    def test_it_rejects_args_that_are_not_json(self):
        with pytest.raises(TypeError, match=r"^args and kwargs of 'proj\.t' must be JSON-able"):
            CeleryPublisher(client_app("memory://"), "proj.t", args=(object(),))

    def test_describe_names_the_task_and_options_never_the_values_of_args(self):
        publisher = CeleryPublisher(
            client_app("memory://"),
            "proj.t",
            args=("secret",),
            kwargs={"token": "secret"},
            options={"queue": "q", "expires": timedelta(minutes=1)},
        )
        assert publisher.target == "celery"
        assert publisher.describe() == {
            "task": "proj.t",
            "args": 1,
            "kwargs": ["token"],
            "queue": "q",
            "expires": 60.0,
        }
