"""The Dramatiq tests' brokers and worker: reach RabbitMQ or Redis (skip, or under CI
fail, when one is down), a queue of the test's own (removed after), and a real
``dramatiq`` worker process on it (tests/dramatiq_worker.py) whose log a test polls."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dramatiq.broker import Broker

from tests._process import in_session

ROOT = Path(__file__).resolve().parent.parent
#: The brokers of the development and CI machines (SPEC.md, "Handing instants to a task queue").
URLS = {
    "rabbitmq": os.environ.get(
        "CRONJOB_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"
    ),
    "redis": os.environ.get("CRONJOB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
#: How long a test waits for the worker to have processed what it sent.
DEADLINE = 60.0

# Broker -> why it cannot be reached (None: reachable), checked once per session.
_unreachable: dict[str, str | None] = {}


def reachable(kind: str) -> None:
    """Skip the test when broker ``kind`` is down; fail it under CI (``CI=true``)."""
    if kind not in _unreachable:
        try:
            if kind == "rabbitmq":
                import pika

                params = pika.URLParameters(URLS[kind])
                params.socket_timeout = 5
                pika.BlockingConnection(params).close()
            else:
                import redis

                redis.Redis.from_url(URLS[kind], socket_timeout=5).ping()
            _unreachable[kind] = None
        except Exception as exc:
            _unreachable[kind] = f"{type(exc).__name__}: {exc}"
    reason = _unreachable[kind]
    if reason is not None:
        message = f"the {kind} server is unreachable ({reason})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; under CI the brokers must run (.ci/run starts them)")
        pytest.skip(message)


def publisher_broker(kind: str) -> Broker:
    """A broker as an application's replica builds it (RabbitMQ with publisher confirms)."""
    if kind == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=URLS[kind], confirm_delivery=True)
    from dramatiq.brokers.redis import RedisBroker

    return RedisBroker(url=URLS[kind])


def new_queue() -> str:
    return f"cronjob_test_{uuid.uuid4().hex[:12]}"


def queued(kind: str, queue: str) -> int:
    """How many messages wait on ``queue`` (not its delay or dead-letter queue), read on
    a connection of its own."""
    if kind == "rabbitmq":
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(URLS[kind]))
        try:
            declared = connection.channel().queue_declare(queue=queue, passive=True)
            return int(declared.method.message_count)
        finally:
            connection.close()
    import redis

    return int(redis.Redis.from_url(URLS[kind]).llen(f"dramatiq:{queue}"))


def remove_queue(kind: str, queue: str) -> None:
    """Delete ``queue`` and its delay and dead-letter queues from the broker."""
    names = [queue, f"{queue}.DQ", f"{queue}.XQ"]
    if kind == "rabbitmq":
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(URLS[kind]))
        try:
            channel = connection.channel()
            for name in names:
                channel.queue_delete(queue=name)
        finally:
            connection.close()
    else:
        import redis

        client = redis.Redis.from_url(URLS[kind])
        client.delete(*(f"dramatiq:{n}{suffix}" for n in names for suffix in ("", ".msgs")))
        for name in names:  # each worker's acks of the queue
            for key in client.scan_iter(f"dramatiq:__acks__.*.{name}"):
                client.delete(key)


@dataclass
class Worker:
    """A ``dramatiq`` worker process and the files it writes."""

    process: subprocess.Popen[str]
    log: Path
    spans: Path

    def lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def seen(self) -> list[dict[str, Any]]:
        """What the actors saw, one entry per message they ran."""
        return [line for line in self.lines() if "message_id" in line]

    def processed(self) -> list[dict[str, Any]]:
        """The messages the worker is done with, in order."""
        return [line for line in self.lines() if "processed" in line]

    def wait_processed(self, count: int) -> list[dict[str, Any]]:
        """Poll until the worker is done with ``count`` messages (at most `DEADLINE` s)."""
        deadline = time.monotonic() + DEADLINE
        while len(done := self.processed()) < count:
            if self.process.poll() is not None:
                raise AssertionError(f"the worker ended ({self.process.returncode})")
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker processed {done} of {count} in {DEADLINE} s")
            time.sleep(0.05)
        return done

    def spans_read(self) -> list[dict[str, Any]]:
        text = self.spans.read_text() if self.spans.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line]


def worker_command(
    kind: str, queue: str, tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a ``dramatiq tests.dramatiq_worker`` on ``queue``
    (one process, two threads), its log ``worker.jsonl`` and spans ``spans.jsonl`` in
    ``tmp_path``, with ``env`` over them."""
    variables = {
        **os.environ,
        "DRAMATIQ_TEST_BROKER": kind,
        "DRAMATIQ_TEST_URL": URLS[kind],
        "DRAMATIQ_TEST_QUEUE": queue,
        "DRAMATIQ_TEST_LOG": str(tmp_path / "worker.jsonl"),
        "DRAMATIQ_TEST_SPANS": str(tmp_path / "spans.jsonl"),
        **(env or {}),
    }
    argv = [sys.executable, "-m", "dramatiq", "tests.dramatiq_worker"]
    argv += ["--processes", "1", "--threads", "2", "--queues", queue]
    return argv, variables


@contextmanager
def worker(
    kind: str, queue: str, tmp_path: Path, env: dict[str, str] | None = None
) -> Iterator[Worker]:
    """A real ``dramatiq tests.dramatiq_worker`` on ``queue`` (one process, two threads),
    in a session of its own, so that the whole group is stopped after: SIGTERM, then
    SIGKILL if it has not ended within 20 s."""
    argv, variables = worker_command(kind, queue, tmp_path, env)
    process = in_session(argv, cwd=ROOT, env=variables, output=tmp_path / "worker.out")
    try:
        yield Worker(process, tmp_path / "worker.jsonl", tmp_path / "spans.jsonl")
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    with contextlib.suppress(ProcessLookupError):  # a child that outlived the main process
        os.killpg(process.pid, signal.SIGKILL)
