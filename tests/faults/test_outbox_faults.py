"""The outbox under faults, with real processes: ``cronjob run`` replicas SIGKILLed between
a send and its mark, Redis cut off for 20 s behind a proxy (Redis itself is never
stopped), and an ``rq worker`` killed inside a ``once`` body. Every instant that had a
round is delivered, no id twice except after a kill between send and mark, nothing left
unsent once the broker is back.

Run this file alone (``pytest tests/faults/test_outbox_faults.py``): it restarts no
database server."""

from __future__ import annotations

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
from pathlib import Path

import pytest
import sqlalchemy as sa

import lease
from tests._process import Watched, watched
from tests._proxy import Proxy

rq = pytest.importorskip("rq")
redis = pytest.importorskip("redis")

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def queue(redis_url: str) -> Iterator[rq.Queue]:
    connection = redis.Redis.from_url(redis_url)
    queue = rq.Queue(f"cronjob-fault-{uuid.uuid4().hex[:12]}", connection=connection)
    yield queue
    queue.empty()
    connection.close()


def rows(url: str) -> list[dict[str, object]]:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            table = lease.metadata.tables["cronjob_outbox"]
            return [dict(r) for r in conn.execute(sa.select(table)).mappings()]
    finally:
        engine.dispose()


def queued(queue: rq.Queue) -> list[str]:
    """Every id pushed on the queue, duplicates kept (nobody consumes it here)."""
    return [i.decode() for i in queue.connection.lrange(queue.key, 0, -1)]


def replica(stack: ExitStack, db_url: str, queue: rq.Queue, port: int, **env: str) -> Watched:
    argv = [sys.executable, "-m", "cronjob", "run", "--database-url", db_url]
    environ = {
        "OUTBOX_QUEUE": queue.name,
        "OUTBOX_REDIS_PORT": str(port),
        "PYTHONPATH": str(REPO),
        **env,
    }
    run = stack.enter_context(watched([*argv, "tests.faults.jobs_outbox"], cwd=REPO, env=environ))
    assert run.started.wait(60), run.output
    return run


def test_a_replica_killed_between_send_and_mark_republishes_the_same_id_once(
    db_url, queue, tmp_path
):
    lease.migrate(lease.create_engine(db_url))
    with ExitStack() as stack:
        victim = replica(stack, db_url, queue, 6379, OUTBOX_PAUSE_AFTER_SEND="3")
        other = replica(stack, db_url, queue, 6379)
        before = victim.output.count("outbox-sent")
        # A send just announced: the victim waits 3 s before its mark. Kill it there.
        wait_for(lambda: victim.output.count("outbox-sent") > before, 60, "a send")
        victim.process.send_signal(signal.SIGKILL)
        killed_id = victim.output.split("outbox-sent ")[-1].split()[0]
        time.sleep(40)  # the victim's lease expires, its row's hold passes, a sweep runs
        wait_for(lambda: all(r["sent_ms"] is not None for r in rows(db_url)), 60, "all sent")
        assert other.process.poll() is None
    recorded = rows(db_url)
    ids = queued(queue)
    counts = Counter(ids)
    assert {r["id"] for r in recorded} <= set(ids)  # every recorded instant delivered
    assert counts[killed_id] == 2  # sent, killed before the mark, sent again: same id
    assert [i for i, n in counts.items() if n > 1] == [killed_id]


def test_redis_cut_off_for_20s_loses_no_instant(db_url, queue, tmp_path):
    lease.migrate(lease.create_engine(db_url))
    proxy = Proxy(("127.0.0.1", 6379))
    try:
        with ExitStack() as stack:
            replica(stack, db_url, queue, proxy.port)
            replica(stack, db_url, queue, proxy.port)
            wait_for(lambda: len(queued(queue)) >= 2, 60, "the first sends")
            proxy.cut()
            time.sleep(20)
            unsent = [r for r in rows(db_url) if r["sent_ms"] is None]
            assert len(unsent) >= 5  # instants kept coming, recorded, not sent
            proxy.restore()
            wait_for(lambda: all(r["sent_ms"] is not None for r in rows(db_url)), 120, "all sent")
        recorded = rows(db_url)
        counts = Counter(queued(queue))
        assert {r["id"] for r in recorded} == set(counts)
        # A duplicate only from a send cut in flight (its reply lost): never a clean one.
        tried = {r["id"] for r in recorded if r["tries"]}
        assert {i for i, n in counts.items() if n > 1} <= tried
        instants = sorted(int(r["instant_ms"]) for r in recorded)
        gaps = {b - a for a, b in itertools.pairwise(instants)}
        assert gaps == {2000}  # every instant of the run, none skipped
    finally:
        proxy.close()


def test_a_worker_killed_in_a_once_body_runs_it_after_the_stale_time(
    db_url, queue, redis_url, tmp_path
):
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
    # An id of the test's own: RQ keeps the job at rq:job:<id> whatever its queue, and
    # another run's queue.empty() would delete it (the worker then skips it).
    occ = f"occ-{uuid.uuid4().hex[:12]}"
    queue.enqueue_call(
        "tests.rq_tasks.counted_stale", args=("k",), kwargs={"sleep": 60}, job_id=occ
    )
    worker = subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: out.exists() and occ in out.read_text(), 60, "the body to start")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    burst = [*argv, "--burst"]
    queue.enqueue_call("tests.rq_tasks.counted_stale", args=("k",), job_id=occ)
    subprocess.run(burst, cwd=REPO, env=env, check=True, timeout=120, capture_output=True)
    bodies = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(bodies) == 1  # within the stale time: busy, not run
    time.sleep(15)  # past counted_stale's stale_after
    queue.enqueue_call("tests.rq_tasks.counted_stale", args=("k",), job_id=occ)
    subprocess.run(burst, cwd=REPO, env=env, check=True, timeout=120, capture_output=True)
    queue.enqueue_call("tests.rq_tasks.counted_stale", args=("k",), job_id=occ)
    subprocess.run(burst, cwd=REPO, env=env, check=True, timeout=120, capture_output=True)
    bodies = [json.loads(line) for line in out.read_text().splitlines()]
    assert [b["body"] for b in bodies] == [occ, occ]  # the dead one, then once more
