"""A replica's memory with J jobs: where it goes at registration, at start and running.

Run: ``python -m benchmarks.bench_memory [--jobs 10000,100000] [--databases sqlite,postgres]
[--mix every-minute] [--seconds 10] [--trace 25]``.

Each cell (a database and a number of jobs) runs in a process of its own, so that its peak
(``VmHWM``) is its own: it registers the jobs of the fleet benchmark's mix
(:mod:`benchmarks._mix`, as ``benchmarks/workers/fleet_jobs.py`` does, one function for
every job), starts a :class:`cronjob.Scheduler` on a fresh database (a new SQLite file,
or a schema of its own on ``$CRONJOB_BENCH_POSTGRES_URL``'s server) with a
:class:`~cronjob.testing.FakeClock`, advances it ``--seconds`` fake seconds (every
instant's rounds run, as they would in a replica), and reads ``VmRSS`` and ``VmHWM``
(``/proc/self/status``) after the imports, after registration, after ``start()`` and after
the fake seconds. With ``--trace N`` the cell runs again under :mod:`tracemalloc`
(which costs memory of its own, so its RSS is not reported) and prints the N lines that
hold the most memory after registration and what start adds (by line, then by
traceback). Writes ``benchmarks/results/memory.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks import _harness, _table

COLUMNS = [
    ("database", "database"),
    ("J", "jobs"),
    ("mix", "mix"),
    ("imports MB", "rss_mb.imports"),
    ("registered MB", "rss_mb.registered"),
    ("started MB", "rss_mb.started"),
    ("peak at start MB", "hwm_mb.started"),
    ("ran MB", "rss_mb.ran"),
    ("peak MB", "hwm_mb.ran"),
    ("KB/job (started - imports)", "kb_per_job"),
    ("register s", "seconds.register"),
    ("start s", "seconds.start"),
    ("fake s", "fake_seconds"),
    ("rounds", "rounds"),
    ("run s", "seconds.run"),
]


def _status_mb(key: str) -> float:
    """``key`` (``VmRSS``, ``VmHWM``) of this process, in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


@contextmanager
def _database(database: str) -> Iterator[str]:
    """A database of the cell's own: a new SQLite file or a new PostgreSQL schema."""
    if database == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/memory.sqlite"
        return
    import sqlalchemy as sa

    name = f"bench_memory_{uuid.uuid4().hex[:12]}"
    server = sa.make_url(_harness.SERVER_URL).set(database="test")
    admin = sa.create_engine(server, poolclass=sa.pool.NullPool)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {name}"))
    try:
        url = server.update_query_dict({"options": f"-csearch_path={name}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {name} CASCADE"))
        admin.dispose()


def _top(snapshot: tracemalloc.Snapshot, base: tracemalloc.Snapshot | None, n: int) -> list[str]:
    """The ``n`` lines (then tracebacks) holding the most memory, or adding the most to
    ``base``."""
    lines = []
    for key in ("lineno", "traceback"):
        stats: list[Any] = (
            snapshot.compare_to(base, key) if base is not None else snapshot.statistics(key)
        )
        lines.append(f"-- by {key}")
        for stat in stats[: n if key == "lineno" else max(3, n // 5)]:
            size = getattr(stat, "size_diff", stat.size)
            count = getattr(stat, "count_diff", stat.count)
            if key == "lineno":
                frame = stat.traceback[0]
                lines.append(f"{size / 1024 / 1024:8.1f} MB {count:>9} blocks  {frame}")
            else:
                lines.append(f"{size / 1024 / 1024:8.1f} MB {count:>9} blocks")
                lines += [f"      {frame}" for frame in stat.traceback]
    return lines


def cell(database: str, jobs: int, mix: str, seconds: int, trace: int) -> dict[str, Any]:
    """Measure one cell in this process (see the module's docstring)."""
    import cronjob
    from benchmarks import _mix
    from cronjob.testing import FakeClock

    if trace:
        tracemalloc.start(8)
    rss = {"imports": _status_mb("VmRSS")}
    hwm = {"imports": _status_mb("VmHWM")}
    took: dict[str, float] = {}
    rounds = 0

    def job(ctx: cronjob.Round) -> None:
        nonlocal rounds
        rounds += 1  # the dispatcher posts ends one at a time; an int add is atomic enough

    started = time.perf_counter()
    registry = cronjob.Registry()
    for job_of_mix in _mix.mix(mix, jobs):
        registry.register(job, job_of_mix.spec, job_of_mix.name)
    took["register"] = time.perf_counter() - started
    gc.collect()
    rss["registered"], hwm["registered"] = _status_mb("VmRSS"), _status_mb("VmHWM")
    registered = tracemalloc.take_snapshot() if trace else None
    report: list[str] = []
    if registered is not None:
        report += ["== after registration", *_top(registered, None, trace)]
    with _database(database) as url:
        # Half a second before a minute: the first fake second holds the first instant.
        clock = FakeClock(datetime(2026, 1, 1, 0, 0, 59, 500_000, tzinfo=UTC), settle_timeout=3600)
        scheduler = cronjob.Scheduler(url, registry=registry, clock=clock, replica_id="memory")
        started = time.perf_counter()
        scheduler.start()
        # Start's statements (ensure, the read of the rows, the first sweep) run on the
        # control thread after start() returns: advance(0) waits until they are done.
        clock.advance(0)
        took["start"] = time.perf_counter() - started
        try:
            gc.collect()
            rss["started"], hwm["started"] = _status_mb("VmRSS"), _status_mb("VmHWM")
            if trace and registered is not None:
                report += [
                    "== what start added",
                    *_top(tracemalloc.take_snapshot(), registered, trace),
                ]
            started = time.perf_counter()
            if seconds:
                clock.advance_to(clock.now() + timedelta(seconds=seconds))
            took["run"] = time.perf_counter() - started
            gc.collect()
            rss["ran"], hwm["ran"] = _status_mb("VmRSS"), _status_mb("VmHWM")
            if trace and registered is not None:
                report += [
                    "== what running added",
                    *_top(tracemalloc.take_snapshot(), registered, trace),
                ]
        finally:
            scheduler.stop()
    return {
        "database": database,
        "jobs": jobs,
        "mix": mix,
        "fake_seconds": seconds,
        "rounds": rounds,
        "rss_mb": rss,
        "hwm_mb": hwm,
        "kb_per_job": round((rss["started"] - rss["imports"]) * 1024 / jobs, 2),
        "seconds": {key: round(value, 2) for key, value in took.items()},
        "tracemalloc": report,
    }


def _run_cell(database: str, jobs: int, mix: str, seconds: int, trace: int) -> dict[str, Any]:
    """Run one cell in a fresh process and return its row."""
    command = [sys.executable, "-m", "benchmarks.bench_memory", "--cell", database]
    command += ["--jobs", str(jobs), "--mix", mix, "--seconds", str(seconds)]
    command += ["--trace", str(trace)]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=_harness.ROOT, env=os.environ
    )
    if done.returncode != 0:
        return {"database": database, "jobs": jobs, "mix": mix, "error": done.stderr[-2000:]}
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", default="10000,100000")
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--mix", default="every-minute")
    parser.add_argument("--seconds", type=int, default=10, help="fake seconds run after start")
    parser.add_argument(
        "--trace", type=int, default=0, help="also print tracemalloc's top N (a second run)"
    )
    parser.add_argument("--cell", help=argparse.SUPPRESS)  # one cell, in this process
    args = parser.parse_args(argv)
    if args.cell:
        row = cell(args.cell, int(args.jobs), args.mix, args.seconds, args.trace)
        print(json.dumps(row))
        return [row]
    rows = []
    for database in args.databases.split(","):
        for jobs in map(int, args.jobs.split(",")):
            row = _run_cell(database, jobs, args.mix, args.seconds, 0)
            rows.append(row)
            print(_table.render([row], COLUMNS) if "error" not in row else row, flush=True)
            if args.trace:
                traced = _run_cell(database, jobs, args.mix, args.seconds, args.trace)
                print("\n".join(traced.get("tracemalloc") or [traced.get("error", "")]))
                row["tracemalloc"] = traced.get("tracemalloc")
    print()
    print(_table.render(rows, COLUMNS))
    _harness.publish("memory", "a replica's memory", rows)
    return rows


if __name__ == "__main__":
    main()
