"""Schedules made of data (issue #37): reported, not asserted.

Run: ``python -m benchmarks.bench_schedules [--db sqlite,postgres,mysql] [--add 10000]
[--on-record 100000] [--changes 1000] [--every 0.05]``.

Two measures on each database, in a scratch schema / database dropped afterwards:

- **add_many**: ``schedules.add_many`` of ``--add`` schedules in one transaction (each
  with its own spec of the every-minute mix and a small JSON argument), on an empty table:
  the wall time of the call, the statements it sent, the rows written.
- **propagation**: one real replica (a `Scheduler` on the system clock, in this process,
  registering the task) with ``--on-record`` schedules on record; then ``--changes``
  changes, one every ``--every`` seconds, each an ``update`` of one schedule's args in a
  transaction of its own. A watcher thread reads the replica's state every millisecond;
  a change's delay is from its commit to the moment the replica holds the new args (the
  schedules fire once a year: idle, so nothing competes with the change). Also:
  the replica's ready time with that many schedules, its statements per second while idle
  (the counter's poll), and the statements a change cost it.

Results go to stdout and to ``benchmarks/results/schedules.json``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import threading
import time
from typing import Any

import sqlalchemy as sa

import cronjob
import lease
from benchmarks import _mix
from benchmarks._harness import _percentile, save_run
from benchmarks.bench_lease import DATABASES
from cronjob import schedules
from tests._helpers import statements

TASK = "bench"


def _news(count: int, prefix: str, spec: str | None = None) -> list[schedules.New]:
    """``count`` schedules of the every-minute mix (or all on ``spec``)."""
    return [
        schedules.New(f"{prefix}{job.name}", task=TASK, spec=spec or job.spec, args={"n": i})
        for i, job in enumerate(_mix.mix("every-minute", count))
    ]


#: The propagation's schedules fire once a year: on record, idle, so the measure is the
#: change's way to the replica and not rounds competing with it.
YEARLY = "0 0 0 1 1 *"
#: Seconds a replica is left to settle after it is ready, before the changes begin.
SETTLE = 20.0


def bench_add_many(url: str, count: int) -> dict[str, Any]:
    engine = lease.create_engine(url)
    try:
        lease.migrate(engine)
        news = _news(count, "add-")
        with statements(engine, keep=lambda s: not s.startswith("BEGIN")) as sent:
            began = time.perf_counter()
            written = schedules.add_many(engine, news)
            seconds = time.perf_counter() - began
        return {"count": written, "seconds": round(seconds, 3), "statements": len(sent)}
    finally:
        engine.dispose()


def bench_propagation(url: str, on_record: int, changes: int, every: float) -> dict[str, Any]:
    engine = lease.create_engine(url)
    lease.migrate(engine)
    registry = cronjob.Registry()
    registry.register_task(lambda ctx: None, TASK)
    news = _news(on_record, "p-", YEARLY)
    for start in range(0, len(news), 10_000):
        schedules.add_many(engine, news[start : start + 10_000])
    began = time.perf_counter()
    scheduler = cronjob.Scheduler(url, registry=registry, replica_id="bench", history=None)
    result: dict[str, Any] = {"on_record": on_record, "changes": changes}
    try:
        scheduler.start()
        dispatcher = scheduler._dispatcher
        assert dispatcher is not None
        states = dispatcher.states
        while len(states) < on_record or not scheduler.ready:
            time.sleep(0.01)
        result["ready_s"] = round(time.perf_counter() - began, 2)
        # Start-up's catch-up writes and reads every row: the measure is of a replica
        # that has settled (its first sweeps done), as a change finds one in production.
        time.sleep(SETTLE)
        replica_engine = scheduler.engine
        assert replica_engine is not None
        with statements(replica_engine, keep=lambda s: not s.startswith("BEGIN")) as idle:
            time.sleep(5)
        result["idle_statements_per_s"] = round(len(idle) / 5, 1)

        targets = [news[(i * 7919) % on_record].id for i in range(changes)]
        committed: dict[int, float] = {}
        seen: dict[int, float] = {}
        done = threading.Event()

        def watch() -> None:
            waiting = 0  # changes before this one are all seen
            while waiting < changes and not done.is_set():
                now = time.perf_counter()
                for i in range(waiting, min(changes, waiting + 200)):
                    if i not in committed:
                        break
                    if i in seen:
                        continue
                    state = states.get(targets[i])
                    if state is not None and state.job.args == f'{{"change":{i}}}':
                        seen[i] = now
                while waiting in seen:
                    waiting += 1
                time.sleep(0.001)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with statements(replica_engine, keep=lambda s: not s.startswith("BEGIN")) as sent:
            window = time.perf_counter()
            for i, target in enumerate(targets):
                schedules.update(engine, target, args={"change": i})
                committed[i] = time.perf_counter()
                time.sleep(every)
            watcher.join(timeout=10)
            window = time.perf_counter() - window
        done.set()
        delays = [seen[i] - committed[i] for i in seen] or [math.nan]
        result.update(
            seen=len(seen),
            delay_s={
                "p50": round(statistics.median(delays), 3),
                "p99": round(_percentile(delays, 0.99), 3),
                "max": round(max(delays), 3),
            },
            replica_statements_per_s_while_changing=round(len(sent) / window, 1),
        )
    finally:
        scheduler.stop()
        engine.dispose()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", default="sqlite,postgres,mysql")
    parser.add_argument("--add", type=int, default=10_000)
    parser.add_argument("--on-record", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=1000)
    parser.add_argument("--every", type=float, default=0.05)
    parser.add_argument("--skip-propagation", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    for name in args.db.split(","):
        with DATABASES[name]() as url:
            try:
                results[name] = {"add_many": bench_add_many(url, args.add)}
            except (sa.exc.SQLAlchemyError, lease.LeaseError) as exc:
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
        print(f"{name}: add_many {results[name]['add_many']}", flush=True)
        if args.skip_propagation:
            continue
        with DATABASES[name]() as url:
            results[name]["propagation"] = bench_propagation(
                url, args.on_record, args.changes, args.every
            )
        print(f"{name}: propagation {results[name]['propagation']}", flush=True)
    save_run("schedules", **vars(args), results=results)
    return results


if __name__ == "__main__":
    main()
