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

import os
import time
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


@pytest.mark.parametrize("db", ["postgres", "mysql", "sqlite"])
def test_a_hung_child_under_timeout_is_killed_and_every_replica_lives(db: str) -> None:
    with Scenario("isolated_hung", JOBS, modules=("tests.faults.jobs_isolated",), db=db) as s:
        for name in "abc":
            s.replica(name)
        s.start()
        pids = {name: r.pid for name, r in s.replicas.items()}
        began = s.wait_start("hung", HUNG_EVERY + 30)
        seen: list[dict[str, object]] = []
        for _ in range(ROUNDS):
            child = began["pid"]
            assert child not in pids.values()  # the round ran in a child process
            noticed = s.wait_event(
                lambda e, b=began: (
                    e["ev"] == "cancelled" and e["job"] == "hung" and e["pid"] == b["pid"]
                ),
                HUNG_TIMEOUT + SLACK,
                "the child to see its timeout",
            )
            assert noticed["cause"] == "TimedOut"
            after = noticed["mono"] - began["mono"]
            assert HUNG_TIMEOUT - 0.5 <= after <= HUNG_TIMEOUT + SLACK, after
            # SIGTERM is ignored; SIGKILL follows KILL_GRACE seconds later.
            wait_until(lambda c=child: not _alive(c), KILL_GRACE + SLACK, "the child to be killed")
            gone = time.monotonic()  # it died no later than this
            instant = datetime.fromisoformat(str(began["instant"]))
            ended = wait_until(
                lambda i=instant: [r for r in admin.history(s.url, "hung") if r.instant == i],
                SLACK,
                "the round's end on record",
            )
            assert [str(r.outcome) for r in ended] == ["timed_out"]
            seen.append(began)
            began = s.wait_start("hung", HUNG_EVERY + SLACK, after=began["mono"] + 1)
            # No two rounds overlap: the child was gone before the next round started.
            assert began["mono"] > gone, (gone, began)
            # Every replica lives: never restarted, still its first process.
            for name, replica in s.replicas.items():
                assert replica.alive and replica.pid == pids[name], name
        statuses = s.stop(45)
        assert statuses == {"a": 0, "b": 0, "c": 0}, statuses
        for replica in s.replicas.values():
            assert len(replica.processes) == 1
            output = replica.current.output()
            assert "CRITICAL" not in output, output[-3000:]
        events = s.events()
        starts = [e for e in events if e["ev"] == "start" and e["job"] == "hung"]
        # Each instant ran once, as a first run.
        instants = [e["instant"] for e in starts]
        assert len(instants) == len(set(instants)) and all(e["attempt"] == 1 for e in starts)
        history = {r.instant: str(r.outcome) for r in admin.history(s.url, "hung")}
        for e in seen:
            assert history[datetime.fromisoformat(str(e["instant"]))] == "timed_out"
        # The thread's job went on on the replicas meanwhile.
        ticks = [e for e in events if e["ev"] == "end" and e["job"] == "tick"]
        assert len(ticks) >= ROUNDS * HUNG_EVERY // 2 - 2
