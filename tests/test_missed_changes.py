"""Missed instants after a schedule's change: only the schedule as it has been since
its change took effect is counted — a registered job's spec since it was deployed, a
schedule made of data since the row changed (its spec, or a window moved while it ran).

Replicas on one fake clock and one database (each of the three in turn); nothing sleeps.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

import cronjob
import lease
from cronjob import Registry, admin, schedules
from cronjob.admin._missed import MISSED_GRACE
from cronjob.testing import FakeClock
from tests.conftest import lease_row

#: A Monday, on the hour (the ``clock`` fixture's start).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = "0 * * * * *"
EVERY_TEN = "0 */10 * * * *"


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


def quiet(ctx: cronjob.Round) -> None:
    """A job that does nothing."""


def job_status(url: str, clock: FakeClock, name: str) -> admin.JobStatus:
    return next(job for job in admin.status(url, now=clock.now()).jobs if job.name == name)


class TestARegisteredJobsSpec:
    def test_a_new_spec_counts_from_its_deployment(self, db_url, clock):
        """'report' ran every ten minutes from 09:00; its new release, every minute, is
        deployed at 11:00: the minutes before were never its to run."""
        old, new = Registry(), Registry()
        old.register(quiet, EVERY_TEN, "report")
        new.register(quiet, MINUTELY, "report")
        with cronjob.Scheduler(db_url, registry=old, clock=clock, replica_id="a"):
            clock.advance(2 * 3600 - 30)  # through 10:59:30
        clock.advance(30)
        with cronjob.Scheduler(db_url, registry=new, clock=clock, replica_id="b"):
            clock.advance(10 * 60 + 30)  # 11:10:30: every minute since 11:00 ran
            job = job_status(db_url, clock, "report")
            assert (job.spec, job.missed, job.problems) == (MINUTELY, 0, ())
            assert admin.status(db_url, now=clock.now()).healthy


def backdate(url: str, id_: str, hours: int) -> None:
    """Make schedule ``id_`` look added ``hours`` earlier, as the database's clock reads."""
    engine = lease.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE cronjob_schedule SET created_ms = created_ms - :ms WHERE id = :id"),
                {"ms": hours * 3_600_000, "id": id_},
            )
    finally:
        engine.dispose()


def real_now() -> datetime:
    """The database's clock, about: a schedule's change is stamped on it."""
    return datetime.now(UTC).replace(microsecond=0)


def minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


class TestASchedulesChange:
    """A schedule's rows are stamped on the database's clock: the fake clock runs about
    it, and the schedule is made to look added an hour before."""

    def test_a_window_moved_while_it_runs_counts_from_the_move(self, db_url, replicas):
        """'r:1' every minute from 10 minutes ago; its start then moves 30 minutes back:
        those minutes were not its instants when they came."""
        now = real_now()
        clock = FakeClock(now - timedelta(minutes=40))
        registry = Registry()
        registry.register_task(quiet, "report")
        registry.register(quiet, "0 0 0 * * *", "daily")
        with cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="a"):
            schedules.add(
                db_url, "r:1", task="report", spec=MINUTELY, start=now - timedelta(minutes=10)
            )
            backdate(db_url, "r:1", 1)
            clock.advance(40 * 60)
            assert schedules.update(db_url, "r:1", start=now - timedelta(minutes=40))
            moved = lease_row(db_url, "r:1").spec_changed
            assert moved is not None and now <= moved <= real_now() + timedelta(seconds=1)
            clock.advance(10 * 60 + 30)
            job = next(j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "r:1")
        assert (job.missed, job.problems) == (0, ())

    def test_a_spec_changed_while_no_replica_ran_counts_its_own_instants(self, db_url):
        """'r:1' ran every ten minutes; every replica is down when its spec becomes every
        minute; 3.5 minutes on (by the minute), of the new spec the first two minutes did
        not run (the third is within the grace)."""
        now = real_now()
        clock = FakeClock(now - timedelta(minutes=40))
        registry = Registry()
        registry.register_task(quiet, "report")
        registry.register(quiet, "0 0 0 * * *", "daily")
        with cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="a"):
            schedules.add(db_url, "r:1", task="report", spec=EVERY_TEN)
            backdate(db_url, "r:1", 1)
            clock.advance(20 * 60)
        assert schedules.update(db_url, "r:1", spec=MINUTELY)
        changed = lease_row(db_url, "r:1").spec_changed
        assert changed is not None and now <= changed <= real_now() + timedelta(seconds=1)
        clock.advance(
            (minute(changed) + timedelta(minutes=3, seconds=30) - clock.now()).total_seconds()
        )
        assert timedelta(seconds=60) == MISSED_GRACE
        job = next(j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "r:1")
        assert job.missed == 2
        assert job.problems[-1] == "missed: 2 instants of the last day did not run"
