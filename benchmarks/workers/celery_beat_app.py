"""The Celery app of ``bench_celery_beat``: one ``beat_schedule`` entry every second to
the task ``bench.tick`` on ``$BENCH_CELERY_QUEUE``, on the broker ``$BENCH_CELERY_BROKER``.
Both ``celery beat`` and ``cronjob beat -A benchmarks.workers.celery_beat_app`` read it."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery

app = Celery("bench_beat", broker=os.environ.get("BENCH_CELERY_BROKER", "memory://"))
app.conf.broker_connection_timeout = 5
app.conf.beat_schedule = {
    "tick": {
        "task": "bench.tick",
        "schedule": timedelta(seconds=1),
        "options": {"queue": os.environ.get("BENCH_CELERY_QUEUE", "celery")},
    },
}
