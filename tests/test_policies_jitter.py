"""The ``jitter=`` policy: each round starts after a delay drawn from a hash of (name,
instant), the same on every replica and after every restart, below ``jitter`` and below
the gap to the job's next instant; ``ctx.instant`` stays nominal.

Replicas on one fake clock and one database (each of the three in turn). Nothing sleeps
in real time.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import redirect_stdout
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import Registry, admin, schedules
from cronjob._jitter import jitter_delay
from cronjob.admin import Why
from cronjob.admin._cli import main
from cronjob.testing import FakeClock

#: A Monday, on the hour (the ``clock`` fixture's start).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
EVERY_MINUTE = "0 * * * * *"
EVERY_SECOND = "* * * * * *"


def at(minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


def delay(name: str, instant: datetime, jitter: float, gap: float) -> timedelta:
    return jitter_delay(name, instant, timedelta(seconds=jitter), instant + timedelta(seconds=gap))


def fine(ctx: cronjob.Round) -> None:
    """A job that does nothing, well."""


class Starts:
    """A job that notes each round: its replica, nominal instant and when it started."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.seen: list[tuple[str, datetime, datetime]] = []
        self._lock = threading.Lock()

    def __call__(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.seen.append((ctx.replica, ctx.instant, self.clock.now()))


class TestJitterDelay:
    def test_it_is_below_the_jitter_and_the_same_every_time(self):
        drawn = [delay("sync", at(m), 30, 60) for m in range(200)]
        assert all(timedelta(0) <= d < timedelta(seconds=30) for d in drawn)
        assert drawn == [delay("sync", at(m), 30, 60) for m in range(200)]
        assert len(set(drawn)) > 150  # spread, not one value
        # Whole milliseconds, as the lease table and the history keep times.
        assert all(d % timedelta(milliseconds=1) == timedelta(0) for d in drawn)

    def test_it_differs_by_name_and_by_instant(self):
        assert delay("a", at(1), 3600, 7200) != delay("b", at(1), 3600, 7200)
        assert delay("a", at(1), 3600, 7200) != delay("a", at(2), 3600, 7200)

    def test_it_is_capped_by_the_gap_to_the_next_instant(self):
        """An every-second job with jitter=5s: every delay is below one second."""
        drawn = [delay("tick", at(0, s), 5, 1) for s in range(500)]
        assert all(d < timedelta(seconds=1) for d in drawn)
        assert max(drawn) > timedelta(seconds=0.9)  # the whole second is used

    def test_a_gap_of_a_millisecond_or_less_gives_no_delay(self):
        assert delay("tick", at(1), 5, 0.001) == timedelta(0)
        assert delay("tick", at(1), 5, 0.0005) == timedelta(0)
        assert delay("tick", at(1), 5, 0) == timedelta(0)
        assert delay("tick", at(1), 0.0005, 60) == timedelta(0)

    def test_a_gap_of_a_millisecond_and_a_half_keeps_it_below(self):
        drawn = {delay(f"j{i}", at(1), 5, 0.0015) for i in range(50)}
        assert drawn == {timedelta(0), timedelta(milliseconds=1)}

    def test_without_a_next_instant_only_the_jitter_bounds_it(self):
        got = jitter_delay("once", at(1), timedelta(seconds=10), None)
        assert timedelta(0) <= got < timedelta(seconds=10)

    def test_it_does_not_depend_on_the_time_zone_the_instant_is_written_in(self):
        paris = at(1).astimezone(ZoneInfo("Europe/Paris"))
        assert delay("sync", paris, 30, 60) == delay("sync", at(1), 30, 60)

    def test_it_is_the_same_in_another_process_with_another_hash_seed(self):
        """Not Python's ``hash()``: salted per process, replicas would disagree."""
        code = (
            "from datetime import datetime, timedelta, timezone\n"
            "from cronjob._jitter import jitter_delay\n"
            "t = datetime(2026, 3, 2, 9, 1, tzinfo=timezone.utc)\n"
            "print(jitter_delay('sync', t, timedelta(seconds=30), t + timedelta(minutes=1))"
            " // timedelta(microseconds=1))\n"
        )
        here = delay("sync", at(1), 30, 60) // timedelta(microseconds=1)
        for seed in ("1", "2"):
            out = subprocess.run(
                [sys.executable, "-c", code],
                env={**os.environ, "PYTHONHASHSEED": seed},
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
            assert int(out) == here


class TestRegistration:
    def test_it_must_be_a_positive_duration(self):
        with pytest.raises(
            cronjob.RegistrationError, match=r"^job 'sync': jitter must be positive, got 0$"
        ):
            Registry().register(fine, EVERY_MINUTE, "sync", jitter=0)
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^job 'sync': jitter must be seconds \(a number\) or a timedelta, got '5s'$",
        ):
            Registry().register(fine, EVERY_MINUTE, "sync", jitter="5s")  # type: ignore[arg-type]

    def test_it_is_described_and_shown(self):
        registry = Registry()
        registry.register(fine, EVERY_MINUTE, "sync", jitter=timedelta(minutes=2))
        [job] = registry.jobs
        assert job.policy.describe() == {"jitter": 120.0}
        assert cronjob._policy.policy_text(job.policy.describe()) == "jitter 2m"


class TestJitteredRounds:
    def test_two_replicas_start_the_round_once_at_its_instant_plus_the_delay(
        self, db_url, replicas, clock
    ):
        job = Starts(clock)
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "sync", jitter=30)
        replicas(registry, "a")
        replicas(registry, "b")
        first = at(1) + delay("sync", at(1), 30, 60)
        assert first > at(1)
        clock.advance_to(first - timedelta(microseconds=1))
        assert job.seen == []  # the instant has passed, its delay not yet
        clock.advance_to(first)
        assert [(instant, started) for _, instant, started in job.seen] == [(at(1), first)]
        second = at(2) + delay("sync", at(2), 30, 60)
        clock.advance_to(at(3))
        assert [(instant, started) for _, instant, started in job.seen] == [
            (at(1), first),
            (at(2), second),
        ]
        history = [(r.instant, r.why, r.started) for r in reversed(admin.history(db_url, "sync"))]
        assert history == [(at(1), Why.SCHEDULE, first), (at(2), Why.SCHEDULE, second)]

    def test_a_replica_started_within_the_delay_starts_it_at_the_same_moment(
        self, db_url, replicas, clock
    ):
        """The delay survives a restart: not caught up at start, run at instant+delay."""
        job = Starts(clock)
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "sync", jitter=50)
        old = replicas(registry, "a")
        clock.advance_to(at(1, 55))
        ran = len(job.seen)
        old.stop()
        # 09:02's delay, drawn by a process that has not started yet, and a start within it.
        start = at(2) + delay("sync", at(2), 50, 60)
        assert start > at(2, 1)
        clock.advance_to(at(2, 1))
        replicas(registry, "new")
        replicas(registry, "other")
        clock.advance_to(start - timedelta(microseconds=1))
        assert len(job.seen) == ran  # not caught up at start
        clock.advance_to(start)
        assert job.seen[ran:] == [(job.seen[ran][0], at(2), start)]
        assert job.seen[ran][0] in ("new", "other")
        clock.advance_to(at(2, 59))
        assert len(job.seen) == ran + 1
        [record] = [r for r in admin.history(db_url, "sync") if r.instant == at(2)]
        assert (record.why, record.started) == (Why.SCHEDULE, start)

    def test_a_replica_started_after_the_delay_catches_the_instant_up_at_once(
        self, db_url, replicas, clock
    ):
        job = Starts(clock)
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "sync", jitter=5)
        old = replicas(registry, "a")
        clock.advance_to(at(1, 10))
        old.stop()
        clock.advance_to(at(2, 30))  # 09:02 and its delay passed with no replica up
        replicas(registry, "b")
        clock.advance(0)
        assert job.seen[-1] == ("b", at(2), at(2, 30))
        [record] = [r for r in admin.history(db_url, "sync") if r.instant == at(2)]
        assert record.why == Why.CATCH_UP

    def test_an_every_second_job_with_a_longer_jitter_runs_each_instant_before_the_next(
        self, db_url, replicas, clock
    ):
        """Jitter against the next instant: jitter=5s on an every-second job."""
        job = Starts(clock)
        registry = Registry()
        registry.register(job, EVERY_SECOND, "tick", jitter=5)
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance_to(at(0, 20))
        seconds = [at(0, s) for s in range(1, 20)]
        runs = [(instant, started) for _, instant, started in job.seen]
        assert [instant for instant, _ in runs] == seconds  # each once, in order, none lost
        for instant, started in runs:
            assert started == instant + delay("tick", instant, 5, 1)
            assert instant <= started < instant + timedelta(seconds=1)
        assert len(admin.history(db_url, "tick", limit=100)) == 19

    def test_the_start_deadline_runs_from_the_delayed_start(self, db_url, replicas, clock):
        job = Starts(clock)
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "sync", jitter=30, start_deadline=1)
        replicas(registry, "a")
        clock.advance_to(at(1, 59))
        [(_, instant, started)] = job.seen
        assert (instant, started) == (at(1), at(1) + delay("sync", at(1), 30, 60))
        assert started - instant > timedelta(seconds=1)  # past the deadline from the instant
        [record] = admin.history(db_url, "sync")
        assert record.outcome == admin.Outcome.SUCCEEDED

    def test_a_per_instance_job_starts_at_the_same_delay_on_every_replica(
        self, db_url, replicas, clock
    ):
        job = Starts(clock)
        registry = Registry()
        registry.register_per_instance(job, EVERY_MINUTE, "local", jitter=20)
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance_to(at(1, 59))
        start = at(1) + delay("local", at(1), 20, 60)
        assert sorted(job.seen) == [("a", at(1), start), ("b", at(1), start)]

    def test_a_drain_within_the_delay_starts_nothing_and_claims_nothing(
        self, db_url, replicas, clock
    ):
        job = Starts(clock)
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "sync", jitter=50)
        scheduler = replicas(registry, "a")
        start = at(1) + delay("sync", at(1), 50, 60)
        clock.advance_to(at(1) + (start - at(1)) / 2)
        scheduler.stop()
        clock.advance_to(at(1, 59))
        assert job.seen == []
        assert admin.history(db_url, "sync") == []


class TestTaskJitter:
    @pytest.fixture
    def engine(self, db_url: str) -> Iterator[sa.Engine]:
        engine = lease.create_engine(db_url)
        lease.migrate(engine)
        yield engine
        engine.dispose()

    def test_each_data_schedule_of_a_task_starts_after_its_own_delay(self, engine, replicas, clock):
        """A task's jitter governs all its schedules, each drawn from its own name."""
        job = Starts(clock)
        registry = Registry()
        registry.register_task(job, "report", jitter=40)
        replicas(registry, "a")
        replicas(registry, "b")
        for tenant in (1, 2):
            schedules.add(engine, f"report:{tenant}", task="report", spec=EVERY_MINUTE)
        clock.advance_to(at(1, 59))
        starts = sorted((instant, started) for _, instant, started in job.seen)
        expected = sorted(
            (at(1), at(1) + delay(f"report:{tenant}", at(1), 40, 60)) for tenant in (1, 2)
        )
        assert starts == expected
        assert expected[0][1] != expected[1][1]  # spread apart


class TestNext:
    def test_cronjob_next_shows_each_instants_delayed_start(self, tmp_path, monkeypatch, capsys):
        (tmp_path / "jitterjobs.py").write_text(
            "import cronjob\n"
            "@cronjob.job('0 */5 * * * *', name='sync', jitter=60)\n"
            "def sync(ctx):\n"
            "    pass\n"
        )
        monkeypatch.chdir(tmp_path)
        fresh = Registry()
        monkeypatch.setattr(cronjob._registry, "default_registry", fresh)
        monkeypatch.setattr(cronjob, "default_registry", fresh)
        monkeypatch.setattr(cronjob.admin._cli, "default_registry", fresh)
        monkeypatch.syspath_prepend(str(tmp_path))
        args = ["next", "--module", "jitterjobs", "sync", "-n", "2", "--after", "2026-01-01T00:00Z"]
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            status = main(args)
        assert status == 0, capsys.readouterr().err
        first = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
        second = first + timedelta(minutes=5)
        d1, d2 = (delay("sync", t, 60, 300).total_seconds() for t in (first, second))
        assert buffer.getvalue().splitlines() == [
            "job 'sync' (leased): 0 */5 * * * *",
            "policies: jitter 1m",
            "next 2 instants of '0 */5 * * * *' (UTC) after 2026-01-01T00:00:00+00:00:",
            f"  2026-01-01T00:05:00+00:00  starts +{d1:g}s (jitter)",
            f"  2026-01-01T00:10:00+00:00  starts +{d2:g}s (jitter)",
        ]
