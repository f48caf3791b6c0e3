"""What `bench_outbox` hands its instants to, and how it times each round's phases.

A *target* is a publisher of ``cronjob.contrib`` (RQ, Celery, Dramatiq) on a queue of the
run's own, with what deletes that queue afterwards. `Timed` wraps any publisher and notes
when each send began and when the broker accepted it; `TimedHandoff` notes when each round
began and ended, so a round splits into: wait (instant to the round's start), record (the
fenced transaction that writes the outbox row), send (the broker's round trip and
confirm) and mark (the transaction that marks the row sent). Also the fresh schema (or
MariaDB database) each run gets.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cronjob.contrib import Handoff, Occurrence, Publisher

#: The targets `target` builds, by the name ``--targets`` takes.
TARGETS = ("rq", "celery-amqp", "celery-redis", "dramatiq-amqp", "stream")


class Timed:
    """A publisher that delegates to ``inner`` and notes, per occurrence id, the wall
    times at which the send began and returned (the broker accepted it)."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self.target = inner.target
        self.sends: dict[str, tuple[float, float, float]] = {}  # id: (instant, began, done)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def publish(self, occurrence: Occurrence) -> None:
        began = time.time()
        self.inner.publish(occurrence)
        self.sends[occurrence.id] = (occurrence.instant.timestamp(), began, time.time())


class TimedHandoff(Handoff):
    """`Handoff` that notes when each round's function began and ended, by occurrence id."""

    def __init__(self, publisher: Timed, **kwargs: Any) -> None:
        super().__init__(publisher, **kwargs)
        self.rounds: dict[str, tuple[float, float, float]] = {}  # id: (instant, began, end)

    def __call__(self, ctx: Any) -> None:
        began = time.time()
        try:
            super().__call__(ctx)
        finally:
            self.rounds[ctx.occurrence_id] = (ctx.instant.timestamp(), began, time.time())


@dataclass
class Target:
    """A publisher on a queue of the run's own; ``cleanup`` deletes the queue."""

    name: str
    publisher: Publisher
    cleanup: Callable[[], None]


def target(name: str, *, redis_url: str, amqp_url: str) -> Target:
    """Build the target ``name`` (one of `TARGETS`) on a fresh queue named
    ``bench-outbox-<hex>``."""
    queue = f"bench-outbox-{uuid.uuid4().hex[:10]}"
    if name == "rq":
        from redis import Redis
        from rq import Queue

        from cronjob.contrib.rq import RQPublisher

        redis = Redis.from_url(redis_url)
        rq_queue = Queue(queue, connection=redis)

        def rq_cleanup() -> None:
            rq_queue.empty()
            redis.close()

        return Target(name, RQPublisher(rq_queue, "benchmarks.nothing"), rq_cleanup)
    if name in ("celery-amqp", "celery-redis"):
        from celery import Celery
        from kombu import Connection

        from cronjob.contrib.celery import CeleryPublisher

        broker = amqp_url if name == "celery-amqp" else redis_url
        app = Celery("bench_outbox", broker=broker)
        with Connection(broker) as conn:  # declared as a worker would, durable
            conn.SimpleQueue(queue).close()
        publisher = CeleryPublisher(app, "bench.nothing", options={"queue": queue})

        def celery_cleanup() -> None:
            publisher.close()
            with Connection(broker) as conn:
                conn.default_channel.queue_delete(queue)

        return Target(name, publisher, celery_cleanup)
    if name == "dramatiq-amqp":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        from cronjob.contrib.dramatiq import DramatiqPublisher

        # pika reads the vhost "/" only as %2F (kombu's "//" is an empty one to it).
        url = amqp_url[:-2] + "/%2F" if amqp_url.endswith("//") else amqp_url
        dq_broker = RabbitmqBroker(url=url, confirm_delivery=True)
        dq_queue = queue.replace("-", "_")

        def dramatiq_cleanup() -> None:
            channel = dq_broker.channel
            for q in (dq_queue, f"{dq_queue}.DQ", f"{dq_queue}.XQ"):
                with contextlib.suppress(Exception):
                    channel.queue_delete(q)
            dq_broker.close()

        return Target(
            name, DramatiqPublisher(dq_broker, "nothing", queue_name=dq_queue), dramatiq_cleanup
        )
    if name == "stream":
        from redis import Redis

        from cronjob.contrib.streams import DEDUP_PREFIX, StreamPublisher

        client = Redis.from_url(redis_url)
        stream = StreamPublisher(client, stream=queue)

        def stream_cleanup() -> None:
            keys = [DEDUP_PREFIX + f[b"occurrence_id"].decode() for _, f in client.xrange(queue)]
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start : start + 1000])
            client.delete(queue)
            client.close()

        return Target(name, stream, stream_cleanup)
    raise SystemExit(f"unknown target {name!r}; the targets are {', '.join(TARGETS)}")


def fresh_database(base: str) -> tuple[str, Callable[[], None]]:
    """A fresh PostgreSQL schema (or MariaDB/MySQL database) on ``base``'s server: its
    URL, and what drops it."""
    parsed = sa.make_url(base)
    name = f"bench_outbox_{uuid.uuid4().hex[:10]}"
    mysql = parsed.get_backend_name() in ("mysql", "mariadb")
    admin = sa.create_engine(base)
    with admin.begin() as conn:
        if mysql:
            conn.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        else:
            conn.execute(sa.text(f"CREATE SCHEMA {name}"))
    if mysql:
        url = parsed.set(database=name)
    else:
        url = parsed.update_query_dict({"options": f"-csearch_path={name}"})

    def drop() -> None:
        with admin.begin() as conn:
            statement = f"DROP DATABASE `{name}`" if mysql else f"DROP SCHEMA {name} CASCADE"
            conn.execute(sa.text(statement))
        admin.dispose()

    return url.render_as_string(hide_password=False), drop
