"""Run every scenario and print its table: ``python -m benchmarks [--quick]``.

In order: schedule math (``bench_schedule``), lateness and correctness with the peers
interleaved (``bench_lateness``: 3 replicas, 20 then 200 jobs every second, each round
working 50 ms, 20 slots per replica for every scheduler), scale with the peers
interleaved (``bench_scale``: 10,000 jobs ``@every 10s`` on 1 replica, on 3, and on 3
with one killed mid-run), idle cost (``bench_idle``), a
fake day in a user's test (``bench_fakeday``), ``cronjob status`` over 10,000 jobs and a
million history rows (``bench_status``), the cost of metrics and of the status page
(``bench_metrics``).
Each also runs alone (``python -m benchmarks.bench_<name> --help``). Results go to
``benchmarks/results/*.json``; the peers' virtualenvs to ``benchmarks/.venvs/`` (created
on first use, from PyPI, pinned in ``benchmarks/peers/requirements.py``).

Flags: ``--quick`` (short windows: 15 s lateness, 20 s scale, 30 s idle; for a smoke
test, not for the numbers), ``--window S`` (the lateness and scale windows, default 60
and 40 s), ``--only NAME[,NAME]`` (schedule, lateness, scale, idle, fakeday, status,
metrics), ``--impl`` (schedulers for lateness, scale and idle; default all five).
"""

from __future__ import annotations

import argparse

from benchmarks import (
    _harness,
    bench_fakeday,
    bench_idle,
    bench_lateness,
    bench_metrics,
    bench_scale,
    bench_schedule,
    bench_status,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="schedule,lateness,scale,idle,fakeday,status,metrics")
    parser.add_argument("--impl", default=_harness.ALL)
    parser.add_argument("--window", type=int, default=None, help="lateness and scale, s")
    args = parser.parse_args()
    window = args.window or (15 if args.quick else None)
    only = set(args.only.split(","))
    if "schedule" in only:
        print("== schedule math ==", flush=True)
        bench_schedule.main()
    if "lateness" in only:
        print("\n== lateness and correctness ==", flush=True)
        bench_lateness.main(
            [
                *["--impl", args.impl, "--jobs", "20,200", "--job-ms", "50", "--slots", "20"],
                *(["--seconds", str(window)] if window else []),
            ]
        )
    if "scale" in only:
        print("\n== scale ==", flush=True)
        scale_window = args.window or (20 if args.quick else None)
        bench_scale.main(
            ["--impl", args.impl, *(["--seconds", str(scale_window)] if scale_window else [])]
        )
    if "idle" in only:
        print("\n== idle cost ==", flush=True)
        bench_idle.main(["--impl", args.impl, *(["--seconds", "30"] if args.quick else [])])
    if "fakeday" in only:
        print("\n== a fake day in a test ==", flush=True)
        bench_fakeday.main(["--hours", "6"] if args.quick else [])
    if "status" in only:
        print("\n== cronjob status over a full history ==", flush=True)
        bench_status.main(["--rounds", "100000", "--runs", "3"] if args.quick else [])
    if "metrics" in only:
        print("\n== metrics and the status page ==", flush=True)
        bench_metrics.main([])


if __name__ == "__main__":
    main()
