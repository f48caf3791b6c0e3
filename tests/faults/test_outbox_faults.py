"""The outbox under faults, with real processes, for each task system: RQ on Redis,
Celery and Dramatiq on RabbitMQ with publisher confirms. ``cronjob run`` replicas
SIGKILLed between a send and its mark, the broker cut off for 20 s behind a proxy (the
broker itself is never stopped), and a worker killed inside a ``once`` body. Every
instant that had a round is delivered, no id twice except after a kill between send and
mark, nothing left unsent once the broker is back.

The scenarios are the same for every target; the outbox's statements are the same for
every target too, so RQ runs on the three databases and Celery and Dramatiq on one each
(PostgreSQL, MariaDB). Run this file alone (``pytest tests/faults/test_outbox_faults.py``):
it restarts no database server."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from rq.job import JobStatus

import cronjob
import lease
from tests._killed_body import ONCE_KILLED
from tests._process import Watched, drained, in_session, watched
from tests._proxy import Proxy
from tests.faults._outbox_targets import RQ, Celery, Dramatiq, Fleet, Target

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]

#: (target, database) of each run of a scenario.
CASES = [
    pytest.param(("rq", "sqlite"), id="rq-sqlite"),
    pytest.param(("rq", "postgres"), id="rq-postgres", marks=pytest.mark.postgres),
    pytest.param(("rq", "mysql"), id="rq-mysql", marks=pytest.mark.mysql),
    pytest.param(("celery", "postgres"), id="celery-postgres", marks=pytest.mark.postgres),
    pytest.param(("dramatiq", "mysql"), id="dramatiq-mysql", marks=pytest.mark.mysql),
]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def db_url(case: tuple[str, str], request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{case[1]}_url")
    return url


@pytest.fixture
def target(case: tuple[str, str], request: pytest.FixtureRequest) -> Iterator[Target]:
    """The case's task system, on a queue of the test's own."""
    name = case[0]
    made = (
        RQ(request.getfixturevalue("redis_url"))
        if name == "rq"
        else {"celery": Celery, "dramatiq": Dramatiq}[name]()
    )
    yield made
    made.close()


def rows(url: str) -> list[dict[str, object]]:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            table = lease.metadata.tables["cronjob_outbox"]
            return [dict(r) for r in conn.execute(sa.select(table)).mappings()]
    finally:
        engine.dispose()


def replica(stack: ExitStack, db_url: str, target: Target, port: int, **env: str) -> Watched:
    argv = [sys.executable, "-m", "cronjob", "run", "--database-url", db_url]
    environ = {**target.env(port), "PYTHONPATH": str(REPO), **env}
    run = stack.enter_context(watched([*argv, "tests.faults.jobs_outbox"], cwd=REPO, env=environ))
    assert run.started.wait(60), run.output
    return run


def sent_after(run: Watched, occurrence_id: str) -> bool:
    """Whether ``run`` announced a send after its own send of ``occurrence_id``."""
    return "outbox-sent" in run.output.partition(f"outbox-sent {occurrence_id}")[2]


def test_a_replica_killed_between_send_and_mark_republishes_the_same_id_once(db_url, target):
    lease.migrate(lease.create_engine(db_url))
    with ExitStack() as stack:
        victim = replica(stack, db_url, target, target.port, OUTBOX_PAUSE_AFTER_SEND="3")
        other = replica(stack, db_url, target, target.port)
        before = victim.output.count("outbox-sent")
        # A send just announced: the victim waits 3 s before its mark. Kill it there.
        wait_for(lambda: victim.output.count("outbox-sent") > before, 60, "a send")
        victim.process.send_signal(signal.SIGKILL)
        killed_id = victim.output.split("outbox-sent ")[-1].split()[0]
        # The other replica sends it again (its sweep, once the row's hold has passed),
        # then runs a round of its own: by then the victim's lease has expired, and the
        # round the kill cut short has been given up or run again, finding it sent.
        wait_for(lambda: sent_after(other, killed_id), 60, "a round after the resend")
        wait_for(lambda: all(r["sent_ms"] is not None for r in rows(db_url)), 60, "all sent")
        assert other.process.poll() is None
        drained(other)  # its round in flight, if any, sent and marked
    recorded = rows(db_url)
    assert all(r["sent_ms"] is not None for r in recorded)
    counts = Counter(target.ids())
    assert {r["id"] for r in recorded} <= set(counts)  # every recorded instant delivered
    assert counts[killed_id] == 2  # sent, killed before the mark, sent again: same id
    assert [i for i, n in counts.items() if n > 1] == [killed_id]


def test_the_broker_cut_off_for_20s_loses_no_instant(db_url, target):
    lease.migrate(lease.create_engine(db_url))
    proxy = Proxy(("127.0.0.1", target.port))
    try:
        with ExitStack() as stack:
            runs = [replica(stack, db_url, target, proxy.port) for _ in range(2)]
            wait_for(lambda: target.count() >= 2, 60, "the first sends")
            proxy.cut()
            time.sleep(20)
            unsent = [r for r in rows(db_url) if r["sent_ms"] is None]
            assert len(unsent) >= 5  # instants kept coming, recorded, not sent
            proxy.restore()
            wait_for(lambda: all(r["sent_ms"] is not None for r in rows(db_url)), 120, "all sent")
            # Stopped, not killed: a round that recorded its row after the wait sends it.
            drained(*runs)
        recorded = rows(db_url)
        assert all(r["sent_ms"] is not None for r in recorded)
        counts = Counter(target.ids())
        assert {r["id"] for r in recorded} == set(counts)
        # A duplicate only from a send cut in flight (its reply lost): never a clean one.
        tried = {r["id"] for r in recorded if r["tries"]}
        assert {i for i, n in counts.items() if n > 1} <= tried
        instants = sorted(int(r["instant_ms"]) for r in recorded)
        gaps = {b - a for a, b in itertools.pairwise(instants)}
        assert gaps == {2000}  # every instant of the run, none skipped
    finally:
        proxy.close()


@pytest.mark.parametrize("case", CASES[:3])
def test_an_rq_worker_killed_in_a_once_body_runs_it_after_the_stale_time(
    db_url, target, redis_url, tmp_path
):
    """RQ never delivers a killed worker's job again by itself: the test plays the replica
    that republishes it (the same job id), within the stale time and after it."""
    assert isinstance(target, RQ)
    queue = target.rq_queue
    occ = f"occ-{uuid.uuid4().hex[:12]}"  # job ids are Redis-wide: one per test
    engine = lease.create_engine(db_url)
    lease.migrate(engine)
    out = tmp_path / "out.jsonl"
    env = {
        **os.environ,
        "CRONJOB_TEST_OUT": str(out),
        "PYTHONPATH": str(REPO),
        "CRONJOB_DATABASE_URL": db_url,
    }
    argv = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url, queue.name]

    def deliver(**kwargs: float) -> JobStatus | None:
        """Enqueue the job (the first time, or a replica's republish: the same id) and wait
        for the worker to be done with it."""
        job = queue.enqueue_call("tests.rq_tasks.counted_stale", ("k",), kwargs, job_id=occ)
        done = (JobStatus.FINISHED, JobStatus.FAILED)
        wait_for(lambda: job.get_status(refresh=True) in done, 60, "the worker")
        return job.get_status()

    def bodies() -> list[object]:
        return [json.loads(line)["body"] for line in out.read_text().splitlines()]

    queue.enqueue_call("tests.rq_tasks.counted_stale", ("k",), {"sleep": 60}, job_id=occ)
    worker = in_session(argv, cwd=REPO, env=env, output=tmp_path / "w1.out")
    try:
        wait_for(lambda: out.exists() and occ in out.read_text(), 60, "the body to start")
        started = time.monotonic()  # at or after the body's start
        # The body runs in RQ's work horse, a fork in a process group of its own: killing
        # the worker's group alone would leave it to finish the body (and mark it done).
        os.kill(json.loads(out.read_text().splitlines()[0])["pid"], signal.SIGKILL)
    finally:
        _kill_group(worker)
    # One worker for the deliveries that follow (an `rq worker --burst` often takes 60 s
    # to exit: its pubsub thread waits that long).
    worker = in_session(argv, cwd=REPO, env=env, output=tmp_path / "w2.out")
    try:
        assert deliver() == JobStatus.FAILED  # OccurrenceBusy: within the stale time
        assert bodies() == [occ]
        time.sleep(max(0.0, started + 15.5 - time.monotonic()))  # counted_stale's stale_after
        assert deliver() == JobStatus.FINISHED
        assert deliver() == JobStatus.FINISHED
    finally:
        _kill_group(worker)
    assert bodies() == [occ, occ]  # the dead one, then once more


#: The ``once`` task's stale time in the fleet scenario: past the broker's redelivery of
#: a killed worker's message (well under a second) by a wide margin.
STALE_AFTER = 6.0


@pytest.mark.parametrize("case", CASES[3:])
def test_a_worker_killed_in_a_once_body_is_redelivered_and_run_after_the_stale_time(
    db_url, target, tmp_path
):
    """Two workers on the queue; the one that runs the body is SIGKILLed in it. RabbitMQ
    gives its unacknowledged message to the other: busy (the body is on record as
    running) until the stale time has passed, retried by the task system, then run; a
    republish of the same id after that runs nothing."""
    assert isinstance(target, Fleet)
    lease.migrate(lease.create_engine(db_url))
    log, marker = target.log(tmp_path), str(tmp_path / "first-run")
    # A firing of the worker's "once-killed" (every second), with its own id: the once
    # wrapper checks both before it runs a body.
    instant = datetime.now(UTC).replace(microsecond=0)
    occ = cronjob.occurrence_id(ONCE_KILLED, instant)

    def lines(key: str) -> list[dict[str, Any]]:
        found = log.read_text().splitlines() if log.exists() else []
        return [line for line in map(json.loads, found) if key in line]

    workers = []
    with ExitStack() as stack:
        for n in (1, 2):
            argv, env = target.worker(tmp_path, n, db_url, STALE_AFTER)
            workers.append(in_session(argv, cwd=REPO, env=env, output=tmp_path / f"w{n}.out"))
            stack.callback(_kill_group, workers[-1])
        wait_for(lambda: target.consumers() == 2, 60, "both workers to consume")
        target.publish(occ, marker, instant)
        wait_for(lambda: lines("body"), 60, "the body to start")
        first = lines("body")[0]
        # The body runs in the worker's process (Celery's solo pool) or a child of it
        # (Dramatiq's worker process): its process group is the worker's.
        killed = next(w for w in workers if os.getpgid(int(first["pid"])) == w.pid)
        _kill_group(killed)
        wait_for(lambda: len(lines("body")) == 2, 60, "the body to run again")
        survivor = next(w for w in workers if w is not killed)
        assert survivor.poll() is None
        # A replica's republish, after a kill between send and mark.
        target.publish(occ, marker, instant)
        wait_for(
            lambda: any(d["outcome"] == "done" for d in lines("delivery")), 60, "the republish"
        )
    bodies, deliveries = lines("body"), lines("delivery")
    assert [b["body"] for b in bodies] == [occ, occ]  # the dead one, then once more
    assert bodies[1]["at"] >= bodies[0]["at"] + STALE_AFTER - 0.5  # not before the stale time
    outcomes = [d["outcome"] for d in deliveries]
    assert outcomes[0] == "busy"  # the broker's redelivery found it running
    assert outcomes == ["busy"] * (len(outcomes) - 2) + ["ran", "done"]
    assert {d["delivery"] for d in deliveries} == {occ}


def _kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL ``process`` and the children of its session."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
