"""A task for the real-process tests of schedules made of data (``cronjob run
tests.schedule_tasks``): each round appends one JSON line to ``$SCHEDULE_LOG`` with the
schedule's id, instant, attempt, args, the replica (and its pid) and the wall time it
started."""

from __future__ import annotations

import json
import os
import time

import cronjob


@cronjob.task(name="report")
def report(ctx: cronjob.Round) -> None:
    line = {
        "id": ctx.name,
        "instant": ctx.instant.timestamp(),
        "args": ctx.args,
        "attempt": ctx.attempt,
        "replica": ctx.replica,
        "pid": os.getpid(),
        "t": time.time(),
    }
    fd = os.open(os.environ["SCHEDULE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
