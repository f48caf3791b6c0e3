"""A fake day in a test: three replicas on one :class:`~cronjob.testing.FakeClock`.

Run: ``python -m benchmarks.bench_fakeday [--databases sqlite,postgres,mysql]
[--replicas 3] [--hours 24]``.

What a user's test pays to advance fake time: three replicas of an application with a
job every 15 minutes, an hourly one and a daily one, advanced a whole fake day, then a
DST weekend (Europe/Paris, the last weekend of March 2026) for a job at 02:30 local time.
Reports the real seconds each advance took, the rounds run and the lease statements
sent (counted on the engines). Writes ``benchmarks/results/fakeday.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

import cronjob
import lease
from benchmarks import _table
from benchmarks._rounds import RoundCounter
from cronjob.testing import FakeClock

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
RESULTS = Path(__file__).parent / "results" / "fakeday.json"

COLUMNS = [
    ("database", "database"),
    ("R", "replicas"),
    ("advance", "advance"),
    ("real s", "seconds"),
    ("rounds", "rounds"),
    ("statements", "statements"),
]


@contextmanager
def scratch(database: str) -> Iterator[str]:
    """A database of the benchmark's own: a new SQLite file, schema or database."""
    name = f"bench_fakeday_{uuid.uuid4().hex[:12]}"
    if database == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/fakeday.sqlite"
        return
    server = POSTGRES_URL if database == "postgres" else MYSQL_URL
    admin = sa.create_engine(server, poolclass=sa.pool.NullPool)
    create = f"CREATE SCHEMA {name}" if database == "postgres" else f"CREATE DATABASE {name}"
    drop = f"DROP SCHEMA {name} CASCADE" if database == "postgres" else f"DROP DATABASE {name}"
    with admin.begin() as conn:
        conn.execute(sa.text(create))
    try:
        url = sa.make_url(server)
        if database == "postgres":
            url = url.update_query_dict({"options": f"-csearch_path={name}"})
        else:
            url = url.set(database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(drop))
        admin.dispose()


def run(database: str, replicas: int, hours: int) -> list[dict[str, Any]]:
    counter = RoundCounter()
    job = counter.job
    registry = cronjob.Registry()
    registry.register(job, "0 */15 * * * *", "quarter")
    registry.register(job, "0 0 * * * *", "hourly")
    registry.register(job, "0 0 9 * * *", "daily")
    registry.register(job, "CRON_TZ=Europe/Paris 0 30 2 * * *", "night")
    statements = 0

    def count(*_args: Any) -> None:
        nonlocal statements
        statements += 1

    rows = []
    with scratch(database) as url:
        clock = FakeClock(datetime(2026, 3, 26, 0, 0, tzinfo=UTC))
        with ExitStack() as stack:
            for r in range(replicas):
                engine = lease.create_engine(url)
                event.listen(engine, "before_cursor_execute", count)
                stack.callback(engine.dispose)
                stack.enter_context(
                    cronjob.Scheduler(engine, registry=registry, clock=clock, replica_id=f"r{r}")
                )
            for label, target in (
                (f"{hours} h", clock.now() + timedelta(hours=hours)),
                ("DST weekend", datetime(2026, 3, 30, 0, 0, tzinfo=UTC)),
            ):
                before_rounds, before_statements = counter.rounds, statements
                started = time.perf_counter()
                clock.advance_to(target)
                rows.append(
                    {
                        "database": database,
                        "replicas": replicas,
                        "advance": label,
                        "seconds": round(time.perf_counter() - started, 2),
                        "rounds": counter.rounds - before_rounds,
                        "statements": statements - before_statements,
                    }
                )
                print(_table.render(rows[-1:], COLUMNS), flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--databases", default="sqlite,postgres,mysql")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--hours", type=int, default=24)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for database in args.databases.split(","):
        rows += run(database, args.replicas, args.hours)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "fake day", "when": datetime.now(UTC).isoformat(), "results": rows}
    RESULTS.write_text(json.dumps(report, indent=2))
    print(_table.render(rows, COLUMNS))
    print(f"written to {RESULTS}")
    return rows


if __name__ == "__main__":
    main()
