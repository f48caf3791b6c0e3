"""Schedules made of data across real ``cronjob run`` processes, on real time: a
committed change reaches every replica within 2 s, a replica killed with SIGKILL just as
a change commits loses no instant and doubles none, and a writer killed inside its
transaction leaves nothing and holds no one up.

Real time on purpose (the propagation is a poll every second); the assertions are about
which rounds ran, with what, never about how long a call took.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import sqlalchemy as sa

import lease
from cronjob import schedules
from tests._process import watched

REPO = Path(__file__).resolve().parent.parent
#: Every-second schedules: enough that each replica's share holds some at every instant.
COUNT = 12
EVERY_SECOND = "* * * * * *"
#: The bound the contract gives for a committed change to reach every replica.
PROPAGATION = 2.0
#: A lease's time to live: how long a killed replica's leases keep others out.
LEASE_TTL = lease.DEFAULT_TTL


def _rounds(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.fixture
def fleet(db_url: str, tmp_path: Path) -> Iterator[tuple[list[subprocess.Popen[str]], Path]]:
    """Three ``cronjob run`` replicas of ``tests.schedule_tasks`` on ``db_url``."""
    engine = lease.create_engine(db_url)
    lease.migrate(engine)
    engine.dispose()
    log = tmp_path / "rounds.jsonl"
    env = {"SCHEDULE_LOG": str(log), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "cronjob", "run", "--database-url", db_url]
    with ExitStack() as stack:
        runs = [
            stack.enter_context(watched([*argv, "tests.schedule_tasks"], cwd=tmp_path, env=env))
            for _ in range(3)
        ]
        for run in runs:
            assert run.started.wait(60), run.output
            assert run.process.poll() is None, run.output
        yield [run.process for run in runs], log
        for run in runs:
            if run.process.poll() is None:
                run.process.send_signal(signal.SIGTERM)
        for run in runs:
            run.process.wait(30)


def _wait(seconds: float) -> None:
    time.sleep(seconds)  # real time: the replicas are other processes on the wall clock


def test_a_change_reaches_every_replica_within_two_seconds(db_url, fleet):
    _processes, log = fleet
    engine = lease.create_engine(db_url)
    try:
        news = [
            schedules.New(f"r:{i}", task="report", spec=EVERY_SECOND, args={"v": 1})
            for i in range(COUNT)
        ]
        schedules.add_many(engine, news)
        added = time.time()
        _wait(4)
        with engine.begin() as conn:
            for i in range(COUNT):
                schedules.update(conn, f"r:{i}", args={"v": 2})
        changed = time.time()
        _wait(4)
        for i in range(COUNT // 2):
            schedules.remove(engine, f"r:{i}")
        removed = time.time()
        _wait(4)
    finally:
        engine.dispose()
    rounds = _rounds(log)
    pairs = [(r["id"], r["instant"]) for r in rounds]
    assert len(pairs) == len(set(pairs)), "an instant ran twice"
    replicas = {r["replica"] for r in rounds}
    assert len(replicas) == 3, f"every replica runs a share: {replicas}"
    first = min(r["instant"] for r in rounds)
    assert first <= added + PROPAGATION + 1
    stale = [r for r in rounds if r["instant"] >= changed + PROPAGATION and r["args"] != {"v": 2}]
    assert stale == [], "a replica ran the old args more than 2 s after the change"
    fresh = [r for r in rounds if r["args"] == {"v": 2}]
    assert {r["replica"] for r in fresh} == replicas
    gone = [
        r
        for r in rounds
        if r["instant"] >= removed + PROPAGATION and int(str(r["id"]).split(":")[1]) < COUNT // 2
    ]
    assert gone == [], "a removed schedule ran more than 2 s after its removal"
    # Every remaining schedule ran every second once the change was in.
    for i in range(COUNT // 2, COUNT):
        instants = sorted(r["instant"] for r in rounds if r["id"] == f"r:{i}")
        later = [t for t in instants if changed + PROPAGATION <= t <= removed + 2]
        assert len(later) >= int(removed + 2 - changed - PROPAGATION) - 1, (i, instants)
        gaps = [b - a for a, b in itertools.pairwise(later)]
        assert all(gap == 1 for gap in gaps), (i, gaps)


def test_a_replica_killed_as_a_change_commits_loses_and_doubles_nothing(db_url, fleet):
    processes, log = fleet
    dead = processes[0]
    engine = lease.create_engine(db_url)
    try:
        news = [schedules.New(f"k:{i}", task="report", spec=EVERY_SECOND) for i in range(COUNT)]
        schedules.add_many(engine, news)
        _wait(3)
        with engine.begin() as conn:
            for i in range(COUNT):
                schedules.update(conn, f"k:{i}", args={"v": 2})
            # SIGKILL a replica as the change commits: it may or may not have read it.
            dead.send_signal(signal.SIGKILL)
        changed = time.time()
        # The leases the dead replica held (a round claimed ahead of its instant, one
        # running) keep its schedules' next instants from everyone until they expire, as
        # any job's (15 s); then the others run them again.
        _wait(LEASE_TTL + 8)
        dead.wait(10)
    finally:
        engine.dispose()
    rounds = _rounds(log)
    # Each (schedule, instant) runs once, or twice when its first run was cut short by
    # the kill: attempt 1 on the dead replica, attempt 2 elsewhere.
    runs: dict[tuple[object, object], list[dict[str, object]]] = {}
    for r in rounds:
        runs.setdefault((r["id"], r["instant"]), []).append(r)
    for key, twice in runs.items():
        if len(twice) > 1:
            attempts = sorted((r["attempt"], r["pid"] == dead.pid) for r in twice)
            assert attempts == [(1, True), (2, False)], (key, twice)
    # Nothing of the dead replica after the kill; the change reached the survivors.
    after = [r for r in rounds if r["t"] > changed + 0.5]
    assert all(r["pid"] != dead.pid for r in after)
    assert all(r["args"] == {"v": 2} for r in after if r["instant"] >= changed + PROPAGATION)
    # Once the dead replica's leases expired, no instant of any schedule is missed.
    start, end = int(changed + LEASE_TTL + 3), int(changed + LEASE_TTL + 7)
    for i in range(COUNT):
        instants = {int(r["instant"]) for r in rounds if r["id"] == f"k:{i}"}
        missing = [t for t in range(start, end) if t not in instants]
        assert missing == [], (i, missing)


WRITER = """
import os, sys, lease
from cronjob import schedules
engine = lease.create_engine(sys.argv[1])
conn = engine.connect()
conn.begin()
schedules.add(conn, "never", task="report", spec="* * * * * *")
print("in transaction", flush=True)
sys.stdin.read()  # killed here, its transaction open
"""


def test_a_writer_killed_inside_its_transaction_leaves_nothing_and_holds_no_one(
    db_url, fleet, tmp_path
):
    _processes, log = fleet
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, db_url],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "in transaction"
    writer.send_signal(signal.SIGKILL)
    writer.wait(10)
    engine = lease.create_engine(db_url)
    try:
        # The counter's lock went with the killed session: this add does not wait on it.
        schedules.add(engine, "after", task="report", spec=EVERY_SECOND)
        added = time.time()
        _wait(4)
        assert schedules.get(engine, "never") is None
        with engine.connect() as conn:
            names = conn.execute(sa.text("SELECT name FROM cronjob_lease")).scalars().all()
        assert "never" not in names
    finally:
        engine.dispose()
    rounds = _rounds(log)
    assert [r for r in rounds if r["id"] == "never"] == []
    ran = sorted(r["instant"] for r in rounds if r["id"] == "after")
    assert ran and ran[0] <= added + PROPAGATION + 1
