"""The task systems the outbox's fault scenarios run against (tests/faults/test_outbox_faults.py):
RQ on Redis, Celery and Dramatiq on RabbitMQ (publisher confirms).

A `Target` is what a scenario needs of one of them: the broker's own port (the replicas
reach it there or through a `tests._proxy.Proxy` in front of it), the environment that
makes ``tests.faults.jobs_outbox`` build that target's publisher, and the ids of the
messages on the test's queue, read without consuming them (nobody consumes the queue
in those scenarios), duplicates kept. `Fleet` targets (Celery, Dramatiq) run real
workers of a ``once`` task too (``cronjob_test.once_killed``, tests/_killed_body.py).
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime
from pathlib import Path
from typing import ClassVar

import pika
import pika.exceptions
import redis
import rq

from cronjob.contrib import Occurrence, Publisher
from tests import _celery, _dramatiq
from tests._celery import RABBITMQ_URL, require_broker
from tests._killed_body import ONCE_KILLED

#: The port the RabbitMQ URLs of the suite name (their host is 127.0.0.1).
RABBITMQ_PORT = 5672


class Target:
    """One task system, on a queue of the test's own (`close` removes it)."""

    #: The value of ``$OUTBOX_TARGET`` that selects it in ``tests.faults.jobs_outbox``.
    name: ClassVar[str]
    #: The port of its broker on 127.0.0.1.
    port: ClassVar[int]

    def __init__(self) -> None:
        self.queue = f"cronjob_fault_{uuid.uuid4().hex[:12]}"
        #: The name of the job ``tests.faults.jobs_outbox`` registers for this queue.
        self.job = f"outbox-fault-{self.queue}"

    def env(self, port: int) -> dict[str, str]:
        """The environment of a replica that sends to the broker at 127.0.0.1:``port``."""
        return {"OUTBOX_TARGET": self.name, "OUTBOX_QUEUE": self.queue, "OUTBOX_PORT": str(port)}

    def count(self) -> int:
        """How many messages the queue holds."""
        raise NotImplementedError

    def ids(self) -> list[str]:
        """The id of every message on the queue, duplicates kept."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class RQ(Target):
    name = "rq"
    port = 6379

    def __init__(self, redis_url: str) -> None:
        super().__init__()
        self.rq_queue = rq.Queue(self.queue, connection=redis.Redis.from_url(redis_url))

    def count(self) -> int:
        return int(self.rq_queue.count)

    def ids(self) -> list[str]:
        return [i.decode() for i in self.rq_queue.connection.lrange(self.rq_queue.key, 0, -1)]

    def close(self) -> None:
        self.rq_queue.empty()
        self.rq_queue.connection.close()


class Stream(Target):
    """A Redis Stream (``cronjob.contrib.streams``): the queue's name is the stream's key.
    Its dedup keys (``cronjob:occurrence:<id>``) are the test's own: the job is named after
    the queue (``tests.faults.jobs_outbox``), so are its occurrence ids."""

    name = "stream"
    port = 6379

    def __init__(self, redis_url: str) -> None:
        super().__init__()
        self.client = redis.Redis.from_url(redis_url, socket_timeout=5)

    def count(self) -> int:
        return int(self.client.xlen(self.queue))

    def ids(self) -> list[str]:
        """Each entry's ``occurrence_id``, read with XRANGE, duplicates kept."""
        return [f[b"occurrence_id"].decode() for _, f in self.client.xrange(self.queue)]

    def close(self) -> None:
        ids = self.ids()
        if ids:
            self.client.delete(*(f"cronjob:occurrence:{i}" for i in ids))
        self.client.delete(self.queue)
        self.client.close()


class _RabbitMQ(Target):
    """A target whose broker is RabbitMQ: the messages are read with ``basic_get`` and
    left unacknowledged, so closing the channel puts them back."""

    port = RABBITMQ_PORT
    #: The queues to delete after the test (the queue's and the target's own).
    suffixes: ClassVar[tuple[str, ...]] = ("",)

    def __init__(self) -> None:
        super().__init__()
        require_broker(RABBITMQ_URL)

    def _message_id(self, properties: pika.BasicProperties, body: bytes) -> str:
        raise NotImplementedError

    def _connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(_dramatiq.URLS["rabbitmq"]))

    def _declared(self) -> tuple[int, int]:
        """(messages, consumers) of the queue; (0, 0) before anyone declared it."""
        connection = self._connect()
        try:
            method = connection.channel().queue_declare(queue=self.queue, passive=True).method
            return int(method.message_count), int(method.consumer_count)
        except pika.exceptions.ChannelClosedByBroker:  # not declared yet
            return 0, 0
        finally:
            connection.close()

    def count(self) -> int:
        return self._declared()[0]

    def ids(self) -> list[str]:
        """The ids on the queue; none before anyone declared it (nothing was sent)."""
        connection = self._connect()
        try:
            channel = connection.channel()
            found = []
            while True:
                try:
                    method, properties, body = channel.basic_get(self.queue, auto_ack=False)
                except pika.exceptions.ChannelClosedByBroker as error:
                    if error.reply_code != 404 or found:
                        raise
                    return found
                if method is None:
                    return found
                found.append(self._message_id(properties, body))
        finally:
            connection.close()

    def close(self) -> None:
        connection = self._connect()
        try:
            channel = connection.channel()
            for suffix in self.suffixes:
                channel.queue_delete(queue=self.queue + suffix)
        finally:
            connection.close()


class Fleet(_RabbitMQ):
    """A RabbitMQ target whose real workers run the ``once`` task of the scenario "a
    worker killed in a ``once`` body": acknowledged after the body (a killed worker's
    message goes back to the queue), retried about every second while it is busy."""

    def consumers(self) -> int:
        """How many consumers the queue has (0 before a worker declared it)."""
        return self._declared()[1]

    def worker(
        self, tmp_path: Path, n: int, database: str, stale_after: float
    ) -> tuple[list[str], dict[str, str]]:
        """Worker ``n``'s command and environment; the workers of a test share one log,
        `log` (``tmp_path`` is the test's own)."""
        raise NotImplementedError

    def log(self, tmp_path: Path) -> Path:
        raise NotImplementedError

    def publisher(self, marker: str) -> Publisher:
        """The library's publisher of this target, for the ``once`` task on the queue."""
        raise NotImplementedError

    def publish(self, occurrence_id: str, marker: str, instant: datetime) -> None:
        occurrence = Occurrence(occurrence_id, ONCE_KILLED, instant, {})
        self.publisher(marker).publish(occurrence)


class Celery(Fleet):
    name = "celery"

    def worker(
        self, tmp_path: Path, n: int, database: str, stale_after: float
    ) -> tuple[list[str], dict[str, str]]:
        env = {
            **os.environ,
            "CELERY_TEST_BROKER": RABBITMQ_URL,
            "CELERY_TEST_LOG": str(self.log(tmp_path)),
            "CELERY_TEST_DB": database,
            "CELERY_TEST_STALE_AFTER": str(stale_after),
        }
        return _celery.worker_argv(self.queue, f"{self.queue}-{n}"), env

    def log(self, tmp_path: Path) -> Path:
        return tmp_path / "tasks.jsonl"

    def publisher(self, marker: str) -> Publisher:
        from cronjob.contrib.celery import CeleryPublisher

        app = _celery.client_app(RABBITMQ_URL)
        options = {"queue": self.queue}
        return CeleryPublisher(app, "cronjob_test.once_killed", args=(marker,), options=options)

    def _message_id(self, properties: pika.BasicProperties, body: bytes) -> str:
        return str(properties.headers["id"])  # protocol 2: the task id is a header


class Dramatiq(Fleet):
    name = "dramatiq"
    suffixes = ("", ".DQ", ".XQ")

    def worker(
        self, tmp_path: Path, n: int, database: str, stale_after: float
    ) -> tuple[list[str], dict[str, str]]:
        env = {"DRAMATIQ_TEST_DATABASE": database, "DRAMATIQ_TEST_STALE_AFTER": str(stale_after)}
        return _dramatiq.worker_command("rabbitmq", self.queue, tmp_path, env)

    def log(self, tmp_path: Path) -> Path:
        return tmp_path / "worker.jsonl"

    def publisher(self, marker: str) -> Publisher:
        from cronjob.contrib.dramatiq import DramatiqPublisher

        broker = _dramatiq.publisher_broker("rabbitmq")
        return DramatiqPublisher(
            broker, "cronjob_test_once_killed", args=(marker,), queue_name=self.queue
        )

    def _message_id(self, properties: pika.BasicProperties, body: bytes) -> str:
        return str(json.loads(body)["message_id"])
