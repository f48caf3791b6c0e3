"""One DBOS Transact replica: ``$BENCH_JOBS`` workflow schedules in the DBOS system
database on the shared PostgreSQL database (``$BENCH_DATABASE_URL``), until SIGTERM.

Configuration: ``DBOS(config=...)`` with the system database on the benchmark database,
``executor_id`` the replica's label (distinct per replica), log level WARNING; one
workflow ``bench(scheduled_time, context)`` (the context is the job's name); a queue
``bench`` registered with ``worker_concurrency=$BENCH_SLOTS`` (the slots every scheduler
gets) and the default polling interval (1 s); ``$BENCH_JOBS`` schedules created by the
first replica with ``DBOS.apply_schedules`` (the harness starts it alone; the others
find them), each on queue ``bench``, cron in DBOS's syntax (seconds first, as cronjob).

DBOS 3.x has no ``@DBOS.scheduled`` decorator any more: schedules live in the database
(``create_schedule``/``apply_schedules``); every replica polls them and runs one thread
per schedule that sleeps to the next instant (plus a jitter of up to 10 % of the sleep,
at most 10 s), then enqueues the workflow with the id ``sched-NAME-INSTANT`` unless that
workflow exists — the id keeps replicas from running an instant twice. The queue's
workers then dequeue it at their next poll. DBOS talks to PostgreSQL through SQLAlchemy,
so :mod:`._record`'s listener counts its statements. Run with the peer's virtualenv
interpreter from the repository root.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dbos import DBOS, DBOSConfig

from benchmarks.workers import _record

QUEUE = "bench"


def cron(spec: str) -> str:
    """The benchmark's spec (cronjob syntax) in DBOS's (croniter, seconds first)."""
    if spec.startswith("@every "):
        seconds = int(spec.split()[1].rstrip("s"))
        return f"*/{seconds} * * * * *"
    return spec


@DBOS.workflow()
def bench(scheduled_time: datetime, context: Any) -> None:
    _record.started(str(context), scheduled_time.timestamp())
    _record.work()


def main() -> None:
    config: DBOSConfig = {
        "name": "bench",
        "system_database_url": os.environ["BENCH_DATABASE_URL"],
        "executor_id": _record.REPLICA,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=_record.SLOTS)
    if not DBOS.list_schedules():
        DBOS.apply_schedules(
            [
                {
                    "schedule_name": name,
                    "workflow_fn": bench,
                    "schedule": cron(_record.SPEC),
                    "context": name,
                    "queue_name": QUEUE,
                }
                for name in _record.job_names()
            ]
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    Path(os.environ["BENCH_OUT"] + ".ready").touch()
    stop.wait()
    _record.dump()  # before a shutdown that may outlast the harness's wait
    DBOS.destroy(workflow_completion_timeout_sec=5)


if __name__ == "__main__":
    main()
