"""Pausing and resuming a job cluster-wide: cronjob.admin.pause/resume and their CLI.

Replicas are schedulers on one fake clock and one database (each of the three); the
operator's calls run in the test's process with ``now=clock.now()``, as the CLI would run
beside them with the database's clock.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import Registry, Scheduler, admin
from cronjob.admin import Activity, Why
from cronjob.admin._cli import main
from cronjob.testing import FakeClock, crash

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(minutes: int = 0, seconds: int = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


class Runs:
    """A job that records its instants and lasts ``seconds`` (on the fake clock)."""

    def __init__(self, seconds: float = 0) -> None:
        self.seconds = seconds
        self.instants: list[datetime] = []
        self._lock = threading.Lock()

    def __call__(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.instants.append(ctx.instant)
        if self.seconds and ctx.wait(self.seconds):
            ctx.check()


def two_replicas(replicas: Callable[..., Scheduler], **jobs: Runs) -> Registry:
    registry = Registry()
    for name, job in jobs.items():
        registry.register(job, "0 * * * * *", name)
    replicas(registry, "a")
    replicas(registry, "b")
    return registry


def history_whys(url: str, name: str) -> list[str]:
    return [str(record.why) for record in reversed(admin.history(url, name))]


class TestPause:
    def test_paused_between_two_instants_no_replica_runs_the_next(
        self, db_url, replicas, clock, caplog
    ):
        caplog.set_level(logging.INFO)
        tick = Runs()
        two_replicas(replicas, tick=tick)
        clock.advance(60 + 5)
        change = admin.pause(db_url, "tick", reason="bad release", by="ops@laptop", now=clock.now())
        assert (change.changed, change.paused, change.running_on) == (True, True, None)
        assert (change.paused_by, change.pause_reason) == ("ops@laptop", "bad release")
        assert change.paused_since == at(1, 5)
        clock.advance(5 * 60)
        assert tick.instants == [at(1)]
        # A claim refused for the pause is no missing row and no lost claim: no warning.
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        job = next(j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "tick")
        assert job.activity is Activity.PAUSED
        assert (job.paused_since, job.paused_by, job.pause_reason) == (
            at(1, 5),
            "ops@laptop",
            "bad release",
        )
        assert job.problems == ()  # paused on purpose: not stale, after 5 periods
        [note] = [r for r in admin.history(db_url, "tick") if r.why is Why.PAUSE]
        assert (note.replica, note.outcome, note.ended) == ("ops@laptop", "paused", at(1, 5))

    def test_a_round_running_when_paused_runs_to_its_end_and_the_next_does_not_start(
        self, db_url, replicas, clock
    ):
        slow = Runs(seconds=30)
        two_replicas(replicas, slow=slow)
        clock.advance(60 + 10)
        change = admin.pause(db_url, "slow", by="ops", now=clock.now())
        assert change.running_on in ("a", "b")
        clock.advance(3 * 60)
        assert slow.instants == [at(1)]
        [done] = [r for r in admin.history(db_url, "slow") if r.why is Why.SCHEDULE]
        assert (done.outcome, done.ended) == (admin.Outcome.SUCCEEDED, at(1, 30))

    def test_a_round_cut_short_while_paused_is_not_re_run(self, db_url, replicas, clock):
        slow = Runs(seconds=40)
        registry = Registry()
        registry.register(slow, "0 * * * * *", "slow")
        first = replicas(registry, "a")
        clock.advance(60 + 1)
        replicas(registry, "b")  # started after the 09:01 claim: a holds it
        clock.advance(1)
        admin.pause(db_url, "slow", by="ops", now=clock.now())
        crash(first)  # the lease expires 15 s on; b's sweep finds it cut short
        clock.advance(3 * 60)
        assert slow.instants == [at(1)]

    def test_resume_runs_the_next_instant_and_never_the_skipped_ones(self, db_url, replicas, clock):
        tick = Runs()
        two_replicas(replicas, tick=tick)
        clock.advance(60 + 5)
        admin.pause(db_url, "tick", by="ops", now=clock.now())
        clock.advance(3 * 60)  # 09:02, 09:03, 09:04 skipped
        change = admin.resume(db_url, "tick", by="ops", now=clock.now())
        assert (change.changed, change.paused, change.paused_since) == (True, False, None)
        clock.advance(60)
        assert tick.instants == [at(1), at(5)]
        assert history_whys(db_url, "tick") == ["schedule", "pause", "resume", "schedule"]

    def test_restart_while_paused_catches_nothing_up_nor_after_the_resume(
        self, db_url, replicas, clock
    ):
        tick = Runs()
        registry = Registry()
        registry.register(tick, "0 * * * * *", "tick")
        first = replicas(registry, "a")
        clock.advance(60 + 5)
        admin.pause(db_url, "tick", by="ops", now=clock.now())
        first.stop()
        clock.advance(2 * 60)
        second = replicas(registry, "b")  # start-up while paused: 09:03 is owed, but paused
        clock.advance(30)
        assert tick.instants == [at(1)]
        second.stop()
        admin.resume(db_url, "tick", by="ops", now=clock.now())
        replicas(registry, "c")  # start-up after the resume: 09:03 was skipped while paused
        clock.advance(10)
        assert tick.instants == [at(1)]
        clock.advance(30)  # 09:04
        assert tick.instants == [at(1), at(4)]

    def test_pause_all_and_resume_all_change_every_job(self, db_url, replicas, clock):
        one, two = Runs(), Runs()
        two_replicas(replicas, one=one, two=two)
        clock.advance(0)  # the replicas' start writes their rows (on their control thread)
        changes = admin.pause_all(db_url, reason="maintenance", by="ops", now=clock.now())
        assert [(c.job, c.changed, c.paused) for c in changes] == [
            ("one", True, True),
            ("two", True, True),
        ]
        clock.advance(2 * 60)
        assert one.instants == two.instants == []
        again = admin.pause_all(db_url, by="ops", now=clock.now())
        assert [c.changed for c in again] == [False, False]
        assert [c.pause_reason for c in again] == ["maintenance", "maintenance"]
        resumed = admin.resume_all(db_url, by="ops", now=clock.now())
        assert [(c.job, c.changed, c.paused) for c in resumed] == [
            ("one", True, False),
            ("two", True, False),
        ]
        clock.advance(60)
        assert one.instants == two.instants == [at(3)]


class TestBadInput:
    @pytest.fixture
    def url(self, db_url, replicas, clock) -> str:
        two_replicas(replicas, tick=Runs())
        clock.advance(0)  # the replicas' start has written their rows before a test reads them
        return db_url

    def rows(self, url: str) -> list[tuple[object, ...]]:
        engine = lease.create_engine(url)
        try:
            with engine.connect() as conn:
                leases = conn.execute(sa.select(lease.metadata.tables["cronjob_lease"])).all()
                rounds = conn.execute(sa.select(lease.metadata.tables["cronjob_round"])).all()
            return [tuple(row) for row in [*leases, *rounds]]
        finally:
            engine.dispose()

    def test_an_unknown_job_is_refused_and_nothing_is_written(self, url):
        before = self.rows(url)
        with pytest.raises(admin.UnknownJob, match="'nope'"):
            admin.pause(url, "nope")
        with pytest.raises(admin.UnknownJob, match="'nope'"):
            admin.resume(url, "nope")
        assert self.rows(url) == before

    def test_pausing_a_paused_job_or_resuming_a_running_one_changes_nothing(self, url, clock):
        admin.pause(url, "tick", reason="first", by="ops", now=clock.now())
        before = self.rows(url)
        again = admin.pause(url, "tick", reason="second", by="other", now=clock.now())
        assert (again.changed, again.paused, again.pause_reason, again.paused_by) == (
            False,
            True,
            "first",
            "ops",
        )
        admin.resume(url, "tick", by="ops", now=clock.now())
        before = self.rows(url)
        assert admin.resume(url, "tick", by="ops", now=clock.now()).changed is False
        assert self.rows(url) == before

    def test_a_reason_longer_than_the_column_is_refused_with_the_limit(self, url):
        before = self.rows(url)
        with pytest.raises(ValueError, match=f"more than the {lease.REASON_LENGTH} kept"):
            admin.pause(url, "tick", reason="x" * (lease.REASON_LENGTH + 1))
        assert self.rows(url) == before
        admin.pause(url, "tick", reason="x" * lease.REASON_LENGTH)  # the limit itself is kept

    def test_a_per_instance_job_pauses_on_every_replica_within_one_sweep(
        self, db_url, replicas, clock
    ):
        local = Runs()
        registry = Registry()
        registry.register(Runs(), "0 * * * * *", "tick")
        registry.register_per_instance(local, "0 * * * * *", "local")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(1)  # the first sweep put the replicas (and their jobs) on record
        change = admin.pause(db_url, "local", by="ops", reason="noisy", now=clock.now())
        assert (change.changed, change.paused, change.pause_reason) == (True, True, "noisy")
        clock.advance(15)  # one sweep interval: both replicas read the pause
        [job] = [j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "local"]
        assert (job.per_instance, job.activity, job.problems) == (True, Activity.PAUSED, ())
        clock.advance(2 * 60)
        assert local.instants == []  # 09:01 and 09:02 skipped on both
        admin.resume(db_url, "local", by="ops", now=clock.now())
        clock.advance(15 + 30)
        assert local.instants == [at(3), at(3)]


class TestCommandLine:
    @pytest.fixture
    def clock(self) -> FakeClock:
        """The CLI reads the database's clock: the replicas' fake clock starts at the real
        minute, so the leases they write are current on it."""
        return FakeClock(datetime.now(UTC).replace(second=0, microsecond=0))

    def run(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
        return code, out.getvalue(), err.getvalue()

    def test_pause_and_resume_say_what_they_did(self, db_url, replicas, clock):
        two_replicas(replicas, tick=Runs(seconds=20))
        clock.advance(60 + 5)
        code, out, err = self.run(
            "pause", "tick", "--reason", "bad release", "--database-url", db_url
        )
        assert (code, err) == (0, "")
        assert out.startswith("paused tick by ")
        assert "reason: bad release" in out
        assert "is not cancelled: it runs to its end" in out
        code, out, _ = self.run("pause", "tick", "--database-url", db_url)
        assert code == 0 and out.startswith("tick is paused already (by ")
        code, out, _ = self.run("status", "tick", "--database-url", db_url)
        pause = out.splitlines()[4].split()  # below the jobs: who paused, when, why
        assert pause[0] == "tick" and pause[-2:] == ["bad", "release"]
        code, out, _ = self.run("resume", "tick", "--database-url", db_url)
        assert (code, out) == (0, "resumed tick: its next instant runs; those skipped do not\n")
        code, out, _ = self.run("resume", "tick", "--database-url", db_url)
        assert (code, out) == (0, "tick is not paused: nothing changed\n")

    def test_all_pauses_every_job(self, db_url, replicas, clock):
        two_replicas(replicas, one=Runs(), two=Runs())
        code, out, _ = self.run("pause", "--all", "--database-url", db_url)
        assert code == 0
        assert out.splitlines()[0].startswith("paused 2 jobs by ")
        code, out, _ = self.run("resume", "--all", "--database-url", db_url)
        assert (code, out.splitlines()[0]) == (0, "resumed 2 jobs: one, two")

    @pytest.mark.parametrize("command", ["pause", "resume"])
    def test_an_unknown_job_is_one_line_and_exit_2(self, db_url, replicas, command):
        two_replicas(replicas, tick=Runs())
        code, out, err = self.run(command, "nope", "--database-url", db_url)
        assert (code, out, err) == (2, "", "cronjob: error: no job named 'nope' is on record\n")

    def test_name_and_all_together_or_neither_is_bad_input(self, db_url):
        assert self.run("pause", "--database-url", db_url)[0] == 2
        assert self.run("pause", "x", "--all", "--database-url", db_url)[0] == 2
        code, _, err = self.run("pause", "x", "--reason", "y" * 201, "--database-url", db_url)
        assert code == 2 and "200" in err
