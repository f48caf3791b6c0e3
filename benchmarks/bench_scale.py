"""Scale: 10,000 jobs ``@every 10s`` in one replica (process) for T seconds.

Run: ``python -m benchmarks.bench_scale [--jobs 10000] [--seconds 60] [--impl cronjob]
[--replicas 3] [--kill-at 30]``.

``--kill-at S`` kills the last replica (``kill -9``) S seconds into the window: its rounds
count from the start lines it streamed as they happened.

The lateness scenario's figures plus the replica's resident memory (max ``VmRSS``
sampled every half second in the window). Prints a table, writes
``benchmarks/results/scale.json``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from benchmarks import _harness, _table


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--impl", default="cronjob")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument(
        "--kill-at", type=float, default=None, help="kill -9 the last replica this far in"
    )
    args = parser.parse_args(argv)
    rows = []
    for name in args.impl.split(","):
        try:
            row = _harness.run_scenario(
                _harness.IMPLEMENTATIONS[name](),
                scenario="scale",
                replicas=args.replicas,
                jobs=args.jobs,
                spec="@every 10s",
                period=10,
                seconds=args.seconds,
                warmup=12.0,
                grace=8.0,
                kill_at=args.kill_at,
            )
            row["killed_at_s"] = args.kill_at
        except Exception as exc:
            row = {
                "implementation": name,
                "replicas": args.replicas,
                "jobs": args.jobs,
                "error": f"{type(exc).__name__}: {exc}",
            }
        rows.append(row)
        print(_table.render([row], _table.LATENESS_COLUMNS), flush=True)
    path = _harness.save(
        "scale",
        {
            "benchmark": "scale: jobs @every 10s in one replica",
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": _harness.machine(),
            "results": rows,
        },
    )
    print(f"written to {path}")
    return rows


if __name__ == "__main__":
    main()
