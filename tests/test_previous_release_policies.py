"""A replica of release 0010 beside one of this release, both registering one task, on a
database migrated to this release's head (0011 brought a schedule's own policies): the
rolling deploy of issue #39.

Release 0010 (commit `RELEASE_0010`, the last before schedule policies) knows schedules
made of data but not their policies: it would run a schedule while ignoring them. A row
with policies of its own is written in format 2, which it runs not, so:

- the schedule without policies runs once per instant, on whichever release claims it;
- the schedule with policies runs once per instant, only ever on this release's replica,
  whose rounds start at the instant plus the schedule's own jitter; release 0010 never
  holds its lease, and says once, in its log, that it leaves it to the release that
  wrote it;
- neither replica crashes or logs a traceback.

Real time on purpose, as in ``test_previous_release.py``: the replicas are other processes
on the wall clock. The assertions are about which rounds ran, where, and what the rows
hold, never about how long something took.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lease
from cronjob import schedules
from tests._process import Watched
from tests.test_previous_release import (
    EVERY_SECOND,
    REPORT_TASK,
    SHARED_JOB,
    _holder,
    _rounds,
    _wait,
    build_release,
    running_beside,
    stopped_cleanly,
)

#: The last commit before schedule policies: alembic head 0010.
RELEASE_0010 = "f813976"
#: How long both releases run the schedules before they are looked at.
WINDOW = 6.0
#: The policied schedule's own jitter (seconds): its rounds start this much late, at most.
JITTER = 0.5


@pytest.fixture(scope="session")
def release_0010(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_release(RELEASE_0010, "0010", tmp_path_factory)


@pytest.fixture
def both_releases(
    db_url: str, tmp_path: Path, release_0010: Path
) -> Iterator[tuple[Watched, Watched, Path]]:
    """One ``cronjob run`` of each release on the database at head, both registering task
    ``report``: (0010, this, the log of rounds). Stopped with SIGTERM after the test."""
    both = ["shared_job", "report_task"]
    modules = {"shared_job": SHARED_JOB, "report_task": REPORT_TASK}
    with running_beside(
        db_url, tmp_path, release_0010, modules=modules, old=both, new=both
    ) as running:
        yield running


def test_release_0010_never_runs_a_schedule_whose_policies_it_cannot_honour(db_url, both_releases):
    old, new, log = both_releases
    new_holder = _holder(new)
    assert "newer than this release's 0010" in old.output, old.output
    engine = lease.create_engine(db_url)
    store = lease.LeaseStore(engine)
    ids = ["plain", "policied"]
    try:
        schedules.add(engine, "plain", task="report", spec=EVERY_SECOND)
        schedules.add(
            engine, "policied", task="report", spec=EVERY_SECOND, jitter=JITTER, overlap="skip"
        )
        added = time.time()
        holders: dict[str, set[str | None]] = {id_: set() for id_ in ids}
        deadline = time.monotonic() + WINDOW
        while time.monotonic() < deadline:
            for id_, row in store.read(ids).items():
                holders[id_].add(row.holder)
            _wait(0.2)
        stopped = time.time()
    finally:
        engine.dispose()

    rounds = [r for r in _rounds(log) if r["id"] in ids]
    pairs = collections.Counter((r["id"], r["instant"]) for r in rounds)
    assert [pair for pair, n in pairs.items() if n > 1] == [], "an instant ran twice"
    for id_ in ids:
        instants = sorted(float(str(r["instant"])) for r in rounds if r["id"] == id_)
        window = [t for t in instants if added + 2 <= t <= stopped - 2]
        assert window, (id_, instants)
        assert window == [window[0] + i for i in range(len(window))], (id_, "missed", instants)
    policied = [r for r in rounds if r["id"] == "policied"]
    assert {r["release"] for r in policied} == {"this"}, policied
    assert holders["policied"] <= {None, new_holder}, holders
    # Its own jitter: each round started after its instant, within the jitter (and the
    # log line's write after), never a second late.
    assert all(0 <= float(str(r["t"])) - float(str(r["instant"])) < 1 for r in policied)
    line = "schedule 'policied' is written in format 2, and this release runs format 1 at most"
    assert line in old.output, old.output

    # Neither crashed; the previous release logged no error but that line and claims that
    # died in a MariaDB deadlock (see test_previous_release.py: the other release claimed).
    assert stopped_cleanly(old, new, "written in format 2") == []
