"""Idle cost: 1,000 hourly jobs x 3 replicas for 2 minutes, no instant due.

Run: ``python -m benchmarks.bench_idle [--jobs 1000] [--replicas 3] [--seconds 120]
[--impl cronjob,apscheduler3,apscheduler4,procrastinate,dbos]``.

The jobs run hourly at a minute chosen 30 minutes away from now, so no round falls in
the window: what is measured is what a scheduler costs the database (and the CPU) while
it waits. Statements per replica per minute (counted in each replica), pool checkouts,
CPU seconds. Prints a table, writes ``benchmarks/results/idle.json``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from benchmarks import _harness, _table

COLUMNS = [
    ("scheduler", "implementation"),
    ("R", "replicas"),
    ("J", "jobs"),
    ("window s", "seconds"),
    ("rounds", "rounds_total"),
    ("stmts", "statements"),
    ("stmts/replica/min", "statements_per_replica_per_minute"),
    ("checkouts", "pool_checkouts"),
    ("CPU s", "cpu_s"),
    ("RSS MB", "rss_max_mb"),
]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--impl", default=_harness.ALL)
    parser.add_argument(
        "--merge", action="store_true", help="keep the saved rows of schedulers not run now"
    )
    args = parser.parse_args(argv)
    rows = []
    for name in args.impl.split(","):
        minute = (datetime.now(UTC).minute + 30) % 60
        spec = f"0 {minute} * * * *"  # hourly, half an hour away from the window
        try:
            row = _harness.run_scenario(
                _harness.IMPLEMENTATIONS[name](),
                scenario="idle",
                replicas=args.replicas,
                jobs=args.jobs,
                spec=spec,
                period=None,
                seconds=args.seconds,
                warmup=10.0,
            )
        except Exception as exc:
            row = {
                "implementation": name,
                "replicas": args.replicas,
                "jobs": args.jobs,
                "error": f"{type(exc).__name__}: {exc}",
            }
        rows.append(row)
        print(_table.render([row], COLUMNS), flush=True)
    print()
    print(_table.render(rows, COLUMNS))
    _harness.publish("idle", "idle cost", rows, merge=args.merge)
    return rows


if __name__ == "__main__":
    main()
