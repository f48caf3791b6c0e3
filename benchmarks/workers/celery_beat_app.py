"""The Celery app of ``bench_celery_beat`` and ``bench_beat_latency``: ``$BENCH_BEAT_ENTRIES``
``beat_schedule`` entries (1 by default, named ``tick``; else ``tick-0000`` ...) every
second to the task ``bench.tick`` on ``$BENCH_CELERY_QUEUE``, on the broker
``$BENCH_CELERY_BROKER``. ``celery beat``, RedBeat (``-S redbeat.RedBeatScheduler``, its
Redis at ``$BENCH_REDBEAT_URL`` under the key prefix ``$BENCH_REDBEAT_PREFIX``) and
``cronjob beat -A benchmarks.workers.celery_beat_app`` all read it.

For the latency of ``celery beat`` and RedBeat, whose messages carry no instant, each
message they send gets two headers, set here in the beat process (benchmark only):
``bench_due``, the epoch seconds at which the scheduler itself held the entry due (its
last run plus the period: the moment it should have sent it), and ``bench_entry``, the
entry's name. ``cronjob beat``'s messages carry ``cronjob_instant`` and ``cronjob_name``
already, and get nothing.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

from celery import Celery, beat
from celery.signals import before_task_publish

app = Celery("bench_beat", broker=os.environ.get("BENCH_CELERY_BROKER", "memory://"))
app.conf.broker_connection_timeout = 5
_queue = os.environ.get("BENCH_CELERY_QUEUE", "celery")
_count = int(os.environ.get("BENCH_BEAT_ENTRIES", "1"))
app.conf.beat_schedule = {
    ("tick" if _count == 1 else f"tick-{i:04d}"): {
        "task": "bench.tick",
        "schedule": timedelta(seconds=1),
        "options": {"queue": _queue},
    }
    for i in range(_count)
}
# RedBeat (celery-redbeat, the benchmark extra): its lock as in issue 47's run (25 s).
app.conf.redbeat_redis_url = os.environ.get("BENCH_REDBEAT_URL", "redis://127.0.0.1:6379/0")
app.conf.redbeat_key_prefix = os.environ.get("BENCH_REDBEAT_PREFIX", "redbeat")
app.conf.redbeat_lock_timeout = 25

_due = threading.local()
_apply_async = beat.Scheduler.apply_async


def _noting_due(self: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
    """Note the entry's due time (its last run + the period) before beat sends it."""
    last, every = entry.last_run_at, getattr(entry.schedule, "run_every", None)
    _due.value = (entry.name, (last + every).timestamp() if last and every else None)
    try:
        return _apply_async(self, entry, *args, **kwargs)
    finally:
        _due.value = None


beat.Scheduler.apply_async = _noting_due  # type: ignore[method-assign]


@before_task_publish.connect
def _stamp(headers: dict[str, Any] | None = None, **_: Any) -> None:
    noted = getattr(_due, "value", None)
    if noted is not None and headers is not None and noted[1] is not None:
        headers["bench_entry"], headers["bench_due"] = noted
