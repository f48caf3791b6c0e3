"""The Redis Stream target under faults, with real ``cronjob run`` processes: a replica
SIGKILLed between its XADD and the outbox's mark, then started again, and Redis itself
stopped for 20 s. The stream holds exactly one entry per occurrence, counted with
XRANGE: the dedup key makes the republish of a sent entry a clean duplicate.

Stopping Redis stops it for every user of 127.0.0.1:6379: it is shut down with SAVE and
started again in the same directory (as ``scripts/test`` starts it), so other keys
survive. That test is marked ``restart``: scripts/test runs it with the database server
restarts, in a run of their own, before any other test."""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

import lease
from tests._process import drained
from tests.faults._outbox_targets import Stream
from tests.faults.test_outbox_faults import replica, rows, sent_after, wait_for

pytestmark = pytest.mark.faults

DATABASES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def target(redis_url: str) -> Iterator[Stream]:
    made = Stream(redis_url)
    yield made
    made.close()


def exactly_once(db_url: str, target: Stream) -> list[dict[str, object]]:
    """Every recorded occurrence is sent, on the stream once, and nothing else is."""
    recorded = rows(db_url)
    assert all(r["sent_ms"] is not None for r in recorded)
    counts = Counter(target.ids())
    assert {r["id"] for r in recorded} == set(counts)
    assert [i for i, n in counts.items() if n > 1] == []
    return recorded


def test_a_replica_killed_between_xadd_and_mark_leaves_one_entry_per_occurrence(db_url, target):
    lease.migrate(lease.create_engine(db_url))
    with ExitStack() as stack:
        victim = replica(stack, db_url, target, target.port, OUTBOX_PAUSE_AFTER_SEND="3")
        other = replica(stack, db_url, target, target.port)
        before = victim.output.count("outbox-sent")
        # A send just returned: the entry is on the stream, the victim waits 3 s before
        # its mark. Kill it there.
        wait_for(lambda: victim.output.count("outbox-sent") > before, 60, "a send")
        victim.process.send_signal(signal.SIGKILL)
        killed_id = victim.output.split("outbox-sent ")[-1].split()[0]
        [row] = [r for r in rows(db_url) if r["id"] == killed_id]
        assert row["sent_ms"] is None  # on the stream, unmarked
        # The other replica's sweep sends it again: a clean duplicate, marked sent.
        wait_for(lambda: sent_after(other, killed_id), 60, "a round after the resend")
        # The victim started again takes its share of the rounds.
        again = replica(stack, db_url, target, target.port)
        started = again.output.count("outbox-sent")
        wait_for(lambda: again.output.count("outbox-sent") > started, 60, "a send of the restart")
        wait_for(lambda: all(r["sent_ms"] is not None for r in rows(db_url)), 60, "all sent")
        assert other.process.poll() is None
        drained(other, again)  # their rounds in flight, if any, sent and marked
    recorded = exactly_once(db_url, target)
    assert killed_id in {r["id"] for r in recorded}


def _redis(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["redis-cli", "-p", "6379", *args], capture_output=True, text=True)


def _start_redis(directory: str) -> None:
    """Start Redis as ``scripts/test`` does, in ``directory`` (its dump is loaded)."""
    subprocess.run(
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            "6379",
            "--daemonize",
            "yes",
            "--dir",
            directory,
        ],
        check=True,
        capture_output=True,
    )
    wait_for(lambda: _redis("ping").stdout.strip() == "PONG", 30, "Redis to start")


@pytest.mark.restart  # stops the shared Redis: in the run of the server restarts, first
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_redis_stopped_for_20s_every_occurrence_arrives_once(db_url, target):
    lease.migrate(lease.create_engine(db_url))
    directory = _redis("config", "get", "dir").stdout.split()[1]
    with ExitStack() as stack:
        runs = [replica(stack, db_url, target, target.port) for _ in range(2)]
        wait_for(lambda: target.count() >= 2, 60, "the first entries")
        # SAVE: the entries so far, and every other user's keys, come back with it.
        _redis("shutdown", "save")
        try:
            time.sleep(20)
            unsent = [r for r in rows(db_url) if r["sent_ms"] is None]
            assert len(unsent) >= 5  # instants kept coming, recorded, not sent
        finally:
            _start_redis(directory)
        wait_for(lambda: all(r["sent_ms"] is not None for r in rows(db_url)), 120, "all sent")
        drained(*runs)  # stopped, not killed: a row recorded after the wait is sent
    recorded = exactly_once(db_url, target)
    instants = sorted(int(r["instant_ms"]) for r in recorded)
    gaps = {b - a for a, b in itertools.pairwise(instants)}
    assert gaps == {2000}  # every instant of the run, none skipped
