"""Job policies, the parts that act after a round: the self-pause
(``pause_after_failures``), the failure hooks (``on_failure``), and the policies shown by
``cronjob next``, ``cronjob status`` and the status page.

Replicas are schedulers on one fake clock and one database (each of the three). The
runtime of ``timeout``, retries and ``start_deadline`` is tested in test_policies.py; here
the outcomes it ends in (``timed_out``, ``retrying``, ``missed_deadline``) are written the
way the finisher writes them, with :meth:`lease.LeaseStore.finish_many`, and read back.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import Registry, Scheduler, admin, web
from cronjob.admin import Activity, Why
from cronjob.admin._cli import main
from cronjob.engine._failures import Failures, Hooks
from cronjob.testing import FakeClock
from lease._records import jobs_json, round_values
from lease._schema import round_table
from tests._helpers import wsgi_call

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
EVERY_MINUTE = "0 * * * * *"


def at(minutes: int = 0, seconds: int = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


class Script:
    """A job that fails (``ValueError: boom N``) or succeeds as told, minute by minute;
    it fails once its script runs out."""

    def __init__(self, *succeed: bool) -> None:
        self.script = list(succeed)
        self.calls = 0
        self.replicas: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.calls += 1
            self.replicas.append(ctx.replica)
            call = self.calls
            ok = self.script.pop(0) if self.script else False
        if not ok:
            raise ValueError(f"boom {call}")


class Hooked:
    """A failure hook that keeps what it is given, and the thread it ran on."""

    def __init__(self, raises: bool = False) -> None:
        self.records: list[admin.RoundRecord] = []
        self.threads: list[str] = []
        self.raises = raises
        self.called = threading.Semaphore(0)

    def __call__(self, record: admin.RoundRecord) -> None:
        self.records.append(record)
        self.threads.append(threading.current_thread().name)
        self.called.release()
        if self.raises:
            raise RuntimeError("the pager is down")

    def wait(self, count: int) -> None:
        """Wait (real time, bounded) for ``count`` calls: hooks run on their own thread."""
        for _ in range(count):
            assert self.called.acquire(timeout=10), f"only {len(self.records)} hook calls"


def fine(ctx: cronjob.Round) -> None:
    """A job that does nothing, well."""


def job_status(url: str, name: str, clock: FakeClock) -> admin.JobStatus:
    [job] = [j for j in admin.status(url, now=clock.now()).jobs if j.name == name]
    return job


def notes(url: str, name: str) -> list[admin.RoundRecord]:
    return [r for r in admin.history(url, name) if r.why in (Why.PAUSE, Why.RESUME)]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


class TestPauseAfterFailures:
    def test_failures_on_two_replicas_count_together_and_pause_the_job_once(
        self, db_url, replicas, clock, caplog
    ):
        caplog.set_level(logging.WARNING, logger="cronjob")
        job = Script()
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "flaky", pause_after_failures=3)
        a = replicas(registry, "a")
        clock.advance(2 * 60 + 5)  # 09:01 and 09:02 fail on a
        a.stop()
        replicas(registry, "b")
        clock.advance(60)  # 09:03 fails on b: the third in a row
        assert job.replicas == ["a", "a", "b"]
        status = job_status(db_url, "flaky", clock)
        assert status.activity is Activity.PAUSED
        assert status.paused_by == "cronjob"
        assert status.pause_reason == (
            "paused after 3 failed rounds in a row; last: ValueError: boom 3"
        )
        [note] = notes(db_url, "flaky")
        assert (note.why, note.replica) == (Why.PAUSE, "cronjob")
        [warned] = [w for w in warnings(caplog) if "paused itself" in w]
        assert "job 'flaky' paused itself on every replica" in warned
        replicas(registry, "c")
        clock.advance(5 * 60)
        assert job.calls == 3  # paused: no replica starts a round of it

    def test_two_replicas_deciding_at_once_pause_it_once(self, db_url, replicas, clock, caplog):
        caplog.set_level(logging.WARNING, logger="cronjob")
        job = Script()
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "flaky", pause_after_failures=2)
        replicas(registry, "a")
        clock.advance(2 * 60 + 5)
        assert job_status(db_url, "flaky", clock).activity is Activity.PAUSED
        # The other replica's finisher decides after it, on the same history.
        engine = lease.create_engine(db_url)
        try:
            store = lease.LeaseStore(engine)
            late = Failures(store=store, registry=registry, replica_id="b", hooks=None)
            [record] = admin.history(db_url, "flaky", limit=1, failed=True)
            late.ended([(cronjob.Outcome.FAILED, record, True)])
        finally:
            engine.dispose()
        assert len(notes(db_url, "flaky")) == 1
        assert len([w for w in warnings(caplog) if "paused itself" in w]) == 1

    def test_resume_runs_it_again_and_the_count_starts_over(self, db_url, replicas, clock):
        job = Script()
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "flaky", pause_after_failures=2)
        replicas(registry, "a")
        clock.advance(2 * 60 + 5)  # 09:01, 09:02 fail: paused
        assert job_status(db_url, "flaky", clock).paused_by == "cronjob"
        clock.advance(3 * 60)
        assert job.calls == 2
        admin.resume(db_url, "flaky", by="ops", now=clock.now())
        clock.advance(60)  # 09:06 fails: the first since the resume
        assert job.calls == 3
        assert job_status(db_url, "flaky", clock).activity is Activity.IDLE
        clock.advance(60)  # 09:07 fails: the second
        status = job_status(db_url, "flaky", clock)
        assert status.activity is Activity.PAUSED
        assert status.pause_reason == (
            "paused after 2 failed rounds in a row; last: ValueError: boom 4"
        )
        assert [n.why for n in reversed(notes(db_url, "flaky"))] == [
            Why.PAUSE,
            Why.RESUME,
            Why.PAUSE,
        ]

    def test_a_success_resets_the_count(self, db_url, replicas, clock):
        job = Script(False, False, True, False, False)
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "flaky", pause_after_failures=3)
        replicas(registry, "a")
        clock.advance(5 * 60 + 5)  # fail, fail, succeed, fail, fail
        assert job.calls == 5
        assert job_status(db_url, "flaky", clock).activity is Activity.IDLE
        clock.advance(60)  # the third failure in a row since the success
        assert job_status(db_url, "flaky", clock).activity is Activity.PAUSED

    def test_a_scheduler_without_history_refuses_it_at_start(self, sqlite_url, clock):
        registry = Registry()
        registry.register(Script(), EVERY_MINUTE, "flaky", pause_after_failures=3)
        scheduler = Scheduler(sqlite_url, registry=registry, clock=clock, history=None)
        with pytest.raises(ValueError, match="job 'flaky': pause_after_failures counts"):
            scheduler.start()
        short = Registry()
        short.register(Script(), EVERY_MINUTE, "flaky", pause_after_failures=3, retries=1)
        too_short = Scheduler(
            sqlite_url, registry=short, clock=clock, history=cronjob.History(per_job=5)
        )
        with pytest.raises(ValueError, match="needs the history to keep 6 rounds per job"):
            too_short.start()


class TestOutcomesOnRecord:
    """The policy outcomes as the finisher writes them, read back by the self-pause,
    the status and the history."""

    @pytest.fixture
    def store(self, db_url: str) -> Iterator[lease.LeaseStore]:
        engine = self.engine = lease.create_engine(db_url)
        lease.migrate(engine)
        try:
            yield lease.LeaseStore(engine, claim_ahead=None)
        finally:
            engine.dispose()

    def end(self, store: lease.LeaseStore, minute: int, word: str, *, attempt: int = 1) -> None:
        """One round of ``job`` claimed and ended ``word``, as the finisher records it."""
        instant = at(minute)
        if attempt == 1:
            [claim] = store.claim(["job"], instant, "r1")
            self.token = claim.token
        ended = instant + timedelta(seconds=attempt)
        error = None if word == "succeeded" else f"Err: {word} {minute}"
        record = lease.RoundRow(
            name="job",
            instant=instant,
            attempt=attempt,
            holder="r1",
            why="schedule",
            started=instant,
            ended=ended,
            outcome=word,
            error=error,
        )
        ending = lease.Ending(
            name="job",
            token=self.token,
            ended=ended,
            succeeded=word == "succeeded",
            error=error,
            record=record,
            outcome=word,
        )
        if word == "retrying":
            # An attempt retried under the same lease: its row in the history, the lease
            # kept (how the runtime keeps it is its own business).
            with self.engine.begin() as conn:
                conn.execute(round_table.insert(), [round_values(record)])
            return
        assert store.finish_many([ending]) == {("job", self.token)}

    def test_timed_out_counts_as_a_failure_retrying_and_missed_deadline_do_not(
        self, store, db_url, clock
    ):
        store.ensure(["job"])
        self.end(store, 1, "failed")
        self.end(store, 2, "timed_out")
        row = store.read(["job"])["job"]
        assert (row.failures, row.last_outcome, row.last_error) == (
            2,
            "timed_out",
            "Err: timed_out 2",
        )
        self.end(store, 3, "missed_deadline")
        row = store.read(["job"])["job"]
        assert (row.failures, row.last_outcome) == (2, "missed_deadline")
        status = job_status(db_url, "job", clock)
        assert status.consecutive_failures == 2
        assert status.last_outcome is admin.Outcome.MISSED_DEADLINE
        assert status.problems[0] == "failing: 2 rounds in a row failed"
        self.end(store, 4, "succeeded")
        assert store.read(["job"])["job"].failures == 0

    def test_a_retrying_ending_leaves_the_count(self, store):
        store.ensure(["job"])
        self.end(store, 1, "failed")
        [claim] = store.claim(["job"], at(2), "r1")
        ending = lease.Ending(
            name="job",
            token=claim.token,
            ended=at(2, 1),
            succeeded=False,
            error="Err: again",
            outcome="retrying",
        )
        store.finish_many([ending])
        row = store.read(["job"])["job"]
        assert (row.failures, row.last_outcome) == (1, "retrying")

    def test_history_failed_keeps_timed_out_and_missed_deadline_not_retrying(self, store, db_url):
        store.ensure(["job"])
        self.end(store, 1, "succeeded")
        self.end(store, 2, "retrying")
        self.end(store, 2, "failed", attempt=2)
        self.end(store, 3, "timed_out")
        self.end(store, 4, "missed_deadline")
        failed = admin.history(db_url, "job", failed=True)
        assert [(r.instant, r.outcome) for r in failed] == [
            (at(4), admin.Outcome.MISSED_DEADLINE),
            (at(3), admin.Outcome.TIMED_OUT),
            (at(2), admin.Outcome.FAILED),
        ]
        retried = [r for r in admin.history(db_url, "job") if r.attempt == 1 and r.instant == at(2)]
        assert [r.outcome for r in retried] == [admin.Outcome.RETRYING]

    def test_the_self_pause_counts_timed_out_and_skips_retrying_and_missed_deadline(
        self, store, db_url
    ):
        store.ensure(["job"])
        registry = Registry()
        registry.register(Script(), EVERY_MINUTE, "job", pause_after_failures=3)
        failures = Failures(store=store, registry=registry, replica_id="r1", hooks=None)

        def decide() -> None:
            [last] = admin.history(db_url, "job", limit=1, failed=True)
            failures.ended([(cronjob.Outcome.TIMED_OUT, last, True)])

        self.end(store, 1, "failed")
        self.end(store, 2, "retrying")
        self.end(store, 2, "timed_out", attempt=2)
        self.end(store, 3, "missed_deadline")
        decide()
        assert store.read(["job"])["job"].paused is None  # two that count so far
        self.end(store, 4, "retrying")
        self.end(store, 4, "timed_out", attempt=2)
        decide()
        row = store.read(["job"])["job"]
        assert (row.paused_by, row.pause_reason) == (
            "cronjob",
            "paused after 3 failed rounds in a row; last: Err: timed_out 4",
        )


class TestFailureHook:
    def test_it_is_called_once_per_failed_round_with_its_record_on_its_own_thread(
        self, db_url, replicas, clock
    ):
        hook = Hooked()
        job = Script(False, True, False)
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "flaky", on_failure=hook)
        replicas(registry, "a")
        clock.advance(3 * 60 + 5)
        hook.wait(2)
        assert [(r.job, r.instant, r.outcome, r.error) for r in hook.records] == [
            ("flaky", at(1), admin.Outcome.FAILED, "ValueError: boom 1"),
            ("flaky", at(3), admin.Outcome.FAILED, "ValueError: boom 3"),
        ]
        first = hook.records[0]
        assert isinstance(first, admin.RoundRecord)
        assert (first.attempt, first.replica, first.why) == (1, "a", Why.SCHEDULE)
        assert first.ended == at(1)
        # The record is the history's.
        assert first == next(r for r in admin.history(db_url, "flaky") if r.instant == at(1))
        assert set(hook.threads) == {"cronjob-hooks"}

    def test_a_hook_that_raises_is_logged_and_the_scheduler_goes_on(
        self, db_url, replicas, clock, caplog
    ):
        caplog.set_level(logging.ERROR, logger="cronjob")
        hook = Hooked(raises=True)
        job = Script()
        registry = Registry()
        registry.register(job, EVERY_MINUTE, "flaky", on_failure=hook)
        replicas(registry, "a")
        clock.advance(60 + 5)
        hook.wait(1)
        clock.advance(60)
        hook.wait(1)
        assert job.calls == 2
        logged = [r for r in caplog.records if "failure hook" in r.getMessage()]
        assert len(logged) >= 1
        assert "job 'flaky': its failure hook" in logged[0].getMessage()
        assert logged[0].exc_info is not None
        assert "the pager is down" in str(logged[0].exc_info[1])

    def test_the_registry_hook_serves_jobs_without_their_own(self, db_url, replicas, clock):
        everyone, own = Hooked(), Hooked()
        registry = Registry(on_failure=everyone)
        registry.register(Script(), EVERY_MINUTE, "plain")
        registry.register(Script(), EVERY_MINUTE, "special", on_failure=own)
        registry.register(Script(True, True), EVERY_MINUTE, "fine")
        replicas(registry, "a")
        clock.advance(60 + 5)
        everyone.wait(1)
        own.wait(1)
        assert [r.job for r in everyone.records] == ["plain"]
        assert [r.job for r in own.records] == ["special"]

    def test_a_per_instance_job_failing_calls_its_hook(self, db_url, replicas, clock):
        hook = Hooked()
        registry = Registry()
        registry.register_per_instance(Script(), EVERY_MINUTE, "local", on_failure=hook)
        replicas(registry, "a")
        clock.advance(60 + 5)
        hook.wait(1)
        [record] = hook.records
        assert (record.job, record.instant, record.replica, record.error) == (
            "local",
            at(1),
            "a",
            "ValueError: boom 1",
        )

    def test_no_hooks_thread_without_hooks(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(Script(), EVERY_MINUTE, "flaky")
        plain = replicas(registry, "a")
        hook = Hooked()
        hooked = Registry(on_failure=hook)
        hooked.register(Script(), EVERY_MINUTE, "other")
        with_hook = replicas(hooked, "b")
        clock.advance(2 * 60 + 5)
        hook.wait(2)
        assert plain._hooks is None
        assert with_hook._hooks is not None and with_hook._hooks.thread is not None
        assert [t.name for t in threading.enumerate() if t.name == "cronjob-hooks"] == [
            "cronjob-hooks"
        ]
        with_hook.stop()  # the hooks thread is joined
        assert not with_hook._hooks.thread.is_alive()

    def test_a_hook_that_hangs_does_not_hang_stop(self, caplog):
        release = threading.Event()
        hooks = Hooks(name="cronjob-hooks-hanging")
        record = admin.RoundRecord(
            job="x",
            instant=START,
            attempt=1,
            replica="a",
            why=Why.SCHEDULE,
            started=START,
            ended=START,
            outcome=admin.Outcome.FAILED,
            error="E",
            trace_id=None,
        )
        hooks.call_later(lambda _: release.wait(30), record)
        hooks.call_later(lambda _: None, record)
        assert hooks.close(timeout=0.2) is False
        assert any("still runs" in m for m in warnings(caplog))
        release.set()
        assert hooks.thread is not None
        hooks.thread.join(10)
        assert not hooks.thread.is_alive()


class TestPoliciesShown:
    @pytest.fixture
    def clock(self) -> FakeClock:
        """About now: ``cronjob status`` reads the database's clock to tell live replicas."""
        return FakeClock(datetime.now(UTC).replace(microsecond=0))

    @pytest.fixture
    def deployed(self, db_url: str, replicas: Callable[..., Scheduler], clock: FakeClock) -> str:
        registry = Registry()
        registry.register(fine, EVERY_MINUTE, "sync", timeout=30, retries=3, pause_after_failures=5)
        registry.register(fine, EVERY_MINUTE, "plain")
        registry.register_per_instance(
            fine, EVERY_MINUTE, "<local>", start_deadline=timedelta(minutes=2)
        )
        replicas(registry, "a")
        clock.advance(0)
        return db_url

    def test_status_reads_the_policies_from_the_replicas_record(self, deployed, clock):
        jobs = {j.name: j for j in admin.status(deployed, now=clock.now()).jobs}
        assert jobs["sync"].policies == {
            "timeout": 30.0,
            "retries": 3,
            "retry_backoff": 10.0,
            "pause_after_failures": 5,
        }
        assert jobs["plain"].policies == {}
        assert jobs["<local>"].policies == {"start_deadline": 120.0}

    def test_status_text_and_json_show_them(self, deployed, capsys):
        assert main(["status", "--database-url", deployed]) == 0
        out = capsys.readouterr().out
        header, *lines = out.split("\n\n")[0].splitlines()
        assert header.split()[-1] == "POLICIES"
        [sync] = [line for line in lines if line.startswith("sync ")]
        assert sync.endswith("timeout 30s, retries 3 (backoff 10s), pause after 5 failures")
        [plain] = [line for line in lines if line.startswith("plain ")]
        assert plain.endswith(" -")
        assert main(["status", "--database-url", deployed, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        policies = {job["name"]: job["policies"] for job in report["jobs"]}
        assert policies["sync"]["timeout"] == 30.0
        assert policies["<local>"] == {"start_deadline": 120.0}

    def test_the_page_shows_them_escaped(self, deployed, clock):
        app = web.wsgi_app(deployed, clock=clock)
        front = wsgi_get(app, "/")
        assert "<th>Policies</th>" in front
        assert "timeout 30s, retries 3 (backoff 10s), pause after 5 failures" in front
        assert "&lt;local&gt;" in front and "<local>" not in front
        page = wsgi_get(app, "/job", "name=sync")
        assert "Policies" in page and "pause after 5 failures" in page

    def test_an_old_replicas_record_without_policies_still_reads(self, db_url, clock):
        engine = lease.create_engine(db_url)
        lease.migrate(engine)
        try:
            store = lease.LeaseStore(engine)
            store.record_replica(
                lease.ReplicaRow(
                    holder="old",
                    host="h",
                    pid=1,
                    version="0.9",
                    started=START,
                    seen=START,
                    jobs={"sync": (EVERY_MINUTE, True)},
                )
            )
            with engine.connect() as conn:
                written = conn.execute(sa.text("SELECT jobs FROM cronjob_replica")).scalar_one()
            assert json.loads(written) == {"sync": {"spec": EVERY_MINUTE, "leased": True}}
            [row] = store.replicas(seen_since_ms=0)
            assert (row.jobs, row.policies) == ({"sync": (EVERY_MINUTE, True)}, {})
        finally:
            engine.dispose()

    def test_a_new_record_keeps_the_shape_an_old_reader_takes(self):
        written = jobs_json({"sync": (EVERY_MINUTE, True)}, {"sync": {"timeout": 30.0}})
        entry = json.loads(written)["sync"]
        assert (entry["spec"], entry["leased"], entry["policy"]) == (
            EVERY_MINUTE,
            True,
            {"timeout": 30.0},
        )

    def test_cronjob_next_shows_a_jobs_policies(self, tmp_path, monkeypatch, capsys):
        (tmp_path / "policyjobs.py").write_text(
            "import cronjob\n"
            "@cronjob.job('0 */5 * * * *', name='sync', timeout=30, retries=2,\n"
            "             on_failure=print)\n"
            "def sync(ctx):\n"
            "    pass\n"
        )
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(cronjob._registry, "default_registry", Registry())
        monkeypatch.setattr(cronjob, "default_registry", cronjob._registry.default_registry)
        fresh = cronjob._registry.default_registry
        monkeypatch.setattr(cronjob.admin._cli, "default_registry", fresh)
        monkeypatch.syspath_prepend(str(tmp_path))
        args = ["next", "--module", "policyjobs", "sync", "-n", "1", "--after", "2026-01-01T00:00Z"]
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            status = main(args)
        assert status == 0, capsys.readouterr().err
        assert buffer.getvalue().splitlines() == [
            "job 'sync' (leased): 0 */5 * * * *",
            "policies: timeout 30s, retries 2 (backoff 10s), on failure builtins.print",
            "next 1 instant of '0 */5 * * * *' (UTC) after 2026-01-01T00:00:00+00:00:",
            "  2026-01-01T00:05:00+00:00",
        ]


def wsgi_get(app: web.WSGIApp, path: str, query: str = "") -> str:
    status, _, body = wsgi_call(app, path, query)
    assert status.startswith("200"), status
    return body
