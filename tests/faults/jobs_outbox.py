"""A job for the outbox's fault scenarios: every 2 s, an RQ job on ``$OUTBOX_QUEUE``
through Redis at 127.0.0.1:``$OUTBOX_REDIS_PORT`` (a proxy the test can cut).

After each send it prints ``outbox-sent <id>`` on stderr and, with
``$OUTBOX_PAUSE_AFTER_SEND`` seconds, waits before the mark: the window in which a kill
leaves a message sent and its row unsent, made wide enough to hit."""

from __future__ import annotations

import os
import sys
import time

from redis import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import Queue

import cronjob
from cronjob.contrib import Handoff, Occurrence
from cronjob.contrib.rq import RQPublisher


class Announced(RQPublisher):
    def publish(self, occurrence: Occurrence) -> None:
        super().publish(occurrence)
        print(f"outbox-sent {occurrence.id}", file=sys.stderr, flush=True)
        pause = float(os.environ.get("OUTBOX_PAUSE_AFTER_SEND") or 0)
        if pause:
            time.sleep(pause)


# No retries of the client's own (redis-py retries three times, backing off): a send
# that fails must fail within the round's period, and the outbox retries it anyway.
_redis = Redis(
    port=int(os.environ["OUTBOX_REDIS_PORT"]),
    socket_timeout=1,
    socket_connect_timeout=1,
    retry=Retry(NoBackoff(), 0),
)
_queue = Queue(os.environ["OUTBOX_QUEUE"], connection=_redis)
cronjob.register(
    Handoff(
        Announced(_queue, "tests.rq_tasks.traced", args=("f",)),
        retry_within=1,
        hold=5,
        send_timeout=4,  # above the pause after the send: a kill comes before the mark
    ),
    "*/2 * * * * *",
    "outbox-fault",
)
