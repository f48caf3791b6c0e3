"""Lateness and correctness: R replicas x J jobs firing every second for T seconds.

Run: ``python -m benchmarks.bench_lateness [--jobs 20,200] [--replicas 3] [--seconds 60]
[--impl cronjob,apscheduler3,apscheduler4,procrastinate,dbos] [--job-ms 50] [--slots 20]
[--server URL]``.

``--job-ms`` makes every round work (sleep) that long; ``--slots`` gives every scheduler
that many threads per replica. The last columns show how the rounds of each instant were
shared by the live replicas: each replica's mean rounds per instant, the lowest and
highest share of a replica in any instant, in % of the fair share, the instants run by
more than one replica, and those where every replica ran 80-120 % of its fair share.

For each J, every scheduler named runs the same work in turn (interleaved, so a change
in the machine's load hits them alike): rounds expected / run / duplicated / missed,
start lateness (start - scheduled instant) p50/p95/p99/max, CPU seconds of the replicas
in the window, SQL statements per round (counted in each replica, see
:mod:`benchmarks.workers._record`) and pool checkouts per round. Prints a table, writes
``benchmarks/results/lateness.json``.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks import _harness, _table


def measure(
    *,
    jobs: list[int],
    replicas: int,
    seconds: int,
    impls: list[str],
    warmup: float = 6.0,
    job_ms: float = 0.0,
    slots: int = 64,
) -> list[dict[str, Any]]:
    rows = []
    for count in jobs:
        for name in impls:
            try:
                impl = _harness.IMPLEMENTATIONS[name]()
                row = _harness.run_scenario(
                    impl,
                    scenario="lateness",
                    replicas=replicas,
                    jobs=count,
                    spec="* * * * * *",
                    period=1,
                    seconds=seconds,
                    warmup=warmup,
                    job_seconds=job_ms / 1000,
                    slots=slots,
                )
                row.update({"job_ms": job_ms, "slots": slots})
            except Exception as exc:  # a peer that cannot run here is reported, not fatal
                row = {
                    "implementation": name,
                    "replicas": replicas,
                    "jobs": count,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            rows.append(row)
            print(_table.render([row], _table.LATENESS_COLUMNS), flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", default="20,200")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--impl", default=_harness.ALL)
    parser.add_argument("--job-ms", type=float, default=0.0, help="each round works this long")
    parser.add_argument("--slots", type=int, default=64, help="threads per replica, for all")
    parser.add_argument(
        "--merge", action="store_true", help="keep the saved rows of schedulers not run now"
    )
    parser.add_argument(
        "--server",
        help="the database server's URL (default $CRONJOB_BENCH_POSTGRES_URL's);"
        " a MariaDB/MySQL one (mysql+pymysql://...) runs cronjob alone",
    )
    args = parser.parse_args(argv)
    if args.server:
        _harness.use_server(args.server)
    rows = measure(
        jobs=[int(j) for j in args.jobs.split(",")],
        replicas=args.replicas,
        seconds=args.seconds,
        impls=args.impl.split(","),
        job_ms=args.job_ms,
        slots=args.slots,
    )
    print()
    print(_table.render(rows, _table.LATENESS_COLUMNS))
    _harness.publish(
        "lateness-mariadb" if _harness.on_mariadb() else "lateness",
        "lateness and correctness",
        rows,
        merge=args.merge,
    )
    return rows


if __name__ == "__main__":
    main()
