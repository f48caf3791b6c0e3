"""What the stream tests share: a stream of each test's own, forged entries, real
``cronjob stream-worker`` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import redis

import cronjob
from cronjob.contrib import streams

ROOT = Path(__file__).resolve().parent.parent


def new_stream(client: redis.Redis) -> Iterator[str]:
    """A stream of a test's own; it, its dead stream and its dedup keys go after."""
    name = f"cronjob-test:{uuid.uuid4().hex[:12]}"
    yield name
    ids = [fields.get("occurrence_id", "") for _, fields in client.xrange(name)]
    client.delete(name, name + ":dead", *(streams.DEDUP_PREFIX + i for i in ids if i))


def fields(schedule: str, instant: datetime, *, app: str = "", **overrides: str) -> dict[str, str]:
    """A well-formed entry of ``schedule`` at ``instant``, with ``overrides``."""
    made = {
        "source": "cronjob.schedule",
        "app": app,
        "schedule": schedule,
        "occurrence_id": cronjob.occurrence_id(schedule, instant, app=app),
        "scheduled_at": instant.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "args": "{}",
    }
    made.update(overrides)
    return made


def lines(out: Path) -> list[dict[str, object]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines()]


def wait_for(check: Callable[[], bool], what: str, *, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        time.sleep(0.05)


class WorkerProcess:
    """A real ``cronjob stream-worker tests.stream_handlers`` process."""

    def __init__(
        self,
        redis_url: str,
        stream: str,
        db_url: str,
        out: Path,
        *,
        group: str = "workers",
        claim_idle: float = 1.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = out.with_name(f"{out.stem}-worker-{uuid.uuid4().hex[:8]}.log")
        command = [
            sys.executable,
            "-m",
            "cronjob",
            "stream-worker",
            "tests.stream_handlers",
            "--redis",
            redis_url,
            "--stream",
            stream,
            "--group",
            group,
            "--database-url",
            db_url,
            "--claim-idle",
            str(claim_idle),
        ]
        environ = {**os.environ, "CRONJOB_TEST_OUT": str(out), "PYTHONPATH": str(ROOT)}
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env={**environ, **(env or {})}, stdout=sink, stderr=sink
            )

    def output(self) -> str:
        return self.log.read_text()[-3000:]

    def terminate(self, within: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(within)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)
