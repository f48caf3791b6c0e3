"""Missed instants: `JobStatus.missed` counts the instants of the last day, after the
job's deployment, that no round ran or accounted for (overrun, paused, given up, missed
deadline, outside a schedule's start/end); any makes `status` unhealthy (the command
exits non-zero), the page shows them, and a backfill of them clears them.

Two replicas on one fake clock and one database (each of the three in turn). Nothing
sleeps in real time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

import cronjob
from cronjob import Registry, Scheduler, admin, schedules
from cronjob._jitter import jitter_delay
from cronjob.admin import _page
from cronjob.admin._cli import main
from cronjob.admin._missed import MISSED_GRACE
from cronjob.testing import FakeClock

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = "0 * * * * *"
HOURLY = "0 0 * * * *"


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


class Job:
    """Counts its rounds; lasts ``seconds`` on the fake clock; fails if told."""

    def __init__(self, seconds: float = 0, *, fail: bool = False) -> None:
        self.seconds = seconds
        self.fail = fail
        self.instants: list[datetime] = []
        self._lock = threading.Lock()

    def __call__(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.instants.append(ctx.instant)
        if self.seconds and ctx.wait(self.seconds):
            ctx.check()
        if self.fail:
            raise RuntimeError("downstream is down")


def two(replicas: Callable[..., Scheduler], registry: Registry) -> list[Scheduler]:
    return [replicas(registry, "a"), replicas(registry, "b")]


def report(url: str, clock: FakeClock, name: str = "report") -> admin.JobStatus:
    return next(job for job in admin.status(url, now=clock.now()).jobs if job.name == name)


class TestMissed:
    def test_a_job_that_ran_every_instant_missed_none_and_none_before_its_deployment(
        self, db_url, replicas, clock
    ):
        """Deployed at 09:00: the day before is not its to have run."""
        registry = Registry()
        registry.register(Job(), MINUTELY, "report")
        two(replicas, registry)
        clock.advance(30 * 60 + 30)
        job = report(db_url, clock)
        assert job.missed == 0 and job.problems == ()
        assert admin.status(db_url, now=clock.now()).healthy

    def test_instants_while_every_replica_is_down_are_missed_and_status_says_so(
        self, db_url, replicas, clock, capsys
    ):
        registry = Registry()
        registry.register(Job(), MINUTELY, "report")
        started = two(replicas, registry)
        clock.advance(10 * 60 + 30)  # 09:01 to 09:10 ran
        for scheduler in started:
            scheduler.stop()
        clock.advance(10 * 60)  # 09:20:30: 09:11 to 09:19 came (09:20 is within the grace)
        job = report(db_url, clock)
        assert job.missed == 9
        assert "missed: 9 instants of the last day did not run" in job.problems
        status = admin.status(db_url, now=clock.now())
        assert not status.healthy
        front = _page.jobs_page(status, "")
        assert "missed: 9 instants of the last day did not run" in front
        page = _page.job_page(job, [], "", failed=False, checked_at=clock.now())
        assert "Missed instants (last day)" in page

    def test_a_backfill_of_the_missed_instants_clears_them(self, db_url, replicas, clock):
        registry = Registry()
        job = Job()
        registry.register(job, MINUTELY, "report")
        started = two(replicas, registry)
        clock.advance(5 * 60 + 30)
        for scheduler in started:
            scheduler.stop()
        clock.advance(5 * 60)  # 09:10:30: 09:06 to 09:09 missed
        assert report(db_url, clock).missed == 4
        two(replicas, registry)  # the catch-up runs 09:10, the latest: the rest skipped
        clock.advance(15)
        found = report(db_url, clock)
        assert (found.missed, found.skipped) == (0, 4)
        done = admin.backfill(db_url, "report", start=at(1), end=at(11), now=clock.now())
        assert done.queued == (at(6), at(7), at(8), at(9))
        clock.advance(60)
        found = report(db_url, clock)
        assert (found.missed, found.skipped) == (0, 0)
        assert sorted(job.instants) == [at(m) for m in range(1, 12)]

    def test_overrun_instants_are_accounted_for(self, db_url, replicas, clock):
        """Each round lasts 150 s: two instants of three come while one runs."""
        registry = Registry()
        job = Job(seconds=150)
        registry.register(job, MINUTELY, "report")
        two(replicas, registry)
        clock.advance(20 * 60 + 30)
        assert len(job.instants) < 10
        assert report(db_url, clock).missed == 0

    def test_instants_while_paused_are_accounted_for(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(Job(), MINUTELY, "report")
        two(replicas, registry)
        clock.advance(3 * 60 + 30)
        admin.pause(db_url, "report", by="ops", now=clock.now())
        clock.advance(5 * 60)
        assert report(db_url, clock).missed == 0  # paused now
        admin.resume(db_url, "report", by="ops", now=clock.now())
        clock.advance(5 * 60)
        job = report(db_url, clock)
        assert job.missed == 0 and job.problems == ()

    def test_failed_rounds_are_not_missed(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(Job(fail=True), MINUTELY, "report")
        two(replicas, registry)
        clock.advance(5 * 60 + 30)
        job = report(db_url, clock)
        assert job.missed == 0 and job.consecutive_failures == 5

    def test_a_schedule_outside_its_start_and_end_missed_nothing_then(
        self, db_url, replicas, clock
    ):
        registry = Registry()
        job = Job()
        registry.register_task(job, "sync")
        two(replicas, registry)
        engine = sa.create_engine(db_url)
        try:
            schedules.add(engine, "tenant-1", task="sync", spec=MINUTELY, start=at(2), end=at(5))
        finally:
            engine.dispose()
        clock.advance(20 * 60)
        found = report(db_url, clock, "tenant-1")
        assert found.missed == 0 and len(job.instants) == 4

    def test_a_jittered_instant_is_not_missed_before_its_delayed_start_and_grace(
        self, db_url, replicas, clock
    ):
        """Hourly with a 15-minute jitter: 10:00's round starts at 10:10:38.925 (the
        delay drawn for ``report``), so at 10:05 it has not started and is not missed;
        once its delayed start and the grace are past with no round, it is."""
        registry = Registry()
        job = Job()
        registry.register(job, HOURLY, "report", jitter=900)
        started = two(replicas, registry)
        ten, eleven = at(60), at(120)
        delay = jitter_delay("report", ten, timedelta(seconds=900), eleven)
        assert delay == timedelta(minutes=10, seconds=38.925)
        clock.advance_to(at(65))  # past 10:00 and the 60 s grace, before its start
        # A replica of a rolling deploy: status reads the jitter from a live replica's
        # record (on the idle fake clock the first two are no longer seen as live).
        started.append(replicas(registry, "c"))
        clock.advance(0)  # its record written
        found = report(db_url, clock)
        assert found.policies == {"jitter": 900.0}
        assert (found.missed, found.problems) == (0, ())
        assert admin.status(db_url, now=clock.now()).healthy
        clock.advance_to(ten + delay + timedelta(seconds=1))
        assert job.instants == [ten]
        assert report(db_url, clock).missed == 0
        for scheduler in started:
            scheduler.stop()
        late = jitter_delay("report", eleven, timedelta(seconds=900), at(180))
        clock.advance_to(eleven + late + MISSED_GRACE + timedelta(seconds=1))
        assert report(db_url, clock).missed == 1  # no replica ran it

    def test_the_status_command_exits_non_zero_and_names_them(
        self, db_url, replicas, clock, capsys
    ):
        registry = Registry()
        registry.register(Job(), MINUTELY, "report")
        started = two(replicas, registry)
        clock.advance(60 + 30)
        for scheduler in started:
            scheduler.stop()
        clock.advance(3 * 60)
        code = main(["status", "--database-url", db_url])
        err = capsys.readouterr().err
        assert code == 1
        assert "report: missed: " in err

    def test_status_reads_the_history_in_two_statements_whatever_the_number_of_jobs(
        self, db_url, replicas, clock
    ):
        """One counts every job's instants on record; one reads the day's rows of the
        jobs that fall short (per 500 of them)."""
        registry = Registry()
        for n in range(60):
            registry.register(Job(), MINUTELY, f"job-{n:02d}")
        started = two(replicas, registry)
        clock.advance(3 * 60 + 30)
        for scheduler in started:
            scheduler.stop()
        clock.advance(3 * 60)
        engine = sa.create_engine(db_url)
        sent: list[str] = []

        def count(conn, cursor, statement, *args):
            if "cronjob_round" in statement:
                sent.append(statement)

        sa.event.listen(engine, "before_cursor_execute", count)
        try:
            jobs = admin.status(engine, now=clock.now()).jobs
        finally:
            sa.event.remove(engine, "before_cursor_execute", count)
            engine.dispose()
        assert [job.missed for job in jobs] == [2] * 60  # 09:04, 09:05
        assert len(sent) == 2
