"""One APScheduler 4 (pre-release) replica: ``$BENCH_JOBS`` schedules in a
SQLAlchemyDataStore shared by every replica, until SIGTERM.

Configuration: ``Scheduler`` (sync front end), role ``both`` (schedules and runs jobs),
``SQLAlchemyDataStore`` on an async SQLAlchemy engine (psycopg 3) on the shared
PostgreSQL database, ``PsycopgEventBroker`` (LISTEN/NOTIFY on the same database) so the
replicas wake each other, ``max_concurrent_jobs`` and the thread-pool executor's
``max_workers`` both ``$BENCH_SLOTS`` (as every scheduler's slots), schedules added by
every replica with ``ConflictPolicy.do_nothing``, ``CoalescePolicy.latest``,
``misfire_grace_time=30``. Run with the peer's virtualenv
interpreter from the repository root.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from apscheduler import CoalescePolicy, ConflictPolicy, Scheduler, current_job
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.psycopg import PsycopgEventBroker
from apscheduler.executors.thread import ThreadPoolJobExecutor
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks.workers import _record


def work(name: str) -> None:
    job = current_job.get()
    fire = job.scheduled_fire_time
    _record.started(name, fire.timestamp() if fire is not None else float("nan"))
    _record.work()


def _trigger(spec: str):  # type: ignore[no-untyped-def]
    seconds = _record.every_seconds(spec)
    if seconds is not None:
        return IntervalTrigger(seconds=seconds, start_time=datetime(1970, 1, 1, tzinfo=UTC))
    return CronTrigger(
        **_record.cron_fields(spec),
        # Fire on whole seconds: by default the fire times keep the start time's
        # fraction of a second (the schedule's creation time). Not a start time far in
        # the past either: the scheduler would then walk every fire time since.
        start_time=datetime.now(UTC).replace(microsecond=0),
    )


def main() -> None:
    engine = create_async_engine(os.environ["BENCH_DATABASE_URL"])
    store = SQLAlchemyDataStore(engine)
    broker = PsycopgEventBroker.from_async_sqla_engine(engine)
    scheduler = Scheduler(
        store,
        broker,
        identity=_record.REPLICA,
        max_concurrent_jobs=_record.SLOTS,
        job_executors={"threadpool": ThreadPoolJobExecutor(max_workers=_record.SLOTS)},
    )
    trigger = _trigger(_record.SPEC)
    stop = threading.Event()
    with scheduler:
        for name in _record.job_names():
            scheduler.add_schedule(
                work,
                trigger,
                id=name,
                args=(name,),
                conflict_policy=ConflictPolicy.do_nothing,
                coalesce=CoalescePolicy.latest,
                misfire_grace_time=30,
            )
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        scheduler.start_in_background()
        Path(os.environ["BENCH_OUT"] + ".ready").touch()
        stop.wait()
        _record.dump()  # before a shutdown that may outlast the harness's wait
        scheduler.stop()


if __name__ == "__main__":
    main()
