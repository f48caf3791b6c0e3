"""A promoted standby: the rounds run twice, and the cost of ``remote_apply`` on claims.

Run: ``python -m benchmarks.bench_standby [--trials N] [--jobs J] [--cycles N]``.
Reported, not asserted (the assertions are ``tests/faults/test_standby.py``).

Each measurement builds a private primary and streaming standby
(``tests/faults/_standby.py``: ``initdb`` and ``pg_basebackup`` on free ports; never the
shared server), asynchronous (PostgreSQL's default) or with ``synchronous_commit =
remote_apply`` and the standby in ``synchronous_standby_names``.

- ``claims``: ``--cycles`` claims of one lease (each then finished), one thread, and
  claims of ``--jobs`` leases at one instant: the claim's time, p50 and p99, on each
  setting, with the standby's stream direct (a round trip of well under a millisecond)
  and through a proxy that delays it 5 ms each way (a standby in another zone).
- ``failover``: two ``cronjob run`` replicas (OS processes, on the multi-host URL
  ``host=primary,standby target_session_attrs=read-write``) run ``--jobs`` jobs, half
  every second and half every 10 s (50 ms each); at a random moment 0.5 to 4.5 s after
  an instant of the 10 s jobs (at least 6 s after the start) the primary is killed
  (every process at once, ``SIGKILL``), the standby promoted ``--delay`` seconds later
  (the failover's detection: the replicas' claims fail meanwhile, so they owe the
  instants the outage missed), and the replicas go on for 25 s, longer than a lease's
  15 s and a sweep. Either on a healthy stream, or with the standby cut off the stream
  5 s before the kill (a partition that isolates the primary, then its loss). Counted
  over the fault suite's event log: the instants that started twice, those whose first
  round had run to its end (a true second run, the rules allow none), and the invariant
  violations ``tests/faults/harness.py`` finds.

Results go to stdout and ``benchmarks/results/standby.json``.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import lease
from benchmarks import _harness, _table
from benchmarks.bench_lease import seeded
from tests.faults._standby import StandbyPair
from tests.faults.harness import JobSpec, Scenario, schema_url, wall_now

START = datetime(2026, 1, 1, tzinfo=UTC)
SETTINGS = {"async": False, "remote_apply": True}


def _ms(values: list[float], q: float) -> float:
    return round(_harness._percentile(values, q) * 1000, 2)


def claims(*, synchronous: bool, lag: float, cycles: int, jobs: int) -> dict[str, Any]:
    """The claim's time on a pair: one lease, then ``jobs`` leases at one instant."""
    with StandbyPair(synchronous=synchronous, lag=lag) as pair:
        engine = lease.create_engine(pair.url)
        try:
            store, names = seeded(engine, jobs)
            instant = START
            one: list[float] = []
            for n in range(cycles + 20):  # the first 20 warm the pool and caches
                instant += timedelta(seconds=1)
                began = time.perf_counter()
                (claim,) = store.claim(["solo"], instant, "bench")
                took = time.perf_counter() - began
                store.finish("solo", claim.token, ended=instant)
                if n >= 20:
                    one.append(took)
            batch: list[float] = []
            for _ in range(max(10, cycles // 20)):
                instant += timedelta(seconds=1)
                began = time.perf_counter()
                won = store.claim(names, instant, "bench")
                batch.append(time.perf_counter() - began)
                for claim in won:
                    store.finish(claim.name, claim.token, ended=instant)
        finally:
            engine.dispose()
    return {
        "setting": "remote_apply" if synchronous else "async",
        "lag_ms": lag * 1000,
        "claim_p50_ms": _ms(one, 0.5),
        "claim_p99_ms": _ms(one, 0.99),
        "batch_jobs": jobs,
        "batch_p50_ms": _ms(batch, 0.5),
        "batch_p99_ms": _ms(batch, 0.99),
    }


def failover(
    *, synchronous: bool, cut: bool, jobs: int, delay: float, rng: random.Random
) -> dict[str, Any]:
    """One failover under load; what ran twice."""
    specs = [
        JobSpec(f"j{i:03d}", "*/1 * * * * *" if i % 2 else "*/10 * * * * *", "work", 0.05)
        for i in range(jobs)
    ]
    setting = "remote_apply" if synchronous else "async"
    with (
        StandbyPair(synchronous=synchronous) as pair,
        Scenario(f"bench-standby-{setting}", specs, db=pair.database) as s,
    ):
        url = schema_url(s.schema, base=pair.url)
        for name in "ab":
            s.replica(name, url=url)
        s.start()
        # A random moment after an instant of the 10 s jobs: cut off 5 s before, the
        # standby misses that instant's claims.
        now = time.time()
        kill_at = (now + 6) // 10 * 10 + 10 + rng.uniform(0.5, 4.5)
        if cut:
            time.sleep(max(0.0, kill_at - 5 - time.time()))
            pair.detach()
        time.sleep(max(0.0, kill_at - time.time()))
        s.emit("fault", kind="kill-primary")
        killed_at, killed = wall_now(), time.monotonic()
        pair.kill_primary()
        time.sleep(delay)
        promotion = pair.promote()
        time.sleep(25)
        statuses = s.stop(timeout=30)
        rounds = s.rounds()
        report = s.check()
    starts: dict[tuple[str, datetime], list[Any]] = defaultdict(list)
    for r in rounds:
        starts[(r.job, r.instant)].append(r)
    twice = [runs for runs in starts.values() if len(runs) > 1]
    after = [r.start - killed for r in rounds if r.start > killed]
    return {
        "setting": setting,
        "standby": "cut off 5 s before the kill" if cut else "streaming",
        "jobs": jobs,
        "delay_s": delay,
        "killed_at": killed_at.isoformat(timespec="milliseconds"),
        "promotion_s": round(promotion, 2),
        "rounds": len(rounds),
        "instants_started_twice": len(twice),
        "first_ran_to_its_end": sum(1 for runs in twice if runs[0].ran_to_end),
        "two_attempt_1": sum(1 for runs in twice if [r.attempt for r in runs[:2]] == [1, 1]),
        "violations": len(report.violations),
        "first_round_after_kill_s": round(min(after), 2) if after else None,
        "exit_statuses": statuses,
    }


CLAIM_COLUMNS = [
    ("setting", "setting"),
    ("lag ms (one way)", "lag_ms"),
    ("claim p50 ms", "claim_p50_ms"),
    ("claim p99 ms", "claim_p99_ms"),
    ("jobs", "batch_jobs"),
    ("batch p50 ms", "batch_p50_ms"),
    ("batch p99 ms", "batch_p99_ms"),
]
FAILOVER_COLUMNS = [
    ("setting", "setting"),
    ("standby", "standby"),
    ("rounds", "rounds"),
    ("started twice", "instants_started_twice"),
    ("first ran to end", "first_ran_to_its_end"),
    ("attempt 1 twice", "two_attempt_1"),
    ("violations", "violations"),
    ("promotion s", "promotion_s"),
    ("first round after kill s", "first_round_after_kill_s"),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=3, help="failovers per setting and case")
    parser.add_argument("--jobs", type=int, default=20, help="jobs every second / in a batch")
    parser.add_argument("--cycles", type=int, default=300, help="claims of one lease")
    parser.add_argument("--delay", type=float, default=3.0, help="from the kill to the promotion")
    parser.add_argument("--seed", type=int, default=20261203)
    parser.add_argument("--only", default="claims,failover")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    rows: list[dict[str, Any]] = []
    if "claims" in only:
        measured = [
            claims(synchronous=sync, lag=lag, cycles=args.cycles, jobs=args.jobs)
            for lag in (0.0, 0.005)
            for sync in SETTINGS.values()
        ]
        print(_table.render(measured, CLAIM_COLUMNS), flush=True)
        rows += [{"part": "claims", **row} for row in measured]
    if "failover" in only:
        rng = random.Random(args.seed)
        measured = [
            failover(synchronous=sync, cut=cut, jobs=args.jobs, delay=args.delay, rng=rng)
            for cut in (False, True)
            for sync in SETTINGS.values()
            for _ in range(args.trials)
        ]
        print(_table.render(measured, FAILOVER_COLUMNS), flush=True)
        rows += [{"part": "failover", **row} for row in measured]
    _harness.publish("standby", "standby", rows)


if __name__ == "__main__":
    main()
