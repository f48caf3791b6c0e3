"""Time ``Schedule.next()`` for common specs: ``python -m benchmarks.bench_schedule``.

Prints a table of the median microseconds per call and writes the same numbers to
``benchmarks/results/schedule.json``. Reported, never asserted: timings depend on the
machine, and a test that fails on a busy one teaches nothing.

Each spec is timed from many different starting instants spread over a few years (so
month ends, leap days and DST transitions are all in the mix), in batches; the median
of the per-batch means is reported, with ``prev()`` and ``parse()`` alongside.
"""

from __future__ import annotations

import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from benchmarks._harness import save
from cronjob import parse

#: The specs the schedule part is tuned for.
SPECS = (
    "0 * * * * *",
    "0 */5 * * * *",
    "0 30 9 * * 1-5",
    "@hourly",
    "@every 5m",
    "CRON_TZ=Europe/Berlin 0 30 9 * * 1-5",
    "CRON_TZ=America/New_York 0 */15 * * * *",
    "0 0 0 29 2 *",
)
#: How many starting instants each spec is timed from, and in how many batches.
STARTS = 2_000
BATCHES = 20


def _starts(seed: int = 2026) -> list[datetime]:
    rng = random.Random(seed)
    origin = datetime(2025, 1, 1, tzinfo=UTC)
    span = 4 * 365 * 86_400
    return [origin + timedelta(seconds=rng.randrange(span)) for _ in range(STARTS)]


def _median_microseconds(call: Callable[[datetime], object], starts: list[datetime]) -> float:
    size = len(starts) // BATCHES
    means = []
    for batch in range(BATCHES):
        chunk = starts[batch * size : (batch + 1) * size]
        began = time.perf_counter()
        for start in chunk:
            call(start)
        means.append((time.perf_counter() - began) / len(chunk) * 1e6)
    return statistics.median(means)


def _median_parse_microseconds(spec: str, rounds: int = 200) -> float:
    timings = []
    for _ in range(rounds):
        began = time.perf_counter()
        parse(spec)
        timings.append((time.perf_counter() - began) * 1e6)
    return statistics.median(timings)


def measure() -> list[dict[str, object]]:
    """Return one row per spec: median µs for next(), prev() and parse()."""
    starts = _starts()
    rows: list[dict[str, object]] = []
    for spec in SPECS:
        schedule = parse(spec)
        _median_microseconds(schedule.next, starts[:200])  # warm the zone caches
        rows.append(
            {
                "spec": spec,
                "next_us": round(_median_microseconds(schedule.next, starts), 2),
                "prev_us": round(_median_microseconds(schedule.prev, starts[:400]), 2),
                "parse_us": round(_median_parse_microseconds(spec), 2),
            }
        )
    return rows


def main() -> None:
    rows = measure()
    width = max(len(str(row["spec"])) for row in rows)
    print(f"{'spec':<{width}}  {'next µs':>8}  {'prev µs':>8}  {'parse µs':>9}")
    for row in rows:
        print(
            f"{row['spec']!s:<{width}}  {row['next_us']:>8}  {row['prev_us']:>8}  "
            f"{row['parse_us']:>9}"
        )
    report = {
        "benchmark": "Schedule.next / prev / parse, median microseconds per call",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "starts": STARTS,
        "batches": BATCHES,
        "results": rows,
    }
    print(f"written to {save('schedule', report)}")


if __name__ == "__main__":
    main()
