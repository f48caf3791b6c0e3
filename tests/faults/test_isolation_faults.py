"""``isolation="process"`` with real processes: a hung child under ``timeout`` on three
replicas (``cronjob run`` processes) ends, and the replicas all live.

The job ``hung`` (``tests.faults.jobs_isolated``) runs every 10 s in a child process that
ignores SIGTERM and its cancellation and never returns, with ``timeout=3``. Each round's
child is told of its timeout 3 s after it started, sent SIGTERM (ignored), then SIGKILL
`KILL_GRACE` seconds later; the round is on record ``timed_out``; the replica that ran it
goes on (a thread's round would have ended the whole process 5 s after the timeout, see
``test_faults.scenario_hung_timeout``). Each instant runs once, and no two rounds of the
job ever overlap. A job on a thread (``tick``) runs throughout on every replica.
"""

from __future__ import annotations

import itertools
import os
from datetime import datetime

import pytest

from cronjob import admin
from cronjob.engine._isolated import KILL_GRACE

from .harness import JobSpec, Scenario, wait_until
from .jobs_isolated import HUNG_EVERY, HUNG_TIMEOUT

pytestmark = pytest.mark.faults

#: Hung rounds watched before the scenario stops.
ROUNDS = 3
#: What a loaded 2-core machine adds to a bound (a claim, a child's start-up).
SLACK = 4.0

JOBS = [
    JobSpec("hung", f"*/{HUNG_EVERY} * * * * *", "forever", options={"timeout": HUNG_TIMEOUT}),
    JobSpec("tick", "1/2 * * * * *", "work", 0.1),
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ended(url: str) -> list[admin.RoundRecord]:
    """The hung job's rounds on record, oldest first."""
    return list(reversed(admin.history(url, "hung", limit=1000)))


@pytest.mark.parametrize("db", ["postgres", "mysql", "sqlite"])
def test_a_hung_child_under_timeout_is_killed_and_every_replica_lives(db: str) -> None:
    with Scenario("isolated_hung", JOBS, modules=("tests.faults.jobs_isolated",), db=db) as s:
        for name in "abc":
            s.replica(name)
        s.start()
        pids = {name: r.pid for name, r in s.replicas.items()}
        for count in range(1, ROUNDS + 1):
            # The timeout counts from the round's start, the child's start-up included: a
            # child slow to start (the replica's first, while its forkserver boots) may be
            # ended before its job began. Either way the round ends on record, timed out.
            wait_until(
                lambda c=count: len(_ended(s.url)) >= c,
                HUNG_EVERY + HUNG_TIMEOUT + KILL_GRACE + SLACK,
                f"round {count} of 'hung' on record",
            )
            # Every replica lives: never restarted, still its first process.
            for name, replica in s.replicas.items():
                assert replica.alive and replica.pid == pids[name], name
        statuses = s.stop(45)
        assert statuses == {"a": 0, "b": 0, "c": 0}, statuses
        for replica in s.replicas.values():
            assert len(replica.processes) == 1
            output = replica.current.output()
            assert "CRITICAL" not in output, output[-3000:]
        ended = _ended(s.url)
        assert len(ended) >= ROUNDS
        # Each instant ran once, as a first run, and timed out; the drain at the stop may
        # have cut the last one short.
        instants = [r.instant for r in ended]
        assert len(instants) == len(set(instants)) and all(r.attempt == 1 for r in ended)
        assert all(str(r.outcome) == "timed_out" for r in ended[:ROUNDS]), ended
        # No two rounds overlapped: each ended on record (after its child was reaped)
        # before the next one started.
        for earlier, later in itertools.pairwise(ended):
            assert earlier.ended <= later.started, (earlier, later)
        events = s.events()
        starts = [e for e in events if e["ev"] == "start" and e["job"] == "hung"]
        assert starts, "no child ever started the hung job"
        for e in starts:
            assert e["pid"] not in pids.values()  # it ran in a child process ...
            assert not _alive(e["pid"])  # ... which is gone
            assert e["attempt"] == 1
        # A child that got to its job saw its timeout, about 3 s after the round started.
        noticed = {e["pid"]: e for e in events if e["ev"] == "cancelled" and e["job"] == "hung"}
        by_instant = {r.instant: r for r in ended}
        for e in starts:
            record = by_instant[datetime.fromisoformat(e["instant"])]
            if str(record.outcome) != "timed_out":
                continue
            assert noticed[e["pid"]]["cause"] == "TimedOut"
            after = (record.ended - record.started).total_seconds()
            assert HUNG_TIMEOUT <= after <= HUNG_TIMEOUT + KILL_GRACE + SLACK, after
        # The thread's job went on on the replicas meanwhile.
        ticks = [e for e in events if e["ev"] == "end" and e["job"] == "tick"]
        assert len(ticks) >= ROUNDS * HUNG_EVERY // 2 - 2
