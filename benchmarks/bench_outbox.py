"""The outbox to RQ: publication latency (instant to Redis accepted) and the statements
each instant costs beyond a plain round.

Run: ``python -m benchmarks.bench_outbox [--database-url URL] [--redis-url URL]
[--per-minute 1000,10000] [--seconds 60]``.

One replica (``cronjob.Scheduler`` on the system clock) runs J jobs every 6 s (J x 10
instants a minute), each handing its instant to an RQ queue of the run's own through
``cronjob.contrib.rq.enqueue``. The latency of an instant is the wall time at which
``Queue.enqueue_call`` returned minus the instant. Then the same J jobs run a round that
does nothing, on a fresh schema, and the statements each instant costs are compared
(counted on the engine, every statement the replica sent). Prints a table, writes
``benchmarks/results/outbox.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from redis import Redis
from rq import Queue

import cronjob
import lease
from cronjob.contrib import Handoff, Occurrence
from cronjob.contrib.rq import RQPublisher

RESULTS = Path(__file__).resolve().parent / "results" / "outbox.json"
SPEC = "*/6 * * * * *"


class Timed(RQPublisher):
    """Notes when Redis accepted each occurrence, against its instant."""

    def __init__(self, *args: Any, latencies: list[float], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._latencies = latencies

    def publish(self, occurrence: Occurrence) -> None:
        super().publish(occurrence)
        accepted = datetime.now(UTC)
        self._latencies.append((accepted - occurrence.instant).total_seconds())


def _schema_url(base: str) -> tuple[str, str]:
    schema = f"bench_outbox_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(base)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    engine.dispose()
    url = sa.make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), schema


def _drop(base: str, schema: str) -> None:
    engine = sa.create_engine(base)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
    engine.dispose()


def _run(
    base: str, jobs: int, seconds: float, fn_of: Any, rounds: Callable[[], int]
) -> dict[str, Any]:
    """Run ``jobs`` jobs for ``seconds`` after a warm-up; the statements sent and the
    rounds (``rounds()``, a count the jobs keep) in that window."""
    url, schema = _schema_url(base)
    engine = lease.create_engine(url)
    count = [0]
    lock = threading.Lock()

    @sa.event.listens_for(engine, "before_cursor_execute")
    def counted(*_args: Any) -> None:
        with lock:
            count[0] += 1

    registry = cronjob.Registry()
    for i in range(jobs):
        registry.register(fn_of(i), SPEC, f"bench-{i}")
    scheduler = cronjob.Scheduler(engine, registry=registry, replica_id="bench")
    scheduler.start()
    time.sleep(8)  # start-up, the first instants
    with lock:
        start_count, start_rounds = count[0], rounds()
    time.sleep(seconds)
    with lock:
        statements, done = count[0] - start_count, rounds() - start_rounds
    scheduler.stop()
    engine.dispose()
    _drop(base, schema)
    return {"statements": statements, "rounds": done}


def _measure(database_url: str, redis_url: str, per_minute: int, seconds: float) -> dict[str, Any]:
    """One rate: the outbox's run, then the plain run, on fresh schemas."""
    jobs = per_minute // 10
    redis = Redis.from_url(redis_url)
    queue = Queue(f"bench-outbox-{uuid.uuid4().hex[:10]}", connection=redis)
    latencies: list[float] = []
    handoff = Handoff(Timed(queue, "benchmarks.nothing", latencies=latencies), retry_within=1)
    outbox = _run(database_url, jobs, seconds, lambda _i: handoff, latencies.__len__)
    queue.empty()
    redis.close()
    ran: list[int] = []
    plain = _run(database_url, jobs, seconds, lambda _i: lambda _ctx: ran.append(1), ran.__len__)
    ordered = sorted(latencies)

    def p(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

    per_outbox = outbox["statements"] / max(1, outbox["rounds"])
    per_plain = plain["statements"] / max(1, plain["rounds"])
    return {
        "per_minute": per_minute,
        "jobs": jobs,
        "published": len(ordered),
        "p50_ms": p(0.5),
        "p99_ms": p(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 1) if ordered else None,
        "statements_per_instant_outbox": round(per_outbox, 2),
        "statements_per_instant_plain": round(per_plain, 2),
        "extra_statements_per_instant": round(per_outbox - per_plain, 2),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--per-minute", default="1000,10000")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    rows = [
        _measure(args.database_url, args.redis_url, int(n), args.seconds)
        for n in args.per_minute.split(",")
    ]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    header = list(rows[0])
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[k]) for k in header))
    return rows


if __name__ == "__main__":
    main()
