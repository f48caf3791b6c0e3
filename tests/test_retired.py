"""Retired jobs and clean stops (issue 40): a job on record that no live replica registers,
while some replica is live, is retired (never stale nor failing, no next instant);
``forget`` deletes its record; a replica that stops cleanly leaves the live list at once.

Replicas are schedulers on one fake clock and one database (each of the three), read
back with ``cronjob.admin`` and the ``cronjob`` command. The last tests run ``cronjob
run`` processes on one database and stop them with SIGTERM, in real time.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import Registry, admin, web
from cronjob._history import PRUNE_CHORE
from cronjob.admin import Activity, Outcome
from cronjob.admin._cli import main
from cronjob.testing import FakeClock, crash
from tests._helpers import SweepingClock, wsgi_call
from tests._process import Watched, watched
from tests.faults.harness import wait_until
from tests.test_outage import outage as outage  # the fixture: a cut path to the database

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return SweepingClock(START)


def at(minutes: int = 0, seconds: int = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


def quiet(ctx: cronjob.Round) -> None:
    """A job that does nothing."""


def fail(ctx: cronjob.Round) -> None:
    raise RuntimeError("boom")


def jobs(*names: str, spec: str = "0 * * * * *") -> Registry:
    """A registry of ``quiet`` jobs, every minute."""
    registry = Registry()
    for name in names:
        registry.register(quiet, spec, name)
    return registry


def job_status(url: str, clock: FakeClock, name: str) -> admin.JobStatus:
    [found] = [job for job in admin.status(url, now=clock.now()).jobs if job.name == name]
    return found


def rounds_of(url: str, name: str) -> int:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            query = sa.text("SELECT COUNT(*) FROM cronjob_round WHERE name = :name")
            return int(conn.execute(query, {"name": name}).scalar_one())
    finally:
        engine.dispose()


class TestRetired:
    def test_a_removed_job_is_retired_only_once_no_live_replica_registers_it(
        self, db_url, replicas, clock
    ):
        """A rolling deploy: the old release's replicas register 'report', the new one's
        do not; 'report' is retired only once the last old replica is gone."""
        old, new = jobs("report", "tick"), jobs("tick")
        first, second = replicas(old, "old-1"), replicas(old, "old-2")
        clock.advance(60)  # 'report' and 'tick' ran at 09:01
        replicas(new, "new-1")
        clock.advance(0)  # its first sweep puts it on record
        first.stop()
        report = job_status(db_url, clock, "report")
        assert (report.activity, report.next_instant) == (Activity.IDLE, at(2))
        second.stop()  # the last replica that registered 'report'
        status = admin.status(db_url, now=clock.now())
        assert [r.id for r in status.replicas] == ["new-1"]
        [report] = [job for job in status.jobs if job.name == "report"]
        assert report.activity is Activity.RETIRED
        assert report.next_instant is None
        assert report.problems == ()
        assert (report.spec, report.last_outcome, report.last_success) == (
            "0 * * * * *",
            Outcome.SUCCEEDED,
            at(1),
        )
        assert [job.name for job in status.retired] == ["report"]
        tick = job_status(db_url, clock, "tick")
        assert tick.activity is Activity.IDLE and tick.next_instant == at(2)

    def test_a_retired_job_is_never_stale_nor_failing(self, db_url, replicas, clock):
        """'refresh-report' failed, then was removed: an hour later it would be failing
        and stale, but no replica runs it any more, so status stays healthy."""
        old = Registry()
        old.register(fail, "0 * * * * *", "refresh-report")
        old.register(quiet, "0 0 * * * *", "hourly")
        a = replicas(old, "a")
        clock.advance(2 * 60)
        assert job_status(db_url, clock, "refresh-report").problems == (
            "failing: 2 rounds in a row failed",
        )
        replicas(jobs("hourly", spec="0 0 * * * *"), "b")
        clock.advance(0)
        a.stop()
        clock.advance(3600)
        status = admin.status(db_url, now=clock.now())
        [retired] = status.retired
        assert retired.name == "refresh-report"
        assert (retired.problems, retired.consecutive_failures) == ((), 2)
        assert status.healthy and status.problems == ()

    def test_with_no_live_replica_nothing_is_retired(self, db_url, replicas, clock):
        """Every replica gone (a deploy that stops them all): the jobs show as they are,
        and a job without a success for long is stale, as before."""
        a = replicas(jobs("tick"), "a")
        clock.advance(60)
        a.stop()
        clock.advance(10 * 60)
        status = admin.status(db_url, now=clock.now())
        assert status.replicas == () and status.retired == ()
        [tick] = status.jobs
        assert (tick.activity, tick.next_instant) == (Activity.IDLE, at(12))
        assert tick.problems == ("stale: no successful end within 3m (last at "
                                 "2026-03-02T09:01:00+00:00)",
                                 "missed: 9 instants of the last day did not run")  # fmt: skip

    def test_a_crashed_replica_still_counts_as_registering_its_jobs_for_a_minute(
        self, db_url, replicas, clock
    ):
        """A crash does not take the record off: its jobs are not retired until the
        record ages out (60 s after its last sweep)."""
        a = replicas(jobs("report", "tick"), "a")
        replicas(jobs("tick"), "b")
        clock.advance(0)
        crash(a)
        assert job_status(db_url, clock, "report").activity is Activity.IDLE
        clock.advance(61)
        assert job_status(db_url, clock, "report").activity is Activity.RETIRED

    def test_per_instance_jobs_are_retired_only_with_a_row_and_no_replica(
        self, db_url, replicas, clock
    ):
        """A per-instance job has a row only once paused: a registered one is never
        retired; a removed one with a row is; one without a row leaves nothing to show."""
        old = jobs("tick")
        old.register_per_instance(quiet, "@every 1h", "clear-tmp")
        old.register_per_instance(quiet, "@every 1h", "warm-cache")
        a = replicas(old, "a")
        clock.advance(0)
        admin.pause(db_url, "clear-tmp", now=clock.now())  # writes its row
        local = job_status(db_url, clock, "clear-tmp")
        assert (local.per_instance, local.activity) == (True, Activity.PAUSED)
        replicas(jobs("tick"), "b")
        clock.advance(0)
        a.stop()
        status = admin.status(db_url, now=clock.now())
        assert [job.name for job in status.retired] == ["clear-tmp"]
        assert "warm-cache" not in {job.name for job in status.jobs}
        assert status.healthy

    def test_the_prune_chores_row_is_never_a_job(self, db_url, replicas, clock):
        """The internal row of the history's prune is not a job: never listed, never
        retired, and forget does not touch it."""
        replicas(jobs("tick"), "a")
        clock.advance(0)
        engine = lease.create_engine(db_url)
        try:
            store = lease.LeaseStore(engine)
            assert store.take_turn(PRUNE_CHORE, at(0), "a")
            status = admin.status(db_url, now=clock.now())
            assert [job.name for job in status.jobs] == ["tick"] and status.retired == ()
            for name in (f" {PRUNE_CHORE}", PRUNE_CHORE):
                with pytest.raises(admin.UnknownJob, match=r"^no job named .* is on record$"):
                    admin.forget(db_url, name, now=clock.now())
            with engine.connect() as conn:
                names = conn.execute(sa.text("SELECT name FROM cronjob_lease")).scalars()
                assert sorted(names) == [f" {PRUNE_CHORE}", "tick"]
        finally:
            engine.dispose()


class TestForget:
    def test_it_is_refused_while_a_live_replica_registers_the_job_and_works_after(
        self, db_url, replicas, clock
    ):
        a = replicas(jobs("report", "tick"), "a")
        replicas(jobs("tick"), "b")
        clock.advance(2 * 60)
        with pytest.raises(admin.ForgetRefused) as refused:
            admin.forget(db_url, "report", now=clock.now())
        assert str(refused.value) == (
            "job 'report' is registered by live replica(s) a: remove it from the code and "
            "deploy first; nothing was deleted"
        )
        assert (refused.value.job, refused.value.registered_by) == ("report", ("a",))
        assert job_status(db_url, clock, "report").activity is Activity.IDLE
        a.stop()
        # An open request of it, once no replica runs it (while one did, PostgreSQL's
        # NOTIFY could have it taken at once, in real time).
        admin.trigger(db_url, "report", now=clock.now())
        ran = rounds_of(db_url, "report")
        assert ran >= 2
        done = admin.forget(db_url, "report", now=clock.now())
        assert done == admin.Forgotten(job="report", lease_row=True, rounds=ran, requests=1)
        status = admin.status(db_url, now=clock.now())
        assert [job.name for job in status.jobs] == ["tick"]
        assert rounds_of(db_url, "report") == 0 and rounds_of(db_url, "tick") >= 2
        with pytest.raises(admin.UnknownJob, match=r"^no job named 'report' is on record$"):
            admin.history(db_url, "report")
        with pytest.raises(admin.UnknownJob, match=r"^no job named 'report' is on record$"):
            admin.forget(db_url, "report", now=clock.now())

    def test_it_is_refused_when_no_replica_is_live(self, db_url, replicas, clock):
        a = replicas(jobs("report"), "a")
        clock.advance(60)
        a.stop()
        with pytest.raises(admin.ForgetRefused) as refused:
            admin.forget(db_url, "report", now=clock.now())
        assert refused.value.registered_by == ()
        assert str(refused.value).startswith("no replica is live, so nothing tells whether")
        assert rounds_of(db_url, "report") == 1
        with pytest.raises(admin.UnknownJob, match=r"^no job named 'nope' is on record$"):
            admin.forget(db_url, "nope", now=clock.now())

    def test_an_unknown_name_is_refused(self, db_url, replicas, clock):
        replicas(jobs("tick"), "a")
        clock.advance(0)
        with pytest.raises(admin.UnknownJob, match=r"^no job named 'nope' is on record$"):
            admin.forget(db_url, "nope", now=clock.now())

    def test_a_job_registered_again_after_it_was_forgotten_starts_afresh(
        self, db_url, replicas, clock
    ):
        a = replicas(jobs("report", "tick"), "a")
        replicas(jobs("tick"), "b")
        clock.advance(60)
        a.stop()
        admin.forget(db_url, "report", now=clock.now())
        replicas(jobs("report", "tick"), "c")
        clock.advance(60)  # its first instant: 09:02
        report = job_status(db_url, clock, "report")
        assert (report.activity, report.instant, report.last_success) == (
            Activity.IDLE,
            at(2),
            at(2),
        )
        assert [r.instant for r in admin.history(db_url, "report")] == [at(2)]


class TestCleanStop:
    def test_a_replica_leaves_the_live_list_as_it_stops_and_a_crash_does_not(
        self, db_url, replicas, clock
    ):
        a, b = replicas(jobs("tick"), "a"), replicas(jobs("tick"), "b")
        clock.advance(20)
        a.stop()
        assert [r.id for r in admin.status(db_url, now=clock.now()).replicas] == ["b"]
        crash(b)
        assert [r.id for r in admin.status(db_url, now=clock.now()).replicas] == ["b"]

    def test_the_record_of_a_later_start_under_the_same_id_is_kept(self, migrated_engine):
        """Only the record of the replica that stops is taken off: one that started again
        under the same id (a later ``started``) keeps its own."""
        store = lease.LeaseStore(migrated_engine)
        record = lease.ReplicaRow(
            holder="web-1", host="h", pid=1, version="1", started=START, seen=START, jobs={}
        )
        store.record_replica(record)
        assert not store.remove_replica("web-1", started=START - timedelta(seconds=1))
        assert [r.holder for r in store.replicas(seen_since_ms=0)] == ["web-1"]
        assert store.remove_replica("web-1", started=START)
        assert store.replicas(seen_since_ms=0) == []

    def test_a_stop_with_the_database_cut_off_is_prompt_and_logged(self, outage, clock, caplog):
        """The path to the database is cut just before the stop: the delete fails at once
        (a refused connection; a locked SQLite file), is logged, and the record stays to
        age out as a crashed replica's does."""
        scheduler = cronjob.Scheduler(
            outage.database("a"), registry=jobs("tick"), clock=clock, replica_id="a"
        )
        scheduler.start()
        clock.advance(5)
        outage.cut()
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            scheduler.stop()
        assert time.monotonic() - began < 5
        messages = [r.getMessage() for r in caplog.records]
        assert any(
            m.startswith("replica a: its record could not be taken off the replica table (")
            and m.endswith("it is listed as live until a minute after its last sweep")
            for m in messages
        ), messages
        outage.heal()
        assert [r.id for r in admin.status(outage.url, now=clock.now()).replicas] == ["a"]

    @pytest.mark.slow
    def test_a_stop_with_the_database_hanging_is_bounded_and_logged(
        self, db_url, outage, clock, caplog
    ):
        """Statements hang just before the stop (a blackholed path; a SQLite file whose
        write lock another connection holds, under the 30 s busy timeout): the stop waits
        for the delete no longer than for any queued statement, 10 s, and says so."""
        sqlite = outage.kind == "sqlite"
        database = db_url if sqlite else outage.database("a")
        scheduler = cronjob.Scheduler(database, registry=jobs("tick"), clock=clock, replica_id="a")
        scheduler.start()
        clock.advance(5)
        if sqlite:
            outage.cut()  # holds the write lock
        else:
            outage.proxies["a"].cut("blackhole")
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            scheduler.stop()
        assert 9 < time.monotonic() - began < 13
        messages = [r.getMessage() for r in caplog.records]
        assert "lease statements still running after 10s at stop" in messages

    # The servers only: SQLite's outage is a write lock, which lets the probes' reads
    # through, so the database is not reliably "known lost" when the stop comes.
    @pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)
    def test_a_stop_while_the_database_is_known_lost_sends_nothing(self, outage, clock, caplog):
        """A claim failed (the database is being probed): the stop does not try the
        delete at all, and says so. (Its replica has a name of its own: a stop of the test
        before, whose delete hung, may still log about its replica "a" meanwhile.)"""
        scheduler = cronjob.Scheduler(
            outage.database("a"), registry=jobs("tick"), clock=clock, replica_id="lost"
        )
        scheduler.start()
        clock.advance(5)
        outage.cut()
        clock.advance(60)  # the 09:01 claim fails: the database is lost
        began = time.monotonic()
        with caplog.at_level(logging.INFO, logger="cronjob"):
            scheduler.stop()
        assert time.monotonic() - began < 5
        messages = [r.getMessage() for r in caplog.records]
        assert (
            "replica lost: the database is unreachable: its record stays on the replica "
            "table, listed as live until a minute after its last sweep"
        ) in messages
        assert not any(m.startswith("replica lost: its record could not") for m in messages)
        outage.heal()


# -- the command and the page --------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def deployed(db_url: str) -> Iterator[tuple[str, FakeClock]]:
    """A deploy that removed 'report', ending about now (the commands read the database's
    clock): 'old' ran 'report' and 'tick' and stopped; 'new' runs 'tick' through the test."""
    now = datetime.now(UTC).replace(microsecond=0)
    clock = SweepingClock(now - timedelta(seconds=now.second % 10 + 20))
    old = cronjob.Scheduler(
        db_url, registry=jobs("report", "tick", spec="*/5 * * * * *"), clock=clock, replica_id="old"
    )
    with cronjob.Scheduler(
        db_url, registry=jobs("tick", spec="*/5 * * * * *"), clock=clock, replica_id="new"
    ):
        with old:
            clock.advance(10)
        clock.advance(10)
        yield db_url, clock


class TestCommands:
    def test_status_lists_a_retired_job_apart_and_exits_0(self, deployed, capsys):
        url, _clock = deployed
        status, out, err = run(capsys, "status", "--database-url", url)
        assert (status, err) == (0, "")
        jobs_table, retired, replicas = out.split("\n\n")[:3]
        assert [line.split()[0] for line in jobs_table.splitlines()] == ["JOB", "tick"]
        lines = retired.splitlines()
        assert lines[0] == (
            "retired: 1 job on record that no live replica registers (cronjob forget NAME "
            "deletes one)"
        )
        assert lines[1].split() == ["JOB", "SPEC", "LAST", "LAST", "SUCCESS", "(UTC)"]
        assert lines[2].startswith("report  */5 * * * * *  succeeded ")
        assert [line.split()[0] for line in replicas.splitlines()] == ["REPLICA", "new"]

    def test_status_json_says_retired(self, deployed, capsys):
        url, _clock = deployed
        status, out, _err = run(capsys, "status", "--json", "--database-url", url)
        report = json.loads(out)
        assert status == 0 and report["healthy"] is True
        [retired] = [job for job in report["jobs"] if job["name"] == "report"]
        assert (retired["activity"], retired["next_instant"], retired["problems"]) == (
            "retired",
            None,
            [],
        )

    def test_forget_deletes_a_retired_job_and_says_what(self, deployed, capsys):
        url, _clock = deployed
        ran = rounds_of(url, "report")
        status, out, err = run(capsys, "forget", "report", "--database-url", url)
        assert (status, err) == (0, "")
        assert out == (
            f"forgot report: its lease row, {ran} round{'s' if ran != 1 else ''} of history, "
            "0 requests for a round now\n"
        )
        status, out, err = run(capsys, "forget", "report", "--database-url", url)
        assert (status, out) == (2, "")
        assert err == "cronjob: error: no job named 'report' is on record\n"

    def test_forget_json(self, deployed, capsys):
        url, _clock = deployed
        ran = rounds_of(url, "report")
        status, out, _err = run(capsys, "forget", "report", "--json", "--database-url", url)
        assert status == 0
        assert json.loads(out) == {"job": "report", "lease_row": True, "rounds": ran, "requests": 0}

    def test_forget_of_a_job_a_live_replica_registers_is_one_line_and_exit_2(
        self, deployed, capsys
    ):
        url, _clock = deployed
        status, out, err = run(capsys, "forget", "tick", "--database-url", url)
        assert (status, out) == (2, "")
        assert err == (
            "cronjob: error: refused: job 'tick' is registered by live replica(s) new: remove "
            "it from the code and deploy first; nothing was deleted\n"
        )
        assert rounds_of(url, "tick") > 0

    def test_the_page_shows_retired_jobs_apart(self, deployed):
        url, clock = deployed
        _status, _headers, page = wsgi_call(web.wsgi_app(url, clock=clock), "/")
        jobs_part, retired_part = page.split("<h2>Retired jobs</h2>")
        assert ">tick</a>" in jobs_part and ">report</a>" not in jobs_part
        assert ">report</a>" in retired_part.split("<h2>Live replicas</h2>")[0]
        assert "1 job (and 1 retired)" in page and "all jobs healthy" in page
        _status, _headers, job = wsgi_call(web.wsgi_app(url, clock=clock), "/job", "name=report")
        assert "<code>cronjob forget report</code> deletes its record" in job


# -- real replica processes ----------------------------------------------------------------

#: The job module of both releases: ``RELEASE=2`` drops 'report'.
JOBS_MODULE = """
import os
import cronjob

# At New Year only: no round while the test runs (hourly ones ran when a slow run
# crossed the hour, and 'report' had a round of history to forget).
cronjob.register(lambda ctx: None, "0 0 0 1 1 *", "tick")
if os.environ.get("RELEASE") != "2":
    cronjob.register(lambda ctx: None, "0 0 0 1 1 *", "report")
"""


class Replicas:
    """``cronjob run jobs`` processes on one database, by release; killed at the end."""

    def __init__(self, tmp_path: Path, url: str, stack: ExitStack) -> None:
        (tmp_path / "jobs.py").write_text(textwrap.dedent(JOBS_MODULE))
        self.tmp_path, self.url, self._stack = tmp_path, url, stack

    def start(self, release: int) -> Watched:
        """Start a replica of ``release``; return once it is on record."""
        argv = [sys.executable, "-m", "cronjob", "run", "--database-url", self.url, "jobs"]
        env = {"RELEASE": str(release)}
        process = self._stack.enter_context(watched(argv, cwd=self.tmp_path, env=env))
        assert process.started.wait(60), process.output
        pid = process.process.pid
        wait_until(lambda: pid in self.live_pids(), 30, f"replica {pid} on record")
        return process

    def live_pids(self) -> set[int]:
        return {r.pid for r in admin.status(self.url).replicas}

    def status(self) -> admin.Status:
        return admin.status(self.url)


@pytest.fixture
def sqlite_file_url(tmp_path: Path) -> str:
    """A SQLite file that every process opens."""
    return f"sqlite:///{tmp_path / 'shared.sqlite'}"


@pytest.fixture
def processes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Replicas]:
    """Real replica processes on the database named by the test's parameter."""
    url = request.getfixturevalue(request.param)
    with ExitStack() as stack:
        yield Replicas(tmp_path, url, stack)


def sigterm(process: Watched) -> None:
    process.process.send_signal(signal.SIGTERM)
    assert process.process.wait(30) == 0, process.output


@pytest.mark.slow
@pytest.mark.parametrize(
    "processes",
    [
        "sqlite_file_url",
        pytest.param("postgres_url", marks=pytest.mark.postgres),
        pytest.param("mysql_url", marks=pytest.mark.mysql),
    ],
    indirect=True,
)
class TestProcesses:
    def test_a_rolling_deploy_retires_a_removed_job_once_its_last_replica_is_gone(
        self, processes, capsys
    ):
        replicas = processes
        old_1 = replicas.start(release=1)
        old_2 = replicas.start(release=1)
        new_1 = replicas.start(release=2)
        pids = (old_1.process.pid, old_2.process.pid, new_1.process.pid)
        sigterm(old_1)
        # The drain took its record off: gone from the live list at once, not in a minute.
        assert replicas.live_pids() == {pids[1], pids[2]}
        report = {job.name: job for job in replicas.status().jobs}["report"]
        assert report.activity is Activity.IDLE  # old-2 still registers it
        status, _out, err = run(capsys, "forget", "report", "--database-url", replicas.url)
        assert status == 2 and err.startswith("cronjob: error: refused: job 'report' is ")
        sigterm(old_2)
        assert replicas.live_pids() == {pids[2]}
        status, out, err = run(capsys, "status", "--json", "--database-url", replicas.url)
        assert (status, err) == (0, ""), out
        activity = {job["name"]: job["activity"] for job in json.loads(out)["jobs"]}
        assert activity == {"report": "retired", "tick": "idle"}
        status, out, _err = run(capsys, "forget", "report", "--database-url", replicas.url)
        assert status == 0 and out.startswith("forgot report: its lease row, 0 rounds")
        assert [job.name for job in replicas.status().jobs] == ["tick"]
        sigterm(new_1)
        assert replicas.live_pids() == set()
