"""Running a job now (``cronjob trigger``, ``cronjob.admin.trigger``) and resuming with a
catch-up, cluster-wide.

Replicas are schedulers on one fake clock and one database (each of the three); the
operator's calls run in the test's process with ``now=clock.now()``, as the CLI would run
beside them with the database's clock. A sweep (every 15 s on the clock's grid) takes a
request; a request written in this process wakes a sweep that had nothing to do.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from conftest import lease_row

import cronjob
import lease
from cronjob import Registry, Scheduler, Trigger, admin
from cronjob.admin import Refusal, RequestState, Why
from cronjob.admin._cli import main
from cronjob.admin._control_cli import EXIT_NO_REPLICA, EXIT_REFUSED, run_trigger
from cronjob.testing import FakeClock, crash
from tests._helpers import nightly_scheduler

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOURLY = "0 0 * * * *"
MINUTELY = "0 * * * * *"


def at(minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


@dataclass(frozen=True)
class Seen:
    instant: datetime
    attempt: int
    trigger: Trigger
    requested_by: str | None
    replica: str


class Job:
    """Records what each round saw; lasts ``seconds`` on the fake clock (cut short if
    cancelled meanwhile)."""

    def __init__(self, seconds: float = 0, *, fail: bool = False) -> None:
        self.seconds = seconds
        self.fail = fail
        self.seen: list[Seen] = []
        self._lock = threading.Lock()

    def __call__(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.seen.append(
                Seen(ctx.instant, ctx.attempt, ctx.trigger, ctx.requested_by, ctx.replica)
            )
        if self.seconds and ctx.wait(self.seconds):
            ctx.check()
        if self.fail:
            raise RuntimeError("downstream is down")

    def manual(self) -> list[Seen]:
        return [seen for seen in self.seen if seen.trigger is Trigger.MANUAL]

    def scheduled(self) -> list[Seen]:
        return [seen for seen in self.seen if seen.trigger is Trigger.SCHEDULE]


def cluster(replicas: Callable[..., Scheduler], spec: str = HOURLY, **jobs: Job) -> Registry:
    registry = Registry()
    for name, job in jobs.items():
        registry.register(job, spec, name)
    replicas(registry, "a")
    replicas(registry, "b")
    return registry


def request_rows(url: str) -> int:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM cronjob_trigger")).scalar_one())
    finally:
        engine.dispose()


class TestRunNow:
    def test_a_round_now_runs_once_manual_and_never_moves_the_schedule(
        self, db_url, replicas, clock
    ):
        job = Job()
        cluster(replicas, MINUTELY, report=job)
        clock.advance(60 + 5)  # 09:01 ran
        before = lease_row(db_url, "report")
        request = admin.trigger(db_url, "report", by="ops@laptop", now=clock.now())
        assert (request.ids, request.replicas, request.requested) == (request.ids, (), at(1, 5))
        clock.advance(15)
        [manual] = job.manual()
        assert (manual.instant, manual.attempt, manual.requested_by) == (at(1, 5), 1, "ops@laptop")
        after = lease_row(db_url, "report")
        # The schedule's columns are as before: the claim and catch-up rules see no change.
        assert (after.instant, after.attempt, after.state, after.skipped_through) == (
            before.instant,
            before.attempt,
            before.state,
            before.skipped_through,
        )
        assert after.expires_ms is None  # its end freed the lease
        clock.advance(60)
        assert [seen.instant for seen in job.scheduled()] == [at(1), at(2)]
        [record] = [r for r in admin.history(db_url, "report") if r.why is Why.MANUAL]
        assert (record.requested_by, record.outcome, record.replica) == (
            "ops@laptop",
            admin.Outcome.SUCCEEDED,
            manual.replica,
        )
        [done] = admin.requests(db_url, request.ids)
        assert (done.state, done.outcome, done.attempt, done.ran_on) == (
            RequestState.DONE,
            "succeeded",
            1,
            manual.replica,
        )

    def test_while_a_round_runs_the_request_is_refused_and_nothing_is_written(
        self, db_url, replicas, clock
    ):
        job = Job(seconds=30)
        cluster(replicas, MINUTELY, slow=job)
        clock.advance(60 + 10)
        with pytest.raises(admin.TriggerRefused, match="is running on") as refused:
            admin.trigger(db_url, "slow", by="ops", now=clock.now())
        assert refused.value.why is Refusal.BUSY
        assert refused.value.running_on in ("a", "b")
        assert request_rows(db_url) == 0
        clock.advance(60)
        assert job.manual() == []

    def test_a_paused_job_runs_now_only_with_force(self, db_url, replicas, clock):
        job = Job()
        cluster(replicas, MINUTELY, report=job)
        clock.advance(5)
        admin.pause(db_url, "report", by="ops", now=clock.now())
        with pytest.raises(admin.TriggerRefused, match="--force") as refused:
            admin.trigger(db_url, "report", by="ops", now=clock.now())
        assert refused.value.why is Refusal.PAUSED
        admin.trigger(db_url, "report", by="ops", force=True, now=clock.now())
        clock.advance(3 * 60)
        assert [seen.instant for seen in job.seen] == [at(0, 5)]  # the manual round only
        assert job.seen[0].trigger is Trigger.MANUAL

    def test_a_request_racing_its_instant_makes_one_round_on_record(self, db_url, replicas, clock):
        job = Job(seconds=2)
        cluster(replicas, MINUTELY, report=job)
        clock.advance(60 + 50)
        # Taken by the sweep at 09:02:00 (the 15 s grid), the moment the instant is claimed.
        request = admin.trigger(db_url, "report", by="ops", now=clock.now())
        clock.advance(30)
        assert len(job.seen) == 2  # 09:01 and one round at 09:02
        [refused] = admin.requests(db_url, request.ids)
        if job.seen[1].trigger is Trigger.MANUAL:
            assert refused.state is RequestState.DONE
            skipped = at(2)  # the instant came while the manual round held the lease
            assert skipped not in [seen.instant for seen in job.seen]
        else:
            assert job.seen[1].instant == at(2)
            assert (refused.state, refused.outcome) == (RequestState.REFUSED, "busy")
        whys = [r.why for r in admin.history(db_url, "report")]
        assert len(whys) == 2

    def test_a_manual_round_cut_short_runs_a_second_time_still_manual(
        self, db_url, replicas, clock
    ):
        job = Job(seconds=40)
        registry = Registry()
        registry.register(job, HOURLY, "slow")
        first = replicas(registry, "a")
        clock.advance(0)  # its start-up has written the lease row and put it on record
        request = admin.trigger(db_url, "slow", by="ops", now=clock.now())
        clock.advance(15)
        assert [(seen.replica, seen.attempt) for seen in job.manual()] == [("a", 1)]
        replicas(registry, "b")
        crash(first)  # its lease expires 15 s on; b's sweep takes the request again
        clock.advance(60)
        assert [(seen.replica, seen.attempt, seen.trigger) for seen in job.seen] == [
            ("a", 1, Trigger.MANUAL),
            ("b", 2, Trigger.MANUAL),
        ]
        assert job.seen[1].instant == job.seen[0].instant == at(0)
        [done] = admin.requests(db_url, request.ids)
        assert (done.state, done.attempt, done.outcome, done.ran_on) == (
            RequestState.DONE,
            2,
            "succeeded",
            "b",
        )
        assert lease_row(db_url, "slow").instant is None  # the schedule never moved

    def test_a_failing_manual_round_is_on_record_as_failed(self, db_url, replicas, clock):
        job = Job(fail=True)
        cluster(replicas, HOURLY, flaky=job)
        clock.advance(0)  # the start's rows written (on each replica's control thread)
        request = admin.trigger(db_url, "flaky", by="ops", now=clock.now())
        clock.advance(15)
        [done] = admin.requests(db_url, request.ids)
        assert (done.outcome, done.error) == ("failed", "RuntimeError: downstream is down")
        [status] = [j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "flaky"]
        assert status.consecutive_failures == 1

    def test_a_request_no_replica_takes_stays_pending_then_expires(self, db_url, replicas, clock):
        job = Job()
        registry = Registry()
        registry.register(job, HOURLY, "gone")
        replicas(registry, "a").stop()
        clock.advance(120)  # its replica record goes stale: no live replica registers it
        request = admin.trigger(db_url, "gone", by="ops", now=clock.now())
        [status] = [j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "gone"]
        [pending] = status.requests
        assert pending.state is RequestState.PENDING
        assert any("no live replica registers the job" in p for p in status.problems)
        clock.advance(lease.REQUEST_TTL + 1)
        [expired] = admin.requests(db_url, request.ids)
        assert expired.state is RequestState.EXPIRED
        replicas(registry, "b")
        clock.advance(30)
        assert job.seen == []  # a late replica never runs it

    def test_an_unknown_job_is_one_line_exit_2_and_nothing_written(self, db_url, replicas):
        cluster(replicas, HOURLY, report=Job())
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["trigger", "nope", "--database-url", db_url])
        assert code == 2
        assert err.getvalue() == "cronjob: error: no job named 'nope' is on record\n"
        assert request_rows(db_url) == 0

    def test_the_command_exits_4_when_refused(self, db_url, replicas, clock):
        # The command reads the database's clock: a pause, unlike a lease held on the
        # fake clock, does not depend on it.
        cluster(replicas, HOURLY, report=Job())
        clock.advance(0)  # the start's rows written (on each replica's control thread)
        admin.pause(db_url, "report", by="ops", now=clock.now())
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["trigger", "report", "--database-url", db_url])
        assert code == EXIT_REFUSED
        assert err.getvalue() == (
            "cronjob: refused: job 'report' is paused (by ops): give --force to run it "
            "anyway; nothing was written\n"
        )
        assert request_rows(db_url) == 0


class TestCommand:
    """The command reads the database's clock: here the replicas' fake clock starts at
    the real time, so that they are live when it asks."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock(datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1))

    def test_the_command_waits_for_the_round_and_exits_0_on_success(self, db_url, replicas, clock):
        job = Job(seconds=3)
        cluster(replicas, HOURLY, report=job)
        clock.advance(0)  # started: each replica swept once, so on record as live
        out, code = io.StringIO(), []
        args = _parse(["trigger", "report", "--wait", "--by", "ops", "--database-url", db_url])
        waiter = threading.Thread(target=lambda: code.append(run_trigger(args, out, clock=clock)))
        waiter.start()
        while waiter.is_alive():
            clock.advance(1)
            waiter.join(0.05)
        assert code == [0]
        lines = out.getvalue().splitlines()
        assert lines[0].startswith("requested a round of report now, by one replica, by ops at")
        assert "report on " in lines[1] and ": succeeded in 3.0 s (attempt 1)" in lines[1]


class TestCommandNoReplica:
    """As :class:`TestCommand`, but the replicas' clock starts five minutes before the
    real time: the one that ran is no longer live when the command asks."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=300))

    def test_the_command_exits_5_at_once_even_with_wait(self, db_url, replicas, clock):
        TestNoLiveReplica.gone(replicas, clock, Job())
        out, err, code = io.StringIO(), io.StringIO(), []
        args = _parse(["trigger", "report", "--wait", "--by", "ops", "--database-url", db_url])
        waiter = threading.Thread(
            target=lambda: code.append(run_trigger(args, out, err, clock=clock))
        )
        waiter.start()
        waiter.join(30)  # the fake clock never moves: a wait would never end
        assert not waiter.is_alive() and code == [EXIT_NO_REPLICA] == [5]
        [line] = err.getvalue().splitlines()
        assert line.startswith("cronjob: no live replica has report: request ")
        assert line.endswith(" UTC (it expires then)")
        assert "is recorded and runs when a replica that has the job starts, if one" in line
        assert out.getvalue() == ""
        assert request_rows(db_url) == 1

    def test_force_runs_past_the_pause_but_still_says_no_replica(self, db_url, replicas, clock):
        TestNoLiveReplica.gone(replicas, clock, Job())
        admin.pause(db_url, "report", by="ops", now=clock.now())
        base = ["trigger", "report", "--by", "ops", "--database-url", db_url]
        err = io.StringIO()
        assert run_trigger(_parse(base), io.StringIO(), err, clock=clock) == EXIT_REFUSED
        assert request_rows(db_url) == 0  # paused: refused first, nothing written
        out = io.StringIO()
        code = run_trigger(_parse([*base, "--force", "--json"]), out, err, clock=clock)
        assert code == EXIT_NO_REPLICA
        written = json.loads(out.getvalue())
        assert (written["force"], written["live_replicas"]) == (True, [])
        assert request_rows(db_url) == 1

    def test_a_per_instance_job_or_a_replica_not_live_is_refused_nothing_written(
        self, db_url, replicas, clock
    ):
        TestNoLiveReplica.gone(replicas, clock, Job(), per_instance=True)
        with pytest.raises(admin.TriggerRefused, match="no live replica runs") as refused:
            admin.trigger(db_url, "report", by="ops")
        assert refused.value.why is Refusal.NO_REPLICA
        for extra in ([], ["--replica", "a"]):
            err = io.StringIO()
            argv = ["trigger", "report", *extra, "--by", "ops", "--database-url", db_url]
            assert run_trigger(_parse(argv), io.StringIO(), err, clock=clock) == EXIT_NO_REPLICA
            assert err.getvalue().startswith("cronjob: no live replica: ")
            assert "nothing was written" in err.getvalue()
        assert request_rows(db_url) == 0


class TestNoLiveReplica:
    """No live replica has the job: the operator is told, the command exits 5 and never
    waits; a leased job's request is still written, for a replica that starts soon."""

    @staticmethod
    def gone(replicas, clock, job: Job, *, per_instance: bool = False) -> Registry:
        registry = Registry()
        if per_instance:
            registry.register_per_instance(job, HOURLY, "report")
            registry.register(Job(), HOURLY, "other")
        else:
            registry.register(job, HOURLY, "report")
        gone = replicas(registry, "a")
        clock.advance(1)  # on record, with its jobs
        crash(gone)  # its record stays, and goes stale:
        clock.advance(120)  # no replica is live
        return registry

    def test_a_leased_request_is_written_says_so_and_runs_when_a_replica_starts(
        self, db_url, replicas, clock
    ):
        job = Job()
        registry = self.gone(replicas, clock, job)
        request = admin.trigger(db_url, "report", by="ops", now=clock.now())
        assert (request.live_replicas, request.no_live_replica) == ((), True)
        assert request_rows(db_url) == 1
        replicas(registry, "b")  # the deploy's new replica, within the ttl
        clock.advance(15)
        assert [(seen.replica, seen.requested_by) for seen in job.manual()] == [("b", "ops")]
        again = admin.trigger(db_url, "report", by="ops", now=clock.now())
        assert (again.live_replicas, again.no_live_replica) == (("b",), False)


class TestPerInstance:
    def test_a_per_instance_job_runs_on_every_live_replica_or_on_one(self, db_url, replicas, clock):
        job = Job()
        registry = Registry()
        registry.register_per_instance(job, HOURLY, "local")
        registry.register(Job(), HOURLY, "leased")  # the replicas sweep and go on record
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(1)
        request = admin.trigger(db_url, "local", by="ops", now=clock.now())
        assert request.replicas == ("a", "b")
        clock.advance(15)
        assert sorted(seen.replica for seen in job.manual()) == ["a", "b"]
        only = admin.trigger(db_url, "local", by="ops", replica="b", now=clock.now())
        assert only.replicas == ("b",)
        clock.advance(15)
        assert sorted(seen.replica for seen in job.manual()) == ["a", "b", "b"]
        with pytest.raises(admin.TriggerRefused, match="'zz' is not live") as refused:
            admin.trigger(db_url, "local", by="ops", replica="zz", now=clock.now())
        assert refused.value.why is Refusal.NO_REPLICA

    def test_a_paused_per_instance_job_runs_now_only_with_force(self, db_url, replicas, clock):
        job = Job()
        registry = Registry()
        registry.register_per_instance(job, HOURLY, "local")
        replicas(registry, "a")
        clock.advance(1)
        admin.pause(db_url, "local", by="ops", now=clock.now())  # it gets a lease row
        with pytest.raises(admin.TriggerRefused, match="--force"):
            admin.trigger(db_url, "local", by="ops", now=clock.now())
        request = admin.trigger(db_url, "local", by="ops", force=True, now=clock.now())
        assert request.replicas == ("a",)
        clock.advance(15)
        assert [(seen.replica, seen.trigger) for seen in job.seen] == [("a", Trigger.MANUAL)]


class TestResumeCatchUp:
    def test_resume_with_catch_up_runs_the_latest_skipped_instant_once(
        self, db_url, replicas, clock
    ):
        job = Job()
        cluster(replicas, MINUTELY, tick=job)
        clock.advance(30)
        admin.pause(db_url, "tick", by="ops", now=clock.now())
        clock.advance(3 * 60)  # 09:01, 09:02 and 09:03 skipped
        change = admin.resume(db_url, "tick", by="ops", catch_up=True, now=clock.now())
        assert change.catch_up == at(3)
        clock.advance(25)  # 09:03:55: before the next instant
        assert [seen.instant for seen in job.seen] == [at(3)]
        clock.advance(60)
        assert [seen.instant for seen in job.seen] == [at(3), at(4)]
        assert all(seen.trigger is Trigger.SCHEDULE for seen in job.seen)

    def test_resume_without_catch_up_runs_no_skipped_instant(self, db_url, replicas, clock):
        job = Job()
        cluster(replicas, MINUTELY, tick=job)
        clock.advance(30)
        admin.pause(db_url, "tick", by="ops", now=clock.now())
        clock.advance(3 * 60)
        change = admin.resume(db_url, "tick", by="ops", now=clock.now())
        assert change.catch_up is None
        clock.advance(60)
        assert [seen.instant for seen in job.seen] == [at(4)]


class TestListening:
    def test_on_postgresql_a_request_is_taken_at_once_not_at_the_next_sweep(self, postgres_url):
        """On the system clock: the scheduler's first sweep runs as it starts, the next one
        15 s later; the request's NOTIFY wakes a sweep in between."""
        with nightly_scheduler(postgres_url) as started:
            asked = time.monotonic()
            admin.trigger(postgres_url, "nightly", by="ops")
            assert started.wait(10), "the request waited for the next sweep"
        assert time.monotonic() - asked < 10


class TestStatements:
    """The request's statements (``lease.Triggers``) at their boundaries, on a clock that
    moves only when told."""

    @pytest.fixture
    def store(self, migrated_engine, manual_clock) -> lease.LeaseStore:
        store = lease.LeaseStore(migrated_engine, clock=manual_clock.now, claim_ahead=None)
        store.ensure(["job"])
        return store

    def open_request(self, store: lease.LeaseStore) -> lease.TriggerRow:
        triggers = lease.Triggers(store)
        [request_id] = triggers.request("job", by="ops")
        [row] = triggers.read([request_id])
        return row

    def test_a_manual_take_keeps_the_instant_claim_out_and_moves_nothing(self, store, manual_clock):
        instant = manual_clock.now().replace(microsecond=0)
        row = self.open_request(store)
        token = lease.Triggers(store).take(row, "a", leased=True)
        assert token is not None
        assert store.claim(["job"], instant, "b") == []  # held: the instant is refused
        read = store.read(["job"])["job"]
        assert (read.instant, read.state, read.token, read.holder) == (
            None,
            lease.LeaseState.NEW,
            token,
            "a",
        )
        assert lease.Triggers(store).end(row.id, "job", token, leased=True, outcome="succeeded")
        assert store.read(["job"])["job"].expires_ms is None
        assert [c.name for c in store.claim(["job"], instant, "b")] == ["job"]

    def test_a_claim_first_refuses_the_request_on_record(self, store, manual_clock):
        instant = manual_clock.now().replace(microsecond=0)
        row = self.open_request(store)
        assert [c.name for c in store.claim(["job"], instant, "b")] == ["job"]
        assert lease.Triggers(store).take(row, "a", leased=True) is None
        [refused] = lease.Triggers(store).read([row.id])
        assert (refused.state, refused.outcome) == (lease.TriggerState.REFUSED, "busy")

    def test_two_holders_take_a_request_once(self, store):
        row = self.open_request(store)
        triggers = lease.Triggers(store)
        first = triggers.take(row, "a", leased=True)
        assert first is not None
        assert triggers.take(row, "b", leased=True) is None
        [taken] = triggers.read([row.id])
        assert (taken.state, taken.holder, taken.token) == (
            lease.TriggerState.RUNNING,
            "a",
            first,
        )

    def test_a_second_run_is_refused_once_another_round_claimed_the_lease(
        self, store, manual_clock
    ):
        triggers = lease.Triggers(store)
        row = self.open_request(store)
        token = triggers.take(row, "a", leased=True)
        assert token is not None
        triggers.end(row.id, "job", token, leased=True, outcome="cut short")
        [cut] = triggers.read([row.id])
        assert cut.state is lease.TriggerState.CUT
        instant = manual_clock.now().replace(microsecond=0)
        store.claim(["job"], instant, "b")  # a scheduled round took the lease since
        manual_clock.advance(60)  # its lease expired: free, but not the request's token
        assert triggers.take(cut, "c", leased=True) is None
        [closed] = triggers.read([row.id])
        assert (closed.state, closed.outcome) == (lease.TriggerState.DONE, "superseded")

    def test_requests_are_pruned_with_the_history(self, store, manual_clock):
        old = self.open_request(store)
        manual_clock.advance(14 * 86400 + 1)
        new = self.open_request(store)
        store.prune(days=14, per_name=10, replicas_gone=3600)
        assert [row.id for row in lease.Triggers(store).read([old.id, new.id])] == [new.id]


def _parse(argv: list[str]) -> object:
    from cronjob.admin._cli import _build_parser

    return _build_parser("cronjob", False).parse_args(argv)
