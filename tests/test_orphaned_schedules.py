"""A schedule naming a task no replica registers is told: once per task in each replica's
log, with how many schedules name it, and as ``orphaned`` in ``cronjob status``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import admin, schedules
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = "0 * * * * *"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = lease.create_engine(db_url)
    lease.migrate(engine)
    yield engine
    engine.dispose()


def _report(ctx: cronjob.Round) -> None:
    """The task the replicas register."""


def _told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "which this replica does not register" in r.getMessage()
    ]


class TestTheLog:
    def test_each_unknown_task_is_logged_once_per_replica_with_its_count(
        self, engine, replicas, clock, caplog
    ):
        caplog.set_level(logging.INFO, logger="cronjob")
        for tenant in range(3):
            schedules.add(engine, f"gone:{tenant}", task="gone", spec=MINUTELY)
        schedules.add(engine, "missing:1", task="missing", spec=MINUTELY)
        schedules.add(engine, "report:1", task="report", spec=MINUTELY)
        registry = cronjob.Registry()
        registry.register_task(_report, "report")
        replicas(registry, "a")
        clock.advance(5)
        note = (
            "{} schedule(s) name task {!r}, which this replica does not register: only a "
            "replica that registers it runs them (cronjob status shows them as orphaned "
            "when none does)"
        )
        assert _told(caplog) == [note.format(3, "gone"), note.format(1, "missing")]
        # More of a task already told: not told again; a new task is.
        schedules.add(engine, "gone:9", task="gone", spec=MINUTELY)
        schedules.add(engine, "typo:1", task="reprot", spec=MINUTELY)
        clock.advance(5)
        assert _told(caplog)[2:] == [note.format(1, "reprot")]
        replicas(registry, "b")
        clock.advance(5)
        assert _told(caplog)[3:] == [
            note.format(4, "gone"),
            note.format(1, "missing"),
            note.format(1, "reprot"),
        ]


class TestTheStatus:
    def test_a_schedule_no_live_replica_runs_is_orphaned_not_idle(
        self, engine, replicas, clock, db_url
    ):
        registry = cronjob.Registry()
        registry.register_task(_report, "report")
        replicas(registry, "a")
        schedules.add(engine, "report:1", task="report", spec=MINUTELY)
        schedules.add(engine, "orphan:1", task="gone", spec=MINUTELY)
        clock.advance(20.5)
        jobs = {job.name: job for job in admin.status(db_url, now=clock.now()).jobs}
        assert jobs["orphan:1"].activity is admin.Activity.ORPHANED
        assert jobs["orphan:1"].problems == ("no replica runs task gone",)
        assert jobs["report:1"].activity is admin.Activity.IDLE
