"""Real brokers and real ``celery worker`` processes for the Celery target's tests.

``broker_url`` is each broker in turn (ids ``rabbitmq``, ``redis``); an unreachable one
skips the test, except under CI (``CI=true``), where it fails it, as the databases do
(tests/conftest.py). Each test gets a queue of its own (``queue``), deleted after it,
so runs never see each other's messages; ``Worker`` runs ``celery worker`` on it with
``tests.celery_worker`` and reads what its task recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

ROOT = Path(__file__).resolve().parent.parent
RABBITMQ_URL = os.environ.get("CRONJOB_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("CRONJOB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
BROKERS = [
    pytest.param(RABBITMQ_URL, id="rabbitmq"),
    pytest.param(REDIS_URL, id="redis"),
]
#: How long a test waits for a worker to start and to record a task.
WAIT = 60.0

_unreachable: dict[str, str | None] = {}


def require_broker(url: str) -> None:
    """Skip (fail under CI) when the broker at ``url`` cannot be reached."""
    if url not in _unreachable:
        try:
            with Connection(url, connect_timeout=5) as conn:
                conn.ensure_connection(max_retries=0)
                conn.default_channel  # noqa: B018  (opens the channel: Redis connects here)
            _unreachable[url] = None
        except Exception as exc:
            _unreachable[url] = f"{type(exc).__name__}: {exc}"
    reason = _unreachable[url]
    if reason is not None:
        message = f"the broker at {url} is unreachable ({reason})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; under CI the brokers must run (.ci/run starts them)")
        pytest.skip(message)


def new_queue() -> str:
    return f"cronjob-test-{uuid.uuid4().hex[:12]}"


def delete_queue(url: str, queue: str) -> None:
    """Remove the test's queue (RabbitMQ) or list key (Redis)."""
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.default_channel
        with contextlib.suppress(Exception):  # never declared: nothing to remove
            channel.queue_delete(queue)


def client_app(url: str, **conf: Any) -> Celery:
    """A Celery app for the sending side (no tasks of its own: it sends by name)."""
    app = Celery(f"client-{uuid.uuid4().hex[:6]}", broker=url, set_as_current=False)
    app.conf.update(broker_connection_timeout=5, **conf)
    return app


@dataclass
class Worker:
    """A ``celery worker`` process consuming ``queue``; ``log`` gets its task's records."""

    process: subprocess.Popen[str]
    log: Path
    spans: Path
    output: Path

    def records(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def wait_for(self, count: int, timeout: float = WAIT) -> list[dict[str, Any]]:
        """The records once there are ``count`` (polling; fails after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.records()
            if len(found) >= count:
                return found
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"{len(self.records())} of {count} tasks recorded; worker said:\n"
            + self.output.read_text()[-3000:]
        )

    def span_records(self, count: int, timeout: float = WAIT) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.spans.exists():
                found = [json.loads(line) for line in self.spans.read_text().splitlines()]
                if len(found) >= count:
                    return found
            time.sleep(0.1)
        raise AssertionError(f"no {count} spans recorded:\n" + self.output.read_text()[-3000:])


def worker_argv(queue: str, node: str | None = None) -> list[str]:
    """The command of a ``celery worker`` on ``queue`` (one process: the solo pool), named
    ``node`` (by default the queue's name)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.celery_worker",
        "worker",
        "-Q",
        queue,
        "--pool=solo",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel=INFO",
        "-n",
        f"{node or queue}@%h",
    ]


def start_worker(url: str, queue: str, tmp_path: Path) -> Iterator[Worker]:
    """Run a worker on ``queue`` until the generator is closed, then kill it (SIGKILL):
    the test has read what it needs, and Celery's warm shutdown, or its cold one
    (SIGQUIT), took 5-10 s on RabbitMQ at each of the suite's workers."""
    log, spans, output = tmp_path / "tasks.jsonl", tmp_path / "spans.jsonl", tmp_path / "out"
    env = {
        **os.environ,
        "CELERY_TEST_BROKER": url,
        "CELERY_TEST_LOG": str(log),
        "CELERY_TEST_SPANS": str(spans),
    }
    with output.open("w") as sink:
        process = subprocess.Popen(
            worker_argv(queue),
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield Worker(process, log, spans, output)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(15)
