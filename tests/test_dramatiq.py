"""The Dramatiq target: `DramatiqPublisher` checks its input when the job is built, and
puts one message per occurrence on real RabbitMQ and Redis, which a real ``dramatiq``
worker runs with the occurrence id as its message id, the instant, the arguments, and
the round's trace context (tests/dramatiq_worker.py is the worker's side)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cronjob
from cronjob.contrib._handoff import Occurrence
from cronjob.contrib.dramatiq import DramatiqPublisher, send
from cronjob.testing import FakeClock
from tests import _dramatiq
from tests._dramatiq import publisher_broker, queued, reachable, worker

INSTANT = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
NAME = "nightly-export"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
RECORD = "cronjob_test_record"


def occurrence(headers: dict[str, str] | None = None) -> Occurrence:
    return Occurrence(
        id=cronjob.occurrence_id(NAME, INSTANT), name=NAME, instant=INSTANT, headers=headers or {}
    )


@pytest.fixture
def redis_broker() -> RedisBroker:
    """A Redis broker object; building one reaches no server."""
    return RedisBroker(url=_dramatiq.URLS["redis"])


@pytest.fixture(params=["rabbitmq", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    reachable(request.param)
    return str(request.param)


@pytest.fixture
def queue(kind: str) -> Iterator[str]:
    name = _dramatiq.new_queue()
    yield name
    _dramatiq.remove_queue(kind, name)


@pytest.fixture
def broker(kind: str) -> Iterator[dramatiq.Broker]:
    made = publisher_broker(kind)
    yield made
    made.close()


class TestChecks:
    """Bad input fails when the job is built (at import), naming the actor."""

    def test_it_refuses_an_option_the_brokers_middleware_does_not_read(self, redis_broker):
        with pytest.raises(cronjob.RegistrationError) as caught:
            DramatiqPublisher(redis_broker, "export", max_retires=3)
        assert str(caught.value).startswith(
            "Dramatiq actor 'export': unknown option 'max_retires'; the broker's middleware "
            "reads: max_age, max_backoff, max_retries,"
        )

    def test_it_refuses_a_delay(self, redis_broker):
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^Dramatiq actor 'export': option 'delay' is refused: a delay counts from each",
        ):
            DramatiqPublisher(redis_broker, "export", delay=1000)

    def test_it_refuses_priority_and_points_to_broker_priority(self, redis_broker):
        with pytest.raises(
            cronjob.RegistrationError, match=r"on RabbitMQ a message's priority is broker_priority$"
        ):
            DramatiqPublisher(redis_broker, "export", priority=1)

    @pytest.mark.parametrize(
        "option", ["cronjob_instant", "cronjob_name", "trace_ctx", "message_id"]
    )
    def test_it_refuses_the_options_it_sets_itself(self, redis_broker, option):
        with pytest.raises(
            cronjob.RegistrationError,
            match=rf"^Dramatiq actor 'export': option '{option}' is refused",
        ):
            DramatiqPublisher(redis_broker, "export", **{option: "x"})

    def test_it_refuses_broker_priority_on_redis(self, redis_broker):
        with pytest.raises(
            cronjob.RegistrationError, match=r"needs a RabbitmqBroker built with max_priority"
        ):
            DramatiqPublisher(redis_broker, "export", broker_priority=1)

    def test_it_takes_broker_priority_within_rabbitmqs_max_priority(self):
        broker = RabbitmqBroker(
            url=_dramatiq.URLS["rabbitmq"], confirm_delivery=True, max_priority=5
        )
        DramatiqPublisher(broker, "export", broker_priority=5)
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^Dramatiq actor 'export': broker_priority must be a whole number from 0 to 5, "
            r"got 6$",
        ):
            DramatiqPublisher(broker, "export", broker_priority=6)

    def test_it_refuses_a_rabbitmq_broker_without_publisher_confirms(self):
        broker = RabbitmqBroker(url=_dramatiq.URLS["rabbitmq"])
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^Dramatiq actor 'export': the RabbitmqBroker must be built with "
            r"confirm_delivery=True",
        ):
            DramatiqPublisher(broker, "export")

    def test_it_refuses_arguments_that_are_not_json(self, redis_broker):
        with pytest.raises(
            cronjob.RegistrationError, match=r"^Dramatiq actor 'export': kwargs must be JSON-able"
        ):
            DramatiqPublisher(redis_broker, "export", kwargs={"when": INSTANT})

    def test_it_refuses_an_option_value_that_is_not_json(self, redis_broker):
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^Dramatiq actor 'export': option 'retry_when' must be JSON-able",
        ):
            DramatiqPublisher(redis_broker, "export", retry_when=lambda retries, exc: True)

    def test_it_refuses_args_given_as_a_string(self, redis_broker):
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^Dramatiq actor 'export': args must be a list or tuple, got 'abc'$",
        ):
            DramatiqPublisher(redis_broker, "export", args="abc")

    @pytest.mark.parametrize("queue_name", ["", "1st", "a queue", "exports.DQ", "exports.XQ"])
    def test_it_refuses_a_queue_name_dramatiq_would_not_consume(self, redis_broker, queue_name):
        with pytest.raises(
            cronjob.RegistrationError, match=r"^Dramatiq actor 'export': queue_name "
        ):
            DramatiqPublisher(redis_broker, "export", queue_name=queue_name)

    def test_it_refuses_an_empty_actor_name(self, redis_broker):
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^a Dramatiq actor name must be a non-empty string, got ''$",
        ):
            DramatiqPublisher(redis_broker, "")

    def test_it_refuses_what_is_not_a_broker(self):
        with pytest.raises(TypeError, match=r"^broker must be a Dramatiq broker, got 'redis://"):
            DramatiqPublisher(_dramatiq.URLS["redis"], "export")  # type: ignore[arg-type]

    def test_send_checks_before_it_builds_the_job(self, redis_broker):
        with pytest.raises(
            cronjob.RegistrationError, match=r"^Dramatiq actor 'export': unknown option 'queue'"
        ):
            send(redis_broker, "export", queue="exports")


class TestMessage:
    def test_the_message_carries_the_id_the_instant_the_name_the_trace_and_the_users_parts(
        self, redis_broker
    ):
        publisher = DramatiqPublisher(
            redis_broker,
            "export",
            args=[1, "a"],
            kwargs={"full": True},
            queue_name="exports",
            max_retries=2,
        )
        message = publisher.message(occurrence({"traceparent": TRACEPARENT}))
        assert message.asdict() | {"message_timestamp": 0} == {
            "queue_name": "exports",
            "actor_name": "export",
            "args": (1, "a"),
            "kwargs": {"full": True},
            "options": {
                "max_retries": 2,
                "cronjob_instant": "2026-03-02T10:00:00Z",
                "cronjob_name": NAME,
                "trace_ctx": {"traceparent": TRACEPARENT},
            },
            "message_id": cronjob.occurrence_id(NAME, INSTANT),
            "message_timestamp": 0,
        }

    def test_without_a_trace_context_the_message_has_no_trace_option(self, redis_broker):
        message = DramatiqPublisher(redis_broker, "export").message(occurrence())
        assert "trace_ctx" not in message.options

    def test_it_describes_what_it_sends_without_the_arguments_or_the_url(self):
        broker = RabbitmqBroker(url="amqp://guest:secret@127.0.0.1:5672/%2F", confirm_delivery=True)
        publisher = DramatiqPublisher(broker, "export", args=["secret-arg"], time_limit=60_000)
        assert publisher.target == "dramatiq"
        assert publisher.describe() == {
            "actor": "export",
            "queue": "default",
            "broker": "RabbitmqBroker",
            "options": {"time_limit": 60_000},
        }
        assert "secret" not in json.dumps(publisher.describe())


class TestPublish:
    """On the real brokers, with a real worker."""

    def test_once_publish_returns_the_message_is_on_the_queue(self, kind, queue, broker):
        DramatiqPublisher(broker, RECORD, queue_name=queue).publish(occurrence())
        assert queued(kind, queue) == 1

    def test_the_actor_gets_the_occurrence_id_as_its_message_id_the_instant_and_the_args(
        self, kind, queue, broker, tmp_path
    ):
        publisher = DramatiqPublisher(
            broker, RECORD, args=[7, "x"], kwargs={"full": True}, queue_name=queue
        )
        with worker(kind, queue, tmp_path) as running:
            publisher.publish(occurrence())
            running.wait_processed(1)
            [seen] = running.seen()
        assert seen["message_id"] == cronjob.occurrence_id(NAME, INSTANT)
        assert seen["actor"] == RECORD
        assert seen["args"] == [7, "x"]
        assert seen["kwargs"] == {"full": True}
        assert seen["options"]["cronjob_instant"] == "2026-03-02T10:00:00Z"
        assert datetime.fromisoformat(seen["options"]["cronjob_instant"]) == INSTANT
        assert seen["options"]["cronjob_name"] == NAME

    def test_a_second_send_of_an_occurrence_carries_the_id_of_the_first(
        self, kind, queue, broker, tmp_path
    ):
        """What the outbox does after a crash between the send and its mark."""
        publisher = DramatiqPublisher(broker, RECORD, queue_name=queue)
        with worker(kind, queue, tmp_path) as running:
            publisher.publish(occurrence())
            publisher.publish(occurrence())
            running.wait_processed(2)
            ids = [seen["message_id"] for seen in running.seen()]
        assert ids == [cronjob.occurrence_id(NAME, INSTANT)] * 2

    def test_the_workers_span_joins_the_rounds_trace(self, kind, queue, broker, tmp_path):
        """A real round (fake clock, SQLite) publishes with the trace context it injects;
        the worker's span, recorded by its own SDK, is a child of the round's span."""
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        publisher = DramatiqPublisher(broker, RECORD, queue_name=queue)
        rounds: list[cronjob.Round] = []

        def job(ctx: cronjob.Round) -> None:
            # What the outbox's handoff does in the round (until it lands on this branch).
            headers: dict[str, str] = {}
            propagate.inject(headers)
            publisher.publish(Occurrence(ctx.occurrence_id, ctx.name, ctx.instant, headers))
            rounds.append(ctx)

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", NAME)
        clock = FakeClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))
        with worker(kind, queue, tmp_path) as running:
            with cronjob.Scheduler(
                f"sqlite:///{tmp_path / 'lease.sqlite'}",
                registry=registry,
                clock=clock,
                replica_id="r1",
                tracer_provider=provider,
            ):
                clock.advance(3600)
            running.wait_processed(1)
            [seen] = running.seen()
            [span] = running.spans_read()
        [ctx] = rounds
        [root] = [s for s in exporter.get_finished_spans() if s.name == f"cronjob {NAME}"]
        assert seen["message_id"] == ctx.occurrence_id
        assert seen["trace_id"] == ctx.trace_id
        assert span["context"]["trace_id"] == f"0x{ctx.trace_id}"
        assert span["parent_id"] == f"0x{root.context.span_id:016x}"
        assert span["attributes"]["messaging.message.id"] == ctx.occurrence_id


class TestFailure:
    """A send the broker cannot take raises: the outbox then retries it."""

    def test_publish_raises_when_redis_cannot_be_reached(self):
        broker = RedisBroker(url="redis://127.0.0.1:1/0")
        with pytest.raises(Exception) as caught:
            DramatiqPublisher(broker, RECORD).publish(occurrence())
        assert type(caught.value).__name__ == "ConnectionError"

    def test_publish_raises_when_rabbitmq_cannot_be_reached(self):
        broker = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:1/%2F", confirm_delivery=True)
        with pytest.raises(dramatiq.errors.ConnectionClosed):
            DramatiqPublisher(broker, RECORD).publish(occurrence())
