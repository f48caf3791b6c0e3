"""A job for the outbox's fault scenarios: every 2 s, a message for the task system
``$OUTBOX_TARGET`` (``rq``, the default; ``celery``; ``dramatiq``) on the queue
``$OUTBOX_QUEUE``, through its broker at 127.0.0.1:``$OUTBOX_PORT`` (Redis for RQ,
RabbitMQ with publisher confirms for Celery and Dramatiq; a proxy the test can cut).
``stream`` adds entries to the Redis Stream ``$OUTBOX_QUEUE`` (``streams.publish``'s
publish-if-new).

After each send it prints ``outbox-sent <id>`` on stderr and, with
``$OUTBOX_PAUSE_AFTER_SEND`` seconds, waits before the mark: the window in which a kill
leaves a message sent and its row unsent, made wide enough to hit.

The hand-off's knobs are short ones of the test's own unless ``$OUTBOX_KNOBS`` is
``derived`` (none given: the defaults a user gets). With ``$OUTBOX_TASK`` it registers
no job, but the task of that name (schedules made of data hand their instants with it)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import cronjob
from cronjob.contrib import Handoff, Occurrence, Publisher

TARGET = os.environ.get("OUTBOX_TARGET") or "rq"
QUEUE = os.environ["OUTBOX_QUEUE"]
PORT = int(os.environ["OUTBOX_PORT"])


class Announced:
    """The target's publisher, saying each send that returned (and pausing after it)."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.target = publisher.target

    def describe(self) -> dict[str, Any]:
        return self.publisher.describe()

    def publish(self, occurrence: Occurrence) -> None:
        self.publisher.publish(occurrence)
        print(f"outbox-sent {occurrence.id}", file=sys.stderr, flush=True)
        pause = float(os.environ.get("OUTBOX_PAUSE_AFTER_SEND") or 0)
        if pause:
            time.sleep(pause)


def _rq() -> Publisher:
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from rq import Queue

    from cronjob.contrib.rq import RQPublisher

    # No retries of the client's own (redis-py retries three times, backing off): a send
    # that fails must fail within the round's period, and the outbox retries it anyway.
    redis = Redis(
        port=PORT, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    return RQPublisher(Queue(QUEUE, connection=redis), "tests.rq_tasks.traced", args=("f",))


def _celery() -> Publisher:
    from celery import Celery

    from cronjob.contrib.celery import CeleryPublisher

    app = Celery("outbox-fault", broker=f"amqp://guest:guest@127.0.0.1:{PORT}//")
    # A connection that cannot be made fails within the round's period.
    app.conf.update(broker_connection_timeout=1)
    return CeleryPublisher(app, "cronjob_test.record", args=("f",), options={"queue": QUEUE})


def _dramatiq() -> Publisher:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    from cronjob.contrib.dramatiq import DramatiqPublisher

    url = f"amqp://guest:guest@127.0.0.1:{PORT}/%2F?socket_timeout=1&connection_attempts=1"
    broker = RabbitmqBroker(url=url, confirm_delivery=True)
    return DramatiqPublisher(broker, "cronjob_test_record", args=("f",), queue_name=QUEUE)


def _stream() -> Publisher:
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from cronjob.contrib.streams import StreamPublisher

    redis = Redis(
        port=PORT, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    return StreamPublisher(redis, stream=QUEUE)


_PUBLISHERS = {"rq": _rq, "celery": _celery, "dramatiq": _dramatiq, "stream": _stream}
if TARGET not in _PUBLISHERS:
    raise SystemExit(f"OUTBOX_TARGET={TARGET!r}: one of {', '.join(_PUBLISHERS)}")
_publisher = Announced(_PUBLISHERS[TARGET]())
if os.environ.get("OUTBOX_KNOBS") == "derived":  # what a user gets who sets none
    _handoff = Handoff(_publisher)
else:
    _handoff = Handoff(
        _publisher,
        retry_within=1,
        hold=5,
        send_timeout=4,  # above the pause after the send: a kill comes before the mark
    )
# Named after the test's queue: an occurrence id is the job's name and the instant, and a
# broker's ids (an RQ job, a stream's dedup key) are broker-wide, so two tests running at
# once must not send the same ids.
JOB = f"outbox-fault-{QUEUE}"
if os.environ.get("OUTBOX_TASK"):  # the task of schedules made of data, and no job
    cronjob.register_task(_handoff, os.environ["OUTBOX_TASK"])
else:
    cronjob.register(_handoff, "*/2 * * * * *", JOB)
