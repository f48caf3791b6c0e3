"""Scale: 10,000 jobs ``@every 10s`` on R replicas (processes) for T seconds, one replica
killed (``kill -9``) in one of the runs.

Run: ``python -m benchmarks.bench_scale [--jobs 10000] [--seconds 40]
[--runs 1,3,3kill] [--kill-at 20.3] [--impl cronjob,...] [--ready-cap 90] [--server URL]``.

``--runs`` lists the runs, each a replica count, ``kill`` after it to kill the last
replica ``--kill-at`` seconds into the window (the window opens on an instant of the
jobs, so 20.3 is 0.3 s after the third instant: the killed replica is in the middle of
starting its rounds). Its rounds count from the start lines it streamed as they
happened. For each run every scheduler named runs in turn (interleaved). A peer that
is not ready to run ``--ready-cap`` seconds after its start (writing 10,000 schedules)
is given up, and its row says so.

The lateness scenario's figures, CPU µs per round (the replicas' CPU in the window over
the rounds started in it: the jobs do nothing, so this is the scheduler's own cost), the
highest resident memory, each replica's mean rounds per instant, and for a run with a
kill: the pairs missed before / at / after the kill's instant and each replica's rounds
per instant before and after it. Prints a table, writes ``benchmarks/results/scale.json``.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks import _harness, _table


def _runs(text: str) -> list[tuple[int, bool]]:
    return [(int(run.removesuffix("kill")), run.endswith("kill")) for run in text.split(",")]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--impl", default=_harness.ALL)
    parser.add_argument("--runs", default="1,3,3kill", help="replica counts; 'kill' kills one")
    parser.add_argument(
        "--kill-at", type=float, default=20.3, help="kill -9 the last replica this far in"
    )
    parser.add_argument(
        "--ready-cap", type=float, default=90.0, help="give a peer up if not ready by then"
    )
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
    rows = []
    for replicas, kill in _runs(args.runs):
        for name in args.impl.split(","):
            try:
                row = _harness.run_scenario(
                    _harness.IMPLEMENTATIONS[name](),
                    scenario="scale",
                    replicas=replicas,
                    jobs=args.jobs,
                    spec="@every 10s",
                    period=10,
                    seconds=args.seconds,
                    warmup=12.0,
                    grace=8.0,
                    kill_at=args.kill_at if kill else None,
                    ready_timeout=args.ready_cap,
                )
            except Exception as exc:  # a peer that cannot run here is reported, not fatal
                row = {
                    "implementation": name,
                    "replicas": replicas,
                    "jobs": args.jobs,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            row["variant"] = f"{replicas}{'kill' if kill else ''}"
            rows.append(row)
            print(_table.render([row], _table.SCALE_COLUMNS), flush=True)
    print()
    print(_table.render(rows, _table.SCALE_COLUMNS))
    _harness.publish(
        "scale-mariadb" if _harness.on_mariadb() else "scale",
        "scale: jobs @every 10s, one replica killed in one run",
        rows,
        merge=args.merge,
    )
    return rows


if __name__ == "__main__":
    main()
