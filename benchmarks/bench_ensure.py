"""Start-up's ``LeaseStore.ensure`` at scale (issue #31): reported, not asserted.

Run: ``python -m benchmarks.bench_ensure [--jobs 100000] [--specs 60] [--db postgres]
[--replicas R]``.

One store on the database's own clock ensures ``--jobs`` names with a spec and a due each,
as a replica's start-up does (``engine/_recovery.py``): on an empty table (*first*), then
again with nothing changed (*second*: what every replica of a fleet but the first does at
start), then with one spec changed and one due lowered (*changed*). For each run: its
wall time, the statements sent (``before_cursor_execute``, ``BEGIN`` excluded; an
``executemany`` is one), the parameter sets they carried, and on PostgreSQL the rows the
server inserted and updated (each row's ``xmin`` before and after the run). With
``--replicas R``, a run after *second* (*fleet*): R processes each ensure every name at once, as R
replicas starting together where the rows are on record (its time is the slowest
replica's, a replica's error is printed; no statement counts).

A scratch schema / database, dropped afterwards. Results go to stdout and to
``benchmarks/results/ensure.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

import lease
from benchmarks._harness import save_run
from benchmarks.bench_lease import DATABASES

START = datetime(2026, 1, 1, tzinfo=UTC)


def _versions(engine: sa.Engine | None) -> dict[str, str] | None:
    """Each lease row's version (PostgreSQL's ``xmin``: the transaction that wrote it
    last), by name; ``None`` elsewhere. On an engine of its own, so the store's
    connections keep their session's settings."""
    if engine is None:
        return None
    with engine.begin() as conn:
        return dict(conn.execute(sa.text("SELECT name, xmin::text FROM cronjob_lease")).all())


def _run(engine: sa.Engine, stats: sa.Engine | None, ensure: Callable[[], None]) -> dict[str, Any]:
    sent: list[int] = []

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if not statement.startswith("BEGIN"):
            many = isinstance(parameters, list | tuple) and parameters and not _scalar(parameters)
            sent.append(len(parameters) if many else 1)

    rows_before = _versions(stats)
    event.listen(engine, "before_cursor_execute", before)
    try:
        began = time.perf_counter()
        ensure()
        seconds = time.perf_counter() - began
    finally:
        event.remove(engine, "before_cursor_execute", before)
    result: dict[str, Any] = {
        "seconds": round(seconds, 3),
        "statements": len(sent),
        "parameter_sets": sum(sent),
    }
    rows_after = _versions(stats)
    if rows_before is not None and rows_after is not None:
        result["rows_inserted"] = len(rows_after.keys() - rows_before.keys())
        result["rows_updated"] = sum(
            1 for name, version in rows_before.items() if rows_after.get(name) != version
        )
    return result


def _scalar(parameters: Any) -> bool:
    """Whether ``parameters`` are one statement's positional values, not a batch of sets."""
    return not isinstance(parameters[0], Mapping | list | tuple)


def _jobs(jobs: int, specs: int) -> tuple[list[str], dict[str, str], dict[str, datetime]]:
    names = [f"job-{i}" for i in range(jobs)]
    spec_of = {name: f"{i % specs} * * * * *" for i, name in enumerate(names)}
    due = {name: START + timedelta(seconds=i % specs) for i, name in enumerate(names)}
    return names, spec_of, due


def _replica(url: str, jobs: int, specs: int, start: Any) -> tuple[float, str | None]:
    """One replica's start-up ensure, once every replica is ready: its seconds, and the
    error it ended with (``None`` when it succeeded)."""
    names, spec_of, due = _jobs(jobs, specs)
    engine = lease.create_engine(url)
    try:
        store = lease.LeaseStore(engine)
        start.wait()
        began = time.perf_counter()
        try:
            store.ensure(names, specs=spec_of, due=due)
        except lease.LeaseError as exc:
            return time.perf_counter() - began, f"{type(exc).__name__}: {exc}"[:200]
        return time.perf_counter() - began, None
    finally:
        engine.dispose()


def _fleet(url: str, stats: sa.Engine | None, jobs: int, specs: int, replicas: int) -> Any:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(replicas)
        before = _versions(stats)
        with context.Pool(replicas) as pool:
            ends = pool.starmap(_replica, [(url, jobs, specs, start)] * replicas)
        after = _versions(stats)
    result: dict[str, Any] = {
        "seconds": round(max(seconds for seconds, _ in ends), 3),
        "replicas": replicas,
        "failed": [error for _, error in ends if error is not None],
    }
    if before is not None and after is not None:
        result["rows_updated"] = sum(1 for name, v in before.items() if after.get(name) != v)
    return result


def bench(url: str, *, jobs: int, specs: int, replicas: int) -> dict[str, dict[str, Any]]:
    engine = lease.create_engine(url)
    stats = sa.create_engine(url) if engine.dialect.name == "postgresql" else None
    try:
        lease.migrate(engine)
        store = lease.LeaseStore(engine)
        names, spec_of, due = _jobs(jobs, specs)
        results = {
            "first": _run(engine, stats, lambda: store.ensure(names, specs=spec_of, due=due)),
            "second": _run(engine, stats, lambda: store.ensure(names, specs=spec_of, due=due)),
        }
        if replicas:
            results["fleet"] = _fleet(url, stats, jobs, specs, replicas)
        spec_of[names[0]] = "*/5 * * * * *"
        due[names[1]] = START - timedelta(hours=1)
        results["changed"] = _run(
            engine, stats, lambda: store.ensure(names, specs=spec_of, due=due)
        )
        return results
    finally:
        engine.dispose()
        if stats is not None:
            stats.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--specs", type=int, default=60, help="distinct specs among the jobs")
    parser.add_argument("--db", default="postgres", help="sqlite, postgres, mysql (comma list)")
    parser.add_argument("--replicas", type=int, default=0, help="a last run of R processes")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    for name in args.db.split(","):
        with DATABASES[name]() as url:
            results[name] = bench(url, jobs=args.jobs, specs=args.specs, replicas=args.replicas)
    print(f"{'database':<10} {'run':<8} {'s':>8} {'stmts':>6} {'params':>8} {'ins':>8} {'upd':>8}")
    for name, runs in results.items():
        for run, r in runs.items():
            for error in r.get("failed", []):
                print(f"{name:<10} {run:<8} a replica failed: {error}")
            print(
                f"{name:<10} {run:<8} {r['seconds']:>8.2f} {r.get('statements', '-'):>6} "
                f"{r.get('parameter_sets', '-'):>8} {r.get('rows_inserted', '-'):>8} "
                f"{r.get('rows_updated', '-'):>8}"
            )
    save_run("ensure", jobs=args.jobs, results=results)


if __name__ == "__main__":
    main()
