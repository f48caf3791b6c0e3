"""One APScheduler 3.x replica: ``$BENCH_JOBS`` cron jobs in a SQLAlchemyJobStore shared
by every replica (``$BENCH_DATABASE_URL``), until SIGTERM.

Configuration (the documented multi-process setup has none: APScheduler 3 does not
support sharing a job store between schedulers, so this is what users try):
BackgroundScheduler, SQLAlchemyJobStore on the shared PostgreSQL database, a
ThreadPoolExecutor of ``$BENCH_SLOTS`` threads (64 by default, as cronjob's), ``coalesce=True``,
``max_instances=1``, ``misfire_grace_time=30``, jobs added with ``replace_existing=True``
by every replica. Run with the peer's virtualenv interpreter from the repository root.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from datetime import UTC

from apscheduler.executors import pool as _pool
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from benchmarks.workers import _record

_original_run_job = _pool.run_job


def _run_job(job, jobstore_alias, run_times, logger_name):  # type: ignore[no-untyped-def]
    # The scheduled instant is not handed to the function: record it where the executor
    # starts the job, in the worker thread, just before the function is called.
    for run_time in run_times:
        _record.started(job.id, run_time.timestamp())
    return _original_run_job(job, jobstore_alias, run_times, logger_name)


_pool.run_job = _run_job


def work() -> None:
    _record.work()


def _trigger(spec: str):  # type: ignore[no-untyped-def]
    seconds = _record.every_seconds(spec)
    if seconds is not None:
        # Aligned to the epoch like cronjob's @every.
        from datetime import datetime

        return IntervalTrigger(seconds=seconds, start_date=datetime(1970, 1, 1, tzinfo=UTC))
    return CronTrigger(**_record.cron_fields(spec))


def main() -> None:
    scheduler = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(url=os.environ["BENCH_DATABASE_URL"])},
        executors={"default": ThreadPoolExecutor(_record.SLOTS)},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30},
        timezone="UTC",
    )
    trigger = _trigger(_record.SPEC)
    for name in _record.job_names():
        scheduler.add_job(work, trigger, id=name, name=name, replace_existing=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    scheduler.start()
    Path(os.environ["BENCH_OUT"] + ".ready").touch()
    stop.wait()
    _record.dump()  # before a shutdown that may outlast the harness's wait
    scheduler.shutdown(wait=True)


if __name__ == "__main__":
    main()
