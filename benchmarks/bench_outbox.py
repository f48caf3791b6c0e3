"""The outbox to each task queue: publication latency (instant to the broker's accept or
confirm), where a round's time goes, and the statements each instant costs beyond a plain
round.

Run: ``python -m benchmarks.bench_outbox [--database-url URL] [--redis-url URL]
[--amqp-url URL] [--targets rq,celery-amqp,celery-redis,dramatiq-amqp,stream]
[--per-minute 1000,10000] [--seconds 42] [--repeat 1] [--no-plain] [--max-workers N]
[--pool-size N] [--experiment no-ping,batch-marks]``.

One replica (``cronjob.Scheduler`` on the system clock) runs J jobs every 6 s (J x 10
instants a minute), each handing its instant to a queue of the run's own through the
target's publisher (``cronjob.contrib.rq.RQPublisher``, ``...celery.CeleryPublisher``
with publisher confirms on RabbitMQ, ``...dramatiq.DramatiqPublisher`` on a
``RabbitmqBroker(confirm_delivery=True)``, ``...streams.StreamPublisher``'s
publish-if-new script on a Redis Stream). After a warm-up, a window of whole instants
(``--seconds``, rounded down to 6 s) opens on an instant; every instant of the window is
expected. The latency of an instant is the wall time at which its publish returned (the
broker accepted it: Redis answered, RabbitMQ confirmed) minus the instant. Each round is
split into wait (instant to the round's start), record (the fenced transaction that
writes the outbox row), send (the publish) and mark (the transaction that marks it
sent). Then (unless ``--no-plain``) the same J jobs run a round that does nothing, on a
fresh schema, and the statements, pool checkouts (each a ``pool_pre_ping`` round trip)
and commits each instant costs are compared (counted on the engine, everything the
replica sent in the window). Each row has the load average at the window's start and end
and the process's CPU in the window. Prints a table, writes
``benchmarks/results/outbox.json`` (appending to the rows already there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import cronjob
import lease
from benchmarks._outbox_experiments import EXPERIMENTS, batched_marks, engine_options
from benchmarks._outbox_targets import TARGETS, Timed, TimedHandoff, fresh_database, target
from benchmarks.profile_handoff import _thread_cpu

RESULTS = Path(__file__).resolve().parent / "results" / "outbox.json"
SPEC = "*/6 * * * * *"
PERIOD = 6
WARM_UP = 8.0
#: Seconds after the window's end the run waits for the window's late publications.
GRACE = 15.0
#: What starts the line on stderr that says the window opened (then its start and end).
WINDOW = "bench_outbox window"


class Plain:
    """The round that does nothing but note when it began and ended."""

    def __init__(self) -> None:
        self.rounds: dict[str, tuple[float, float, float]] = {}  # id: (instant, began, end)

    def __call__(self, ctx: cronjob.Round) -> None:
        began = time.time()
        self.rounds[ctx.occurrence_id] = (ctx.instant.timestamp(), began, time.time())


class Counts:
    """Statements, pool checkouts and commits an engine sent (thread-safe)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.values = {"statements": 0, "checkouts": 0, "commits": 0}
        self._lock = threading.Lock()
        sa.event.listen(engine, "before_cursor_execute", lambda *_a: self._add("statements"))
        sa.event.listen(engine, "commit", lambda *_a: self._add("commits"))
        sa.event.listen(engine.pool, "checkout", lambda *_a: self._add("checkouts"))

    def _add(self, key: str) -> None:
        with self._lock:
            self.values[key] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.values)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _run(
    database_url: str,
    jobs: int,
    seconds: float,
    fn: Callable[[Any], None],
    max_workers: int | None,
    pool_size: int | None,
    experiments: list[str],
) -> dict[str, Any]:
    """Run ``jobs`` jobs of ``fn`` through a window of whole instants after a warm-up;
    what the engine sent in the window, the window, the CPU and the load."""
    url, drop = fresh_database(database_url)
    pool = {} if pool_size is None else {"pool_size": pool_size, "max_overflow": 0}
    engine = lease.create_engine(url, **pool, **engine_options(experiments))
    counts = Counts(engine)
    registry = cronjob.Registry()
    for i in range(jobs):
        registry.register(fn, SPEC, f"bench-{i}")
    options: dict[str, Any] = {} if max_workers is None else {"max_workers": max_workers}
    scheduler = cronjob.Scheduler(engine, registry=registry, replica_id="bench", **options)
    marks = contextlib.ExitStack()
    try:
        marks.enter_context(batched_marks(experiments))
        scheduler.start()
        ready = time.time() + WARM_UP
        start = (int(ready) // PERIOD + 1) * PERIOD
        end = start + int(seconds) // PERIOD * PERIOD
        time.sleep(max(0.0, start - time.time()))
        before, cpu0, threads0 = counts.snapshot(), time.process_time(), _thread_cpu()
        load0 = os.getloadavg()
        print(WINDOW, start, end, file=sys.stderr, flush=True)
        time.sleep(max(0.0, end - time.time()))
        after, cpu1, threads1 = counts.snapshot(), time.process_time(), _thread_cpu()
        load1 = os.getloadavg()
        time.sleep(GRACE)  # the window's late publications
    finally:
        scheduler.stop()
        marks.close()
        with engine.connect() as conn:  # sends refused and retried, rows left unsent
            retried = conn.execute(
                sa.text(
                    "SELECT COUNT(*), COALESCE(SUM(tries), 0) FROM cronjob_outbox WHERE tries > 0"
                )
            ).one()
            unsent = conn.execute(
                sa.text("SELECT COUNT(*) FROM cronjob_outbox WHERE sent_ms IS NULL")
            ).scalar()
        engine.dispose()
        drop()
    return {
        "start": start,
        "end": end,
        "sent": {k: after[k] - before[k] for k in after},
        "cpu_s": round(cpu1 - cpu0, 2),
        "threads_cpu_s": {
            k: round(v - threads0.get(k, 0.0), 2) for k, v in sorted(threads1.items())
        },
        "load": [round(x, 2) for x in (*load0, *load1)],
        "outbox_retried_rows": int(retried[0]),
        "outbox_failed_tries": int(retried[1]),
        "outbox_unsent_rows": int(unsent or 0),
    }


def _phases(
    run: dict[str, Any],
    jobs: int,
    rounds: dict[str, tuple[float, float, float]],
    sends: dict[str, tuple[float, float, float]] | None,
) -> dict[str, Any]:
    """The window's instants: how many ran and were sent, the latency and each phase
    (``rounds`` and ``sends`` by occurrence id: (instant, began, ended or accepted))."""
    start, end = run["start"], run["end"]
    ran = [i for i, r in rounds.items() if start <= r[0] < end]
    instants = {i: rounds[i][0] for i in ran}
    ended_in_window = sum(1 for _, _, e in rounds.values() if start <= e < end)
    expected = jobs * (end - start) // PERIOD
    row: dict[str, Any] = {
        "expected": expected,
        "rounds": len(ran),
        "not_run": expected - len(ran),
        "wait_p10_s": _pct([rounds[i][1] - instants[i] for i in ran], 0.1),
        "wait_p50_s": _pct([rounds[i][1] - instants[i] for i in ran], 0.5),
        "wait_p99_s": _pct([rounds[i][1] - instants[i] for i in ran], 0.99),
        "rounds_ended_in_window": ended_in_window,
    }
    sent = run["sent"]
    for key in ("statements", "checkouts", "commits"):
        row[f"{key}_per_round"] = round(sent[key] / max(1, ended_in_window), 2)
    if sends is not None:
        done = [i for i in ran if i in sends]
        latency = [sends[i][2] - instants[i] for i in done]
        record = [sends[i][1] - rounds[i][1] for i in done]
        send = [sends[i][2] - sends[i][1] for i in done]
        mark = [rounds[i][2] - sends[i][2] for i in done]
        row |= {
            "published": len(done),
            "published_per_min": round(len(done) * 60 / (end - start)),
            "p50_s": _pct(latency, 0.5),
            "p99_s": _pct(latency, 0.99),
            "record_p50_s": _pct(record, 0.5),
            "record_p99_s": _pct(record, 0.99),
            "send_p50_s": _pct(send, 0.5),
            "send_p99_s": _pct(send, 0.99),
            "mark_p50_s": _pct(mark, 0.5),
            "mark_p99_s": _pct(mark, 0.99),
        }
    return row


def measure(
    name: str, args: argparse.Namespace, per_minute: int, database_url: str
) -> dict[str, Any]:
    """One cell: ``name`` (a target, or ``plain``) at ``per_minute`` on ``database_url``."""
    jobs = per_minute // 10
    if name == "plain":
        plain = Plain()
        run = _run(
            database_url,
            jobs,
            args.seconds,
            plain,
            args.max_workers,
            args.pool_size,
            args.experiments,
        )
        row = _phases(run, jobs, plain.rounds, None)
    else:
        made = target(name, redis_url=args.redis_url, amqp_url=args.amqp_url)
        timed = Timed(made.publisher)
        fn = TimedHandoff(timed, retry_within=1)
        try:
            run = _run(
                database_url,
                jobs,
                args.seconds,
                fn,
                args.max_workers,
                args.pool_size,
                args.experiments,
            )
        finally:
            made.cleanup()
        row = _phases(run, jobs, fn.rounds, timed.sends)
    return {
        "target": name,
        "database": sa.make_url(database_url).get_backend_name(),
        "per_minute": per_minute,
        "jobs": jobs,
        "max_workers": args.max_workers or 64,
        "pool_size": args.pool_size or "5+10",
        "experiments": args.experiments,
        **row,
        "window_s": run["end"] - run["start"],
        "cpu_s": run["cpu_s"],
        "threads_cpu_s": run["threads_cpu_s"],
        "outbox_retried_rows": run["outbox_retried_rows"],
        "outbox_failed_tries": run["outbox_failed_tries"],
        "outbox_unsent_rows": run["outbox_unsent_rows"],
        "load": run["load"],
        "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(run["start"])),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--per-minute", default="1000,10000")
    parser.add_argument("--seconds", type=float, default=42.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-plain", action="store_true", help="skip the plain rounds")
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument(
        "--pool-size", type=int, default=None, help="the engine's pool (no overflow); default 5+10"
    )
    parser.add_argument(
        "--experiment",
        default="",
        help=f"comma-separated, of {', '.join(EXPERIMENTS)} (see _outbox_experiments)",
    )
    args = parser.parse_args(argv)
    args.experiments = [e for e in args.experiment.split(",") if e]
    for experiment in args.experiments:
        if experiment not in EXPERIMENTS:
            parser.error(f"unknown experiment {experiment!r}; they are {', '.join(EXPERIMENTS)}")
    names = [n for n in args.targets.split(",") if n]
    for name in names:
        if name not in TARGETS:
            parser.error(f"unknown target {name!r}; the targets are {', '.join(TARGETS)}")
    if not args.no_plain:
        names.append("plain")
    rows: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        for per_minute in (int(n) for n in args.per_minute.split(",")):
            for name in names:
                row = measure(name, args, per_minute, args.database_url)
                print(json.dumps(row), flush=True)
                rows.append(row)
    RESULTS.parent.mkdir(exist_ok=True)
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps(kept + rows, indent=2) + "\n")
    _print(rows)
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    cols = [
        "target", "database", "per_minute", "expected", "published", "not_run", "p50_s",
        "p99_s", "wait_p50_s", "record_p50_s", "send_p50_s", "mark_p50_s",
        "statements_per_round", "checkouts_per_round", "commits_per_round", "cpu_s", "load",
    ]  # fmt: skip
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row.get(c, "")) for c in cols))


if __name__ == "__main__":
    main()
