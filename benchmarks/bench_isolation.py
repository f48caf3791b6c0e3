"""The cost of ``isolation="process"`` per round: ``python -m benchmarks.bench_isolation``.

One replica on the system clock runs one job every second for ``--seconds`` seconds,
on a thread and then in a child process (forkserver on Linux), once a no-op and once a
job that opens one fenced ``ctx.transaction()``. Each round's duration is read back from
the history (``ended - started``: from the round's start on the replica to its end on
record, so a child's start-up, its imports, its connection and its exit are all in it).
Prints the median and 95th percentile per variant and writes
``benchmarks/results/isolation.json``. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cronjob
from benchmarks._harness import save_run
from benchmarks.workers import isolation_jobs
from cronjob import admin

#: The variants: (name, job function, isolation).
VARIANTS: tuple[tuple[str, Callable[[cronjob.Round], None], str], ...] = (
    ("no-op, thread", isolation_jobs.noop, "thread"),
    ("no-op, process", isolation_jobs.noop, "process"),
    ("one transaction, thread", isolation_jobs.one_transaction, "thread"),
    ("one transaction, process", isolation_jobs.one_transaction, "process"),
)


def _measure(
    url: str, name: str, fn: Callable[[cronjob.Round], None], isolation: str, seconds: float
) -> list[float]:
    registry = cronjob.Registry()
    registry.register(fn, "* * * * * *", name, isolation=isolation)  # type: ignore[arg-type]
    scheduler = cronjob.Scheduler(url, registry=registry, replica_id=f"bench-{name}")
    scheduler.start()
    try:
        time.sleep(seconds)
    finally:
        scheduler.stop()
    rows = admin.history(url, name, limit=10_000)
    return sorted(r.duration.total_seconds() * 1000 for r in rows[1:])  # the first warms up


def _percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="per variant")
    parser.add_argument("--database-url", default=None, help="default: a SQLite file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = args.database_url or f"sqlite:///{Path(folder) / 'bench.db'}"
        rows: list[dict[str, Any]] = []
        print(f"{'variant':<28} {'rounds':>6} {'median ms':>10} {'p95 ms':>8}")
        for index, (label, fn, isolation) in enumerate(VARIANTS):
            durations = _measure(url, f"bench-{index}", fn, isolation, args.seconds)
            row = {
                "variant": label,
                "rounds": len(durations),
                "median_ms": round(statistics.median(durations), 2),
                "p95_ms": round(_percentile(durations, 0.95), 2),
            }
            rows.append(row)
            print(f"{label:<28} {row['rounds']:>6} {row['median_ms']:>10} {row['p95_ms']:>8}")
        database = "sqlite" if args.database_url is None else url.split(":")[0]
        save_run("isolation", database=database, seconds=args.seconds, results=rows)


if __name__ == "__main__":
    main()
