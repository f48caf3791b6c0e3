"""Backfill (``cronjob backfill``, `cronjob.admin.backfill`): the instants of a past range
that have no round on record run on the replicas, one at a time, oldest first, under the
job's lease, ``why`` ``'backfill'``; asking twice runs nothing more.

Two replicas on one fake clock and one database (each of the three in turn). Nothing
sleeps in real time.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from conftest import lease_row

import cronjob
from cronjob import Registry, Scheduler, Trigger, admin, schedules
from cronjob.admin import RequestState, Why
from cronjob.admin._cli import main
from cronjob.testing import FakeClock

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOURLY = "0 0 * * * *"


def at(hours: float = 0, minutes: float = 0, seconds: float = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes, seconds=seconds)


@dataclass(frozen=True)
class Seen:
    instant: datetime
    trigger: Trigger
    replica: str
    started: datetime
    ended: datetime | None = None


class Job:
    """Notes each round (instant, trigger, replica, start); lasts ``seconds`` on the fake
    clock; notes whether two rounds ever ran at once."""

    def __init__(self, clock: FakeClock, seconds: float = 0) -> None:
        self.clock = clock
        self.seconds = seconds
        self.seen: list[Seen] = []
        self.running = 0
        self.overlapped = False
        self._lock = threading.Lock()

    def __call__(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.running += 1
            self.overlapped = self.overlapped or self.running > 1
            self.seen.append(Seen(ctx.instant, ctx.trigger, ctx.replica, self.clock.now()))
        try:
            if self.seconds and ctx.wait(self.seconds):
                ctx.check()
        finally:
            with self._lock:
                self.running -= 1

    def instants(self, trigger: Trigger | None = None) -> list[datetime]:
        return [s.instant for s in self.seen if trigger is None or s.trigger is trigger]


def cluster(replicas: Callable[..., Scheduler], job: Job, spec: str = HOURLY) -> None:
    registry = Registry()
    registry.register(job, spec, "report")
    replicas(registry, "a")
    replicas(registry, "b")


def history(url: str) -> list[tuple[datetime, str, str]]:
    """(instant, why, outcome) of the job's rounds, oldest instant first."""
    return sorted((r.instant, str(r.why), str(r.outcome)) for r in admin.history(url, "report"))


class TestBackfill:
    def test_each_instant_without_a_round_runs_once_oldest_first_as_backfill(
        self, db_url, replicas, clock
    ):
        job = Job(clock)
        cluster(replicas, job)
        clock.advance(3600 + 5)  # 10:00 ran: the job's first instant (deployed 09:00)
        done = admin.backfill(
            db_url, "report", start=at(-3), end=at(2), by="ops@laptop", now=clock.now()
        )
        # 06:00 to 10:00 are before now; 10:00 ran: four owed; 11:00 is the schedule's.
        assert done.instants == 5 and done.queued == (at(-3), at(-2), at(-1), at(0))
        assert done.on_record == 1
        clock.advance(60)
        assert job.instants(Trigger.BACKFILL) == [at(-3), at(-2), at(-1), at(0)]
        clock.advance(3600)
        assert job.instants(Trigger.SCHEDULE) == [at(1), at(2)]
        assert history(db_url) == [
            (at(-3), "backfill", "succeeded"),
            (at(-2), "backfill", "succeeded"),
            (at(-1), "backfill", "succeeded"),
            (at(0), "backfill", "succeeded"),
            (at(1), "schedule", "succeeded"),
            (at(2), "schedule", "succeeded"),
        ]
        [record] = [r for r in admin.history(db_url, "report") if r.instant == at(-3)]
        assert (record.why, record.requested_by) == (Why.BACKFILL, "ops@laptop")
        # The schedule never moved: the row's claim is the schedule's latest.
        assert lease_row(db_url, "report").instant == at(2)
        assert not job.overlapped

    def test_asking_twice_runs_nothing_more(self, db_url, replicas, clock):
        job = Job(clock)
        cluster(replicas, job)
        clock.advance(3600 + 5)
        first = admin.backfill(db_url, "report", start=at(-2), end=at(1), now=clock.now())
        again = admin.backfill(db_url, "report", start=at(-2), end=at(1), now=clock.now())
        assert len(first.queued) == 3 and again.queued == () and again.on_record == 3
        clock.advance(60)
        after = admin.backfill(db_url, "report", start=at(-2), end=at(1), now=clock.now())
        assert after.queued == ()
        clock.advance(60)
        assert job.instants(Trigger.BACKFILL) == [at(-2), at(-1), at(0)]

    def test_it_runs_one_at_a_time_and_status_shows_it_while_it_runs(self, db_url, replicas, clock):
        job = Job(clock, seconds=20)
        cluster(replicas, job)
        clock.advance(3600 + 30)
        admin.backfill(db_url, "report", start=at(-3), end=at(0), now=clock.now())
        clock.advance(16)  # the sweep took the oldest: it runs for 20 s
        [report] = admin.status(db_url, now=clock.now()).jobs
        assert report.backfill_queued == 2 and report.backfilling == at(-3)
        assert report.requests == ()  # a backfill's instants are not requests for a round now
        clock.advance(120)
        assert job.instants(Trigger.BACKFILL) == [at(-3), at(-2), at(-1)]
        assert not job.overlapped
        starts = [s.started for s in job.seen if s.trigger is Trigger.BACKFILL]
        assert all(b - a >= timedelta(seconds=20) for a, b in itertools.pairwise(starts))
        [report] = admin.status(db_url, now=clock.now()).jobs
        assert report.backfill_queued == 0 and report.backfilling is None

    def test_a_backfill_overlapping_a_scheduled_instant_never_runs_it_twice_nor_at_once(
        self, db_url, replicas, clock
    ):
        """The range ends past now; its last instant before now is running on schedule
        when the backfill is asked: it waits for the lease, finds the round on record and
        runs nothing of that instant."""
        job = Job(clock, seconds=90)
        cluster(replicas, job)
        clock.advance(3600 + 10)  # 10:00 runs until 10:01:30
        done = admin.backfill(db_url, "report", start=at(-1), end=at(3), now=clock.now())
        assert done.queued == (at(-1), at(0), at(1))  # 10:00 has no round on record yet
        clock.advance(3600)
        assert sorted(job.instants()) == [at(-1), at(0), at(1), at(2)]
        assert [s.trigger for s in sorted(job.seen, key=lambda s: s.instant)] == [
            Trigger.BACKFILL,
            Trigger.BACKFILL,
            Trigger.SCHEDULE,
            Trigger.SCHEDULE,
        ]
        assert not job.overlapped
        closed = admin.requests(db_url, done.ids)
        assert [(r.instant, r.state, r.outcome) for r in closed] == [
            (at(-1), RequestState.DONE, "succeeded"),
            (at(0), RequestState.DONE, "succeeded"),
            (at(1), RequestState.DONE, "on record"),
        ]
        assert [r.why for r in admin.history(db_url, "report") if r.instant == at(1)] == [
            Why.SCHEDULE
        ]

    def test_an_instant_the_schedule_has_yet_to_pass_waits_for_it(self, db_url, replicas, clock):
        """Asked before the job's first claim, the instant just before now may still be
        claimed by the schedule's catch-up: it waits until a later instant came."""
        job = Job(clock)
        cluster(replicas, job)
        clock.advance(30 * 60)
        done = admin.backfill(db_url, "report", start=at(-2), end=at(1), now=clock.now())
        assert done.queued == (at(-2), at(-1), at(0))
        clock.advance(60)
        # 07:00 and 08:00 are past the schedule's reach; 09:00 is the latest instant.
        assert job.instants(Trigger.BACKFILL) == [at(-2), at(-1)]
        clock.advance(3600)
        assert job.instants(Trigger.BACKFILL) == [at(-2), at(-1), at(0)]
        assert job.instants(Trigger.SCHEDULE) == [at(1)]

    def test_a_range_over_the_limit_is_refused_and_nothing_is_written(
        self, db_url, replicas, clock
    ):
        job = Job(clock)
        cluster(replicas, job, spec="0 * * * * *")
        clock.advance(65)
        with pytest.raises(admin.BackfillTooLarge, match=r"more than 100 instants of job 'report'"):
            admin.backfill(db_url, "report", start=at(-3), end=at(0), now=clock.now(), limit=100)
        code = main(
            [
                "backfill",
                "report",
                "--from",
                at(-24 * 7).isoformat(),  # 10,080 instants
                "--to",
                at(0).isoformat(),
                "--database-url",
                db_url,
            ]
        )
        assert code == 2
        code = main(
            [
                "backfill",
                "report",
                "--from",
                at(-1).isoformat(),
                "--to",
                at(0).isoformat(),
                "--max",
                "60",
                "--database-url",
                db_url,
            ]
        )
        assert code == 0
        [report] = admin.status(db_url, now=clock.now()).jobs
        assert (report.backfill_queued, report.backfilling) == (60, None), report

    def test_a_backfill_cut_short_by_a_drain_runs_again_on_the_other_replica(
        self, db_url, replicas, clock
    ):
        job = Job(clock, seconds=30)
        registry = Registry()
        registry.register(job, HOURLY, "report")
        a = replicas(registry, "a")
        clock.advance(3600 + 45)  # 10:00 ran until 10:00:30
        admin.backfill(db_url, "report", start=at(-1), end=at(0), now=clock.now())
        clock.advance(15)
        assert [s.replica for s in job.seen if s.trigger is Trigger.BACKFILL] == ["a"]
        replicas(registry, "b")
        a.stop()
        clock.advance(120)
        assert [(s.instant, s.replica) for s in job.seen if s.trigger is Trigger.BACKFILL] == [
            (at(-1), "a"),
            (at(-1), "b"),
        ]
        outcomes = [
            (r.attempt, str(r.outcome))
            for r in admin.history(db_url, "report")
            if r.why is Why.BACKFILL
        ]
        assert sorted(outcomes) == [(1, "cut short"), (2, "succeeded")]

    def test_bad_input_is_refused_naming_the_job(self, db_url, replicas, clock):
        job = Job(clock)
        cluster(replicas, job)
        with pytest.raises(ValueError, match=r"^start .* must come before end"):
            admin.backfill(db_url, "report", start=at(1), end=at(0), now=clock.now())
        with pytest.raises(admin.UnknownJob, match="'nope'"):
            admin.backfill(db_url, "nope", start=at(-1), end=at(0), now=clock.now())

    def test_a_paused_job_s_backfill_waits_for_the_resume(self, db_url, replicas, clock):
        job = Job(clock)
        cluster(replicas, job)
        clock.advance(3600 + 5)
        admin.pause(db_url, "report", by="ops", now=clock.now())
        admin.backfill(db_url, "report", start=at(-2), end=at(0), now=clock.now())
        clock.advance(120)
        assert job.instants(Trigger.BACKFILL) == []
        [report] = admin.status(db_url, now=clock.now()).jobs
        assert report.backfill_queued == 2
        admin.resume(db_url, "report", by="ops", now=clock.now())
        clock.advance(30)
        assert job.instants(Trigger.BACKFILL) == [at(-2), at(-1)]

    def test_a_per_instance_job_is_refused(self, db_url, replicas, clock):
        registry = Registry()
        registry.register_per_instance(Job(clock), HOURLY, "local")
        replicas(registry, "a")
        clock.advance(5)
        with pytest.raises(ValueError, match=r"^job 'local' runs on every replica, without a"):
            admin.backfill(db_url, "local", start=at(-2), end=at(0), now=clock.now())

    def test_a_schedule_made_of_data_is_backfilled_by_its_id_with_its_args(
        self, db_url, replicas, clock
    ):
        seen: list[tuple[datetime, dict[str, object]]] = []

        def sync(ctx: cronjob.Round) -> None:
            seen.append((ctx.instant, ctx.args))

        registry = Registry()
        registry.register_task(sync, "sync")
        replicas(registry, "a")
        replicas(registry, "b")
        engine = sa.create_engine(db_url)
        try:
            schedules.add(engine, "tenant-1", task="sync", spec=HOURLY, args={"t": 1})
        finally:
            engine.dispose()
        clock.advance(3600 + 5)
        done = admin.backfill(db_url, "tenant-1", start=at(-2), end=at(1), now=clock.now())
        assert done.queued == (at(-2), at(-1), at(0))
        clock.advance(60)
        assert sorted(seen) == [(at(m), {"t": 1}) for m in (-2, -1, 0, 1)]
