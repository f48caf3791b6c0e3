"""The soak: ``python -m tests.faults --soak MINUTES [--database postgres|mysql|sqlite]``.

Four replicas run a mix of jobs against the database (PostgreSQL by default) while random
faults hit them: ``kill -9``, SIGTERM, and, on a server, connections cut (blackholed or
reset; each replica is behind a proxy of its own) for a while; on SQLite, where the
replicas share one file on this host, the file's write lock held by another process for
2-8 s instead. A supervisor restarts every replica that ended, as an orchestrator would.
At the end the faults stop, the replicas get time to re-run what was cut short, and the
invariants are checked over the whole log. The report (printed, and written as
``soak.json`` in the scenario's folder) lists the rounds run, the faults injected, the
invariant violations (must be 0) and the re-run delays.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import threading
import time
from typing import Any

from .harness import (
    DATABASES,
    EXIT_LEASE_LOST,
    LEASE_TTL,
    SWEEP_EVERY,
    JobSpec,
    Replica,
    Scenario,
    hold_sqlite_lock,
    percentile,
    redacted,
    sqlite_path,
)

JOBS = [
    JobSpec("tick", "*/1 * * * * *", "work", 0.2),
    JobSpec("work5", "*/5 * * * * *", "work", 2.0),
    JobSpec("async3", "*/3 * * * * *", "async_work", 1.0),
    JobSpec("slow40", "@every 40s", "work", 8.0),
    JobSpec("stubborn30", "@every 30s", "stubborn", 20.0),
    JobSpec("local", "*/2 * * * * *", "work", 0.1, per_instance=True),
]

#: Exit statuses a replica may end with under these faults.
EXPECTED_EXITS = {0, -9, EXIT_LEASE_LOST}


class Soak:
    def __init__(self, minutes: float, replicas: int, seed: int, db: str = "postgres") -> None:
        self.minutes = minutes
        self.rng = random.Random(seed)
        self.seed = seed
        self.scenario = Scenario("soak", JOBS, db=db)
        self.server = self.scenario.db.server
        self.replicas: list[Replica] = [
            self.scenario.replica(f"r{i}", proxy=self.server) for i in range(replicas)
        ]
        self.faults: collections.Counter[str] = collections.Counter()
        self.busy: set[str] = set()  # replicas under a fault right now
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.restarts = 0

    # -- faults ------------------------------------------------------------------------------

    def _pick(self) -> Replica | None:
        with self.lock:
            free = [r for r in self.replicas if r.alive and r.name not in self.busy]
            # Keep at least one replica out of every fault, so the deployment goes on.
            if len(free) <= 1 or len(self.busy) >= 2:
                return None
            chosen = self.rng.choice(free)
            self.busy.add(chosen.name)
            return chosen

    def _release(self, replica: Replica) -> None:
        with self.lock:
            self.busy.discard(replica.name)

    def _fault(self) -> None:
        if self.server:
            kind = self.rng.choices(["kill9", "sigterm", "cut"], weights=[3, 3, 4])[0]
        else:
            kind = self.rng.choices(["kill9", "sigterm", "lock"], weights=[3, 3, 2])[0]
        if kind == "lock":
            if not self._locking():  # one lock at a time
                self.faults[kind] += 1
                threading.Thread(target=self._lock, daemon=True).start()
            return
        replica = self._pick()
        if replica is None:
            return
        self.faults[kind] += 1
        threading.Thread(target=self._inject, args=(kind, replica), daemon=True).start()

    def _inject(self, kind: str, replica: Replica) -> None:
        try:
            if kind == "kill9":
                replica.kill9().wait(10)
                time.sleep(self.rng.uniform(1, 5))
                self._restart(replica)
            elif kind == "sigterm":
                replica.term().wait(20)
                time.sleep(self.rng.uniform(0, 3))
                self._restart(replica)
            else:
                mode = self.rng.choice(["blackhole", "reset"])
                self.faults[f"cut-{mode}"] += 1
                replica.cut(mode)
                time.sleep(self.rng.uniform(4, 25))
                replica.heal()
                # A round still running when its lease was lost ends the process (70)
                # up to ~15 s after the cut: the supervisor restarts it.
        except Exception as exc:  # keep soaking; the report shows it
            print(f"fault {kind} on {replica.name} failed: {exc!r}", file=sys.stderr)
            self.faults["harness-errors"] += 1
        finally:
            self._release(replica)

    def _locking(self) -> bool:
        return self.faults["lock"] > self.faults["lock-done"]

    def _lock(self) -> None:
        """Hold the SQLite file's write lock from another process for 2-8 s: under the
        10 s after which a lease counts as lost (longer is test_file_locked's business)."""
        seconds = self.rng.uniform(2, 8)
        self.scenario.emit("fault", kind="sqlite-lock", seconds=seconds)
        holder = hold_sqlite_lock(sqlite_path(self.scenario.url), seconds)
        try:
            holder.wait(seconds + 120)
        finally:
            if holder.poll() is None:
                holder.kill()
            self.faults["lock-done"] += 1

    def _supervise(self) -> None:
        """Restart a replica that ended on its own (status 70), as an orchestrator would."""
        while not self.stopping.wait(1.0):
            for replica in self.replicas:
                with self.lock:
                    if replica.name in self.busy or replica.alive or not replica.processes:
                        continue
                    self.busy.add(replica.name)
                try:
                    if replica.current.rc == EXIT_LEASE_LOST:
                        self.faults["exit70"] += 1
                    time.sleep(self.rng.uniform(1, 3))
                    self._restart(replica)
                finally:
                    self._release(replica)

    def _restart(self, replica: Replica) -> None:
        if self.stopping.is_set() or replica.alive:
            return
        replica.start()
        self.restarts += 1

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        s = self.scenario
        began = time.monotonic()
        s.start()
        supervisor = threading.Thread(target=self._supervise, daemon=True)
        supervisor.start()
        end = began + self.minutes * 60
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(6, 16))
            if time.monotonic() < end:
                self._fault()
        # Let the last faults play out (each heals and restarts its replica), then make
        # sure every replica runs.
        faulting = time.monotonic()
        while (self.busy or self._locking()) and time.monotonic() < faulting + 60:
            time.sleep(0.5)
        self.stopping.set()
        supervisor.join()
        for replica in self.replicas:
            if replica.proxy is not None and replica.proxy.mode != "pass":
                replica.heal()
            if not replica.alive:
                replica.start()
                self.restarts += 1
        # Time for the last rounds cut short to be re-run or given up.
        time.sleep(LEASE_TTL + 2 * SWEEP_EVERY)
        statuses = s.stop(timeout=30)
        return self._report(began, statuses)

    def _report(self, began: float, statuses: dict[str, int]) -> dict[str, Any]:
        s = self.scenario
        # Rounds the final stop cut short are reported as pending, not as violations.
        report = s.check()
        rounds = s.rounds()
        leased = [r for r in rounds if r.job != "local"]
        exits = collections.Counter(
            p.rc for replica in s.replicas.values() for p in replica.processes if p.rc is not None
        )
        unexpected = {rc: n for rc, n in exits.items() if rc not in EXPECTED_EXITS}
        violations = list(report.violations)
        if unexpected:
            violations.append(f"unexpected exit statuses: {unexpected}")
        if any(rc != 0 for rc in statuses.values()):
            violations.append(f"final stop statuses: {statuses}")
        delays = [delay for _first, _second, delay in report.reruns]
        by_job = collections.Counter(r.job for r in rounds)
        outcomes = collections.Counter(r.outcome for r in leased)
        result = {
            "minutes": self.minutes,
            "seed": self.seed,
            "replicas": len(self.replicas),
            "wall_s": round(time.monotonic() - began, 1),
            "rounds": len(rounds),
            "leased_rounds": len(leased),
            "rounds_by_job": dict(sorted(by_job.items())),
            "outcomes": dict(outcomes),
            "faults": dict(self.faults),
            "database": self.scenario.db.kind,
            "faults_injected": sum(self.faults[k] for k in ("kill9", "sigterm", "cut", "lock")),
            "restarts": self.restarts,
            "exit_statuses": {str(k): v for k, v in sorted(exits.items())},
            "reruns": len(delays),
            "rerun_delay_p50_s": _r(percentile(delays, 0.50)),
            "rerun_delay_p99_s": _r(percentile(delays, 0.99)),
            "rerun_delay_max_s": _r(max(delays) if delays else None),
            "given_up_by_next_instant": len(report.given_up),
            "cut_short_twice": len(report.twice),
            "pending_at_end": len(report.pending),
            "violations": len(violations),
            "violation_details": violations[:50],
            "dir": str(s.dir),
        }
        (s.dir / "soak.json").write_text(json.dumps(result, indent=2))
        return result


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--soak", type=float, required=True, metavar="MINUTES")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--database", choices=sorted(DATABASES), default="postgres")
    args = parser.parse_args(argv)
    database = DATABASES[args.database]
    reason = database.reachable()
    if reason is not None:
        print(
            f"{args.database} at {redacted(database.url)} is unreachable: {reason}", file=sys.stderr
        )
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    soak = Soak(args.soak, args.replicas, seed, args.database)
    print(
        f"soak on {args.database}: {args.soak:g} min, {args.replicas} replicas, seed {seed}, "
        f"in {soak.scenario.dir}"
    )
    try:
        result = soak.run()
    finally:
        soak.scenario.close()
    print(json.dumps(result, indent=2))
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
