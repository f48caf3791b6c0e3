"""Status: ``cronjob.admin.status`` over 10,000 jobs and 1,000,000 history rows, PostgreSQL.

Run: ``python -m benchmarks.bench_status [--jobs 10000] [--rounds 1000000] [--runs 7]``.

Fills the benchmark database (dropped and made again) as replicas would have left it:
``--jobs`` lease rows with their spec (1,440 distinct daily specs) and state (one in
ten failing, one in a hundred running), ``--rounds`` history rows spread over the jobs
and the last 14 days, and ten replicas registering every job (seen "in an hour", so they
stay live through the runs).
Then times, over ``--runs`` runs each (the first call, which parses each spec once, then
the median and max of the runs after it): ``admin.status`` (every job and the live replicas), and
``admin.history`` of one job (its latest 50 rounds, and ``--failed``), and the pruning
statement of one replica's turn (on a copy of nothing to delete: the cost of looking).
Target: ``status`` under 1 s. Prints a table, writes ``benchmarks/results/status.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import lease
from benchmarks import _harness, _table
from cronjob import admin

#: 1,440 distinct daily specs (a minute and an hour per job): each is parsed once.
SPEC = "'0 ' || g % 60 || ' ' || (g / 60) % 24 || ' * * *'"

COLUMNS = [
    ("operation", "operation"),
    ("jobs", "jobs"),
    ("history rows", "rounds"),
    ("first call s", "first"),
    ("median s", "median"),
    ("max s", "max"),
    ("result", "result"),
]


def fill(engine: sa.Engine, jobs: int, rounds: int) -> None:
    """Write the rows with set-based SQL (generate_series): seconds, not minutes."""
    lease.migrate(engine)
    now_ms = int(time.time() * 1000)
    names = "'job-' || lpad(g::text, 5, '0')"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO cronjob_lease (name, instant, attempt, state, token, holder, "
                "expires_ms, spec, last_start_ms, last_end_ms, last_success_ms, last_outcome, "
                "last_error, failures) "
                f"SELECT {names}, :now / 1000 - 60, 1, "
                "CASE WHEN g % 100 = 0 THEN 'running' ELSE 'done' END, g, 'replica-' || g % 10, "
                f"CASE WHEN g % 100 = 0 THEN :now + 15000 END, {SPEC}, :now - 60000, "
                "CASE WHEN g % 100 <> 0 THEN :now - 59000 END, :now - 59000, "
                "CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'succeeded' END, "
                "CASE WHEN g % 10 = 0 THEN 'RuntimeError: upstream said 503' END, "
                "CASE WHEN g % 10 = 0 THEN 3 ELSE 0 END "
                "FROM generate_series(1, :jobs) AS g"
            ),
            {"now": now_ms, "jobs": jobs},
        )
        conn.execute(
            sa.text(
                "INSERT INTO cronjob_round (name, instant, attempt, holder, why, started_ms, "
                "ended_ms, outcome, error, trace_id) "
                "SELECT 'job-' || lpad((g % :jobs + 1)::text, 5, '0'), "
                ":now / 1000 - (:rounds - g) * 1209 / 1000, 1, 'replica-' || g % 10, "
                "'schedule', :now - (:rounds - g) * 1209, :now - (:rounds - g) * 1209 + 500, "
                "CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'succeeded' END, "
                "CASE WHEN g % 10 = 0 THEN 'RuntimeError: upstream said 503' END, "
                "md5(g::text) FROM generate_series(1, :rounds) AS g"
            ),
            {"now": now_ms, "jobs": jobs, "rounds": rounds},
        )
        jobs_json = (
            "'{' || string_agg('\"job-' || lpad(g::text, 5, '0') || "
            f"'\":{{\"spec\":\"' || {SPEC} || '\",\"leased\"\\:true}}', ',') || '}}'"
        )
        conn.execute(
            sa.text(
                "INSERT INTO cronjob_replica (holder, host, pid, version, started_ms, seen_ms, "
                "jobs) SELECT 'replica-' || r, 'host-' || r, 1000 + r, '0.1.0', :now - 3600000, "
                f":now + 3600000, (SELECT {jobs_json} FROM generate_series(1, :jobs) AS g) "
                "FROM generate_series(0, 9) AS r"
            ),
            {"now": now_ms, "jobs": jobs},
        )
        conn.execute(sa.text("ANALYZE cronjob_lease; ANALYZE cronjob_round"))


def timed(runs: int, operation: Callable[[], Any]) -> tuple[float, float, float, Any]:
    start = time.perf_counter()
    operation()  # the first call: specs parsed, connection opened, pages read
    first = time.perf_counter() - start
    times = []
    result = None
    for _ in range(runs):
        start = time.perf_counter()
        result = operation()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), max(times), result


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    _harness.reset_database()
    engine = lease.create_engine(_harness.bench_url())
    rows: list[dict[str, Any]] = []
    try:
        started = time.perf_counter()
        fill(engine, args.jobs, args.rounds)
        print(f"filled in {time.perf_counter() - started:.1f} s", flush=True)
        store = lease.LeaseStore(engine)

        def status() -> str:
            report = admin.status(engine)
            return f"{len(report.jobs)} jobs, {len(report.replicas)} replicas"

        def history() -> str:
            return f"{len(admin.history(engine, 'job-00042'))} rounds"

        def failed() -> str:
            return f"{len(admin.history(engine, 'job-00010', failed=True))} rounds"

        def prune() -> str:
            rounds, replicas = store.prune(days=14, per_name=1000, replicas_gone=86_400)
            return f"{rounds} rounds, {replicas} replicas deleted"

        for name, operation in (
            ("status", status),
            ("history (latest 50)", history),
            ("history --failed", failed),
            ("prune (nothing to delete)", prune),
        ):
            first, median, worst, result = timed(args.runs, operation)
            row = {
                "operation": name,
                "jobs": args.jobs,
                "rounds": args.rounds,
                "first": round(first, 4),
                "median": round(median, 4),
                "max": round(worst, 4),
                "result": result,
            }
            rows.append(row)
            print(_table.render([row], COLUMNS), flush=True)
    finally:
        engine.dispose()
    _harness.publish(
        "status", "admin.status and admin.history over a full history, PostgreSQL", rows
    )
    return rows


if __name__ == "__main__":
    main()
