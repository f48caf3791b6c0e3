"""One procrastinate replica: ``$BENCH_JOBS`` periodic tasks on the shared PostgreSQL
database (``$BENCH_DATABASE_URL``, a libpq URL), until SIGTERM.

Configuration: ``App`` with a ``PsycopgConnector`` (psycopg 3's async pool, default
sizes); one task, registered ``$BENCH_JOBS`` times with ``app.periodic(cron=...,
periodic_id=NAME)`` (the job name is a task argument; procrastinate passes the scheduled
instant as the ``timestamp`` argument); the cron in croniter's syntax, seconds as the 6th
field. Every replica runs ``app.run_worker_async`` with ``concurrency=$BENCH_SLOTS`` and
the default LISTEN/NOTIFY wake-up, so every replica also runs the periodic deferrer: the
database's unique ``(task, periodic_id, timestamp)`` keeps the replicas from deferring
an instant twice. The task is synchronous: procrastinate runs it through asgiref's
``sync_to_async`` on the event loop's default executor, set here to ``$BENCH_SLOTS``
threads. The first replica applies procrastinate's schema (the harness starts it alone).

procrastinate does not use SQLAlchemy: statements are counted by wrapping psycopg's
``AsyncCursor.execute``, checkouts by wrapping ``AsyncConnectionPool.getconn``.
Run with the peer's virtualenv interpreter from the repository root.
"""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import procrastinate
import psycopg
import psycopg_pool

from benchmarks.workers import _record

_execute = psycopg.AsyncCursor.execute
_getconn = psycopg_pool.AsyncConnectionPool.getconn


async def _counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
    _record.statement(query.decode() if isinstance(query, bytes) else str(query))
    return await _execute(self, query, *args, **kwargs)


async def _counted_getconn(self: Any, *args: Any, **kwargs: Any) -> Any:
    _record.checkout()
    return await _getconn(self, *args, **kwargs)


psycopg.AsyncCursor.execute = _counted_execute  # type: ignore[method-assign]
psycopg_pool.AsyncConnectionPool.getconn = _counted_getconn  # type: ignore[method-assign]


def cron(spec: str) -> str:
    """The benchmark's spec (cronjob syntax, seconds first) in procrastinate's (croniter,
    seconds last)."""
    if spec.startswith("@every "):
        seconds = int(spec.split()[1].rstrip("s"))
        return f"* * * * * */{seconds}"
    second, minute, hour, day, month, dow = spec.split()
    return f"{minute} {hour} {day} {month} {dow} {second}"


app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_DATABASE_URL"])
)


@app.task(name="bench")
def bench(timestamp: int, name: str) -> None:
    _record.started(name, float(timestamp))
    _record.work()


for _name in _record.job_names():
    app.periodic(cron=cron(_record.SPEC), periodic_id=_name, task_kwargs={"name": _name})(bench)


async def main() -> None:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(_record.SLOTS))
    async with app.open_async():
        present = await app.connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS present"
        )
        if not present["present"]:
            await app.schema_manager.apply_schema_async()
        Path(os.environ["BENCH_OUT"] + ".ready").touch()
        # SIGTERM and SIGINT stop the worker (procrastinate's own handlers); it waits
        # for the running jobs, then returns.
        await app.run_worker_async(concurrency=_record.SLOTS)


if __name__ == "__main__":
    asyncio.run(main())
