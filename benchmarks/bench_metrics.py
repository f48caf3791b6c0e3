"""What seeing costs: ``python -m benchmarks.bench_metrics``.

Two numbers, reported, never asserted:

- the metrics a round records (its start and its end), in microseconds, with no SDK
  (OpenTelemetry's global no-op provider, the default) and with the SDK and an
  in-memory reader;
- rendering the status page's front page for 10,000 jobs and 10 replicas, in
  milliseconds (HTML only: reading the database is ``bench_status``).

Results go to ``benchmarks/results/metrics.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from cronjob import __version__, admin
from cronjob._round import Outcome
from cronjob.admin import _page
from cronjob.engine._metrics import Meters

RESULTS = Path(__file__).parent / "results" / "metrics.json"
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def per_call(fn: Callable[[], object], number: int, repeat: int = 5) -> float:
    """The median seconds one call of ``fn`` takes, over ``repeat`` batches."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def round_metrics(provider: MeterProvider | None) -> float:
    job = Meters(provider, version=__version__).job("report")
    late = NOW + timedelta(milliseconds=3)

    def one_round() -> None:
        job.started(NOW, late, "schedule")
        job.ended(Outcome.SUCCEEDED, None, 1.5, given_up=False)

    return per_call(one_round, 20_000)


def big_status(jobs: int, replicas: int) -> admin.Status:
    return admin.Status(
        checked_at=NOW,
        jobs=tuple(
            admin.JobStatus(
                name=f"job-{i:05d}",
                spec="0 */5 * * * *",
                zone=None,
                per_instance=False,
                next_instant=NOW + timedelta(minutes=5),
                activity=admin.Activity.IDLE,
                running_on=None,
                running_since=None,
                instant=NOW,
                attempt=1,
                last_outcome=admin.Outcome.FAILED if i % 100 == 0 else admin.Outcome.SUCCEEDED,
                last_start=NOW,
                last_end=NOW + timedelta(seconds=2),
                last_duration=timedelta(seconds=2),
                last_success=NOW,
                last_error="RuntimeError: <b>no</b>" if i % 100 == 0 else None,
                consecutive_failures=1 if i % 100 == 0 else 0,
                skipped_through=None,
                specs_seen=(),
                problems=("failing: 1 round in a row failed",) if i % 100 == 0 else (),
            )
            for i in range(jobs)
        ),
        replicas=tuple(
            admin.ReplicaStatus(
                id=f"web-{r}",
                host="vm",
                pid=1000 + r,
                version=__version__,
                started=NOW,
                last_seen=NOW,
                jobs=tuple(f"job-{i:05d}" for i in range(jobs)),
            )
            for r in range(replicas)
        ),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args(argv)
    no_sdk = round_metrics(None)
    sdk = round_metrics(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    status = big_status(args.jobs, 10)
    page = _page.jobs_page(status, "/ops/cron")
    render = per_call(lambda: _page.jobs_page(status, "/ops/cron"), 1, repeat=5)
    rows = [
        ("metrics of one round, no SDK (default)", f"{no_sdk * 1e6:.1f} µs"),
        ("metrics of one round, SDK + in-memory reader", f"{sdk * 1e6:.1f} µs"),
        (f"front page, {args.jobs:,} jobs and 10 replicas", f"{render * 1e3:.0f} ms"),
        ("  its size", f"{len(page.encode()) / 1e6:.1f} MB"),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "python": platform.python_version(),
                "round_metrics_us": {"no_sdk": no_sdk * 1e6, "sdk_in_memory": sdk * 1e6},
                "front_page": {"jobs": args.jobs, "ms": render * 1e3, "bytes": len(page)},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
