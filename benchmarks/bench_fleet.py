"""Fleet: R replicas (processes) of ``cronjob run`` with J jobs against one PostgreSQL — the
cost model of issue #31, measured.

Run: ``python -m benchmarks.bench_fleet [--replicas 1,3,10] [--jobs 1000,10000,100000]
[--mix realistic,same-second] [--seconds 60] [--cells R:J:MIX,...] [--ready-cap 150]
[--warmup 8] [--grace 10] [--merge] [--data]``.

``--data``: the jobs are schedules made of data (``cronjob.schedules``) of one task the
replicas register, added with ``add_many`` before they start (issue #37).

Every (replicas, jobs, mix) of the grid is a cell, run in turn (``--cells`` lists cells
instead, e.g. ``1:100000:every-minute,10:100000:every-minute``). The mixes
(:mod:`benchmarks._mix`): ``realistic`` (70 % every minute, 20 % every 5 min, 8 % hourly,
2 % daily, spread over the seconds), ``every-minute`` (all every minute, spread over the
seconds), ``same-second`` (all every minute at second 0: the worst case; its window opens
on a whole minute, so ``--seconds 120`` holds two of its instants). How one cell is run
and measured: :mod:`benchmarks._fleet`; what is counted: :mod:`benchmarks._fleet_analysis`.

Per cell: start-up (jobs registered, replicas ready: apart from the window; a cell not
ready within ``--ready-cap`` s is given up and its row says so), rounds run, duplicates
(an instant run twice), misses (an instant due and not run), lateness (round start -
instant: p50, p99, max) and when each instant's last round started, the claims (their
time in the database, names listed, rows won, kilobytes of parameters per instant; the
replica's first claim of an instant, its *share*, apart from the later ones, the *rest*),
the statements each replica sent (counted client-side per kind: claim, check, renew,
finish, other; per second, per replica per instant, kilobytes per instant), the server's
transactions per second (``pg_stat_database.xact_commit``) and rows fetched per instant,
the server's CPU (every PostgreSQL process, from ``/proc``) over the window and per
1,000 rounds claimed, the replicas' CPU and memory. Prints a table, writes
``benchmarks/results/fleet.json`` (with ``--merge``, cells not run now are kept).

The database server is ``$CRONJOB_BENCH_POSTGRES_URL`` (default the local one, port
5432); a private server on another port keeps other work's CPU and transactions out of
the server's figures (docs/benchmarks.md says how).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from typing import Any

from benchmarks import _fleet, _harness, _mix, _table

COLUMNS = [
    ("R", "replicas"),
    ("J", "jobs"),
    ("mix", "variant"),
    ("added s", "schedules_added_s"),
    ("reg s", "startup.registered_s"),
    ("ready s", "startup.ready_s"),
    ("instants", "instants"),
    ("due max", "due_per_instant_max"),
    ("expected", "expected"),
    ("run", "rounds_run"),
    ("dup", "duplicates"),
    ("missed", "missed"),
    ("late p50 ms", "lateness_ms.p50"),
    ("late p99 ms", "lateness_ms.p99"),
    ("late max ms", "lateness_ms.max"),
    ("share claim p99 ms", "claims.share.seconds.p99"),
    ("rest claim p99 ms", "claims.rest.seconds.p99"),
    ("names listed/instant", "claims.all.names_per_instant"),
    ("stmts/s", "statements.per_s"),
    ("claim/s", "statements.per_s_by_kind.claim"),
    ("check/s", "statements.per_s_by_kind.check"),
    ("renew/s", "statements.per_s_by_kind.renew"),
    ("finish/s", "statements.per_s_by_kind.finish"),
    ("other/s", "statements.per_s_by_kind.other"),
    ("stmts/replica/instant", "statements.per_replica_instant"),
    ("claim KB/instant", "statements.kb_per_instant_by_kind.claim"),
    ("xact/s (server)", "server.xact_per_s"),
    ("lease rows read/instant seq/index", "server.lease_rows_read"),
    ("PG CPU %", "server.cpu_pct"),
    ("PG CPU ms/1000 claimed", "server.cpu_ms_per_1000_claimed"),
    ("replica CPU s", "replica_cpu_s"),
    ("RSS max MB", "rss_peak_lifetime_mb"),
    ("load", "loadavg_after"),
    ("error", "error"),
]


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def cells(args: argparse.Namespace) -> list[tuple[int, int, str]]:
    """The cells to run, in order: ``--cells`` if given, else the grid (jobs outermost,
    so the cheap cells come first and a long run shows its first numbers early)."""
    if args.cells:
        chosen = []
        for cell in args.cells.split(","):
            replicas, jobs, mix = cell.split(":")
            chosen.append((int(replicas), int(jobs), mix))
        return chosen
    mixes = args.mix.split(",")
    return [
        (replicas, jobs, mix)
        for jobs, mix, replicas in itertools.product(_ints(args.jobs), mixes, _ints(args.replicas))
    ]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--replicas", default="1,3,10")
    parser.add_argument("--jobs", default="1000,10000,100000")
    parser.add_argument("--mix", default="realistic,same-second", help=", ".join(_mix.MIXES))
    parser.add_argument("--cells", default="", help="R:J:MIX,... instead of the grid")
    parser.add_argument("--seconds", type=int, default=60, help="the window of each cell")
    parser.add_argument("--warmup", type=float, default=8.0, help="s between ready and window")
    parser.add_argument("--grace", type=float, default=10.0, help="s after the window")
    parser.add_argument("--ready-cap", type=float, default=150.0, help="give a cell up after")
    parser.add_argument("--log-level", default="WARNING", help="the replicas' log level")
    parser.add_argument("--merge", action="store_true", help="keep saved cells not run now")
    parser.add_argument(
        "--data", action="store_true", help="the jobs as schedules made of data of one task"
    )
    args = parser.parse_args(argv)
    for _replicas, _jobs, mix in cells(args):
        if mix not in _mix.MIXES:
            parser.error(f"unknown mix {mix!r}: one of {', '.join(_mix.MIXES)}")
    rows = []
    for replicas, jobs, mix in cells(args):
        began = time.time()
        print(f"== R={replicas} J={jobs} {mix}", flush=True)
        try:
            row = _fleet.run_cell(
                replicas=replicas,
                jobs=jobs,
                mix=mix,
                seconds=args.seconds,
                warmup=args.warmup,
                grace=args.grace,
                ready_cap=args.ready_cap,
                log_level=args.log_level,
                data=args.data,
            )
        except Exception as exc:  # one cell that fails is a row that says so
            row = {
                "implementation": "cronjob",
                "variant": mix,
                "mix": mix,
                "replicas": replicas,
                "jobs": jobs,
                "error": f"{type(exc).__name__}: {exc}",
            }
        row["cell_wall_s"] = round(time.time() - began, 1)
        rows.append(row)
        print(_table.render([row], COLUMNS), flush=True)
    print()
    print(_table.render(rows, COLUMNS))
    _harness.publish(
        "fleet",
        "fleet: R replicas, J jobs of a mix, one PostgreSQL (#31 cost model)",
        rows,
        merge=args.merge,
    )
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
