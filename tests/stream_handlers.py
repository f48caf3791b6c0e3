"""The worker's side of the stream tests: a module ``cronjob stream-worker`` imports. It
registers the jobs the replicas would (their names are what entries are checked against)
and the handlers, which write what they saw to ``$CRONJOB_TEST_OUT``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import cronjob
from cronjob.contrib import streams


def _write(record: dict[str, object]) -> None:
    with open(os.environ["CRONJOB_TEST_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def _nothing(ctx: cronjob.Round) -> None:
    """What the replicas would run (they publish); the worker only reads the name."""


for _name in ("minutely", "flaky", "slow", "unhandled"):
    cronjob.register(_nothing, "0 * * * * *", _name)
cronjob.register_task(_nothing, "report")


@streams.handler("minutely")
def minutely(occ: streams.Occurrence) -> None:
    _write({"handler": "minutely", "id": occ.occurrence_id, "attempt": occ.attempt})


@streams.handler("report")
def report(occ: streams.Occurrence) -> None:
    _write({"handler": "report", "schedule": occ.schedule, "args": dict(occ.args)})


@streams.handler("flaky", retries=int(os.environ.get("STREAM_RETRIES", "1")))
def flaky(occ: streams.Occurrence) -> None:
    _write({"handler": "flaky", "id": occ.occurrence_id, "attempt": occ.attempt})
    raise RuntimeError("flaky failed")


@streams.handler("slow", timeout=float(os.environ.get("STREAM_TIMEOUT", "3")))
def slow(occ: streams.Occurrence) -> None:
    _write({"handler": "slow", "pid": os.getpid(), "attempt": occ.attempt, "at": "start"})
    time.sleep(float(os.environ.get("STREAM_SLEEP", "0")))
    marker = Path(os.environ["CRONJOB_TEST_OUT"]).with_suffix(".slept")
    marker.touch()
    _write({"handler": "slow", "pid": os.getpid(), "at": "end"})
