"""Nothing doubled: faults that used to let two rounds of one instant run at once.

Each test names the fault and checks that the round is run once: a wall clock stepped
back, a ``stop()`` whose drain timed out, a slow write of a round's end, a claim that
returns after ``stop()``, and a forced exit behind a blocked log handler.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from conftest import lease_row

import cronjob
import lease
from cronjob._round import Round
from cronjob.engine._control import Control, Inbox
from cronjob.engine._keeper import EXIT_LEASE_LOST, LeaseKeeper
from cronjob.engine._pinned import Pinned
from cronjob.engine._state import Flags, JobState, Reason, Run
from cronjob.testing import crash
from tests._helpers import JobBodies
from tests.faults.harness import wait_until

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOUR = START + timedelta(hours=1)


@dataclass(frozen=True)
class Ran:
    instant: datetime
    attempt: int
    replica: str


class Rounds(JobBodies[Ran]):
    """Job bodies recording their rounds (thread-safe)."""

    def _noted(self, ctx: cronjob.Round) -> Ran:
        return Ran(ctx.instant, ctx.attempt, ctx.replica)


class TestWallClockStepped:
    def test_a_wall_clock_stepped_back_20_s_neither_delays_renewal_nor_doubles_the_round(
        self, replicas, clock
    ):
        """Renewal and loss deadlines follow the monotonic clock, not the stepped wall."""
        rounds = Rounds(clock)
        registry = cronjob.Registry()
        registry.register(rounds.lasting(60), "0 0 * * * *", "hourly")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance_to(HOUR + timedelta(seconds=1))
        assert [r.attempt for r in rounds.seen] == [1]
        clock.step_wall(-20)  # NTP steps both replicas' wall clocks back; time goes on
        clock.advance(70)
        assert [(r.instant, r.attempt) for r in rounds.seen] == [(HOUR, 1)]

    def test_a_wall_clock_stepped_forward_does_not_make_a_held_lease_count_as_lost(
        self, replicas, clock, db_url
    ):
        rounds = Rounds(clock)
        registry = cronjob.Registry()
        registry.register(rounds.lasting(30), "0 0 * * * *", "hourly")
        replicas(registry, "a")
        clock.advance_to(HOUR + timedelta(seconds=1))
        clock.step_wall(+40)
        clock.advance(1)
        assert lease_row(db_url, "hourly").state is lease.LeaseState.RUNNING
        clock.advance(40)
        assert lease_row(db_url, "hourly").state is lease.LeaseState.DONE  # ran to its end
        assert [r.attempt for r in rounds.seen] == [1]


class TestStopAfterADrainThatTimedOut:
    def test_the_lease_of_a_round_ignoring_the_drain_is_kept_until_it_ends(
        self, replicas, clock, db_url
    ):
        rounds = Rounds(clock)
        registry = cronjob.Registry()
        registry.register(rounds.stubborn(60), "0 0 * * * *", "hourly")
        a = replicas(registry, "a", drain_timeout=0)
        clock.advance_to(HOUR + timedelta(seconds=1))
        replicas(registry, "b")
        a.stop()  # the drain times out at once: the round goes on, ignoring it
        clock.advance(45)  # b sweeps three times; a's lease would have expired at 15 s
        assert [(r.attempt, r.replica) for r in rounds.seen] == [(1, "a")]
        assert lease_row(db_url, "hourly").state is lease.LeaseState.RUNNING
        clock.advance(30)  # the job ends at 60 s: its end is on record, nothing re-runs
        assert lease_row(db_url, "hourly").state is lease.LeaseState.DONE
        assert [(r.attempt, r.replica) for r in rounds.seen] == [(1, "a")]


class TestRenewalUntilTheEndIsOnRecord:
    def test_a_lease_is_renewed_after_the_job_returned_until_its_end_is_settled(
        self, sqlite_url, clock
    ):
        """The keeper alone: a round whose job returned, its end not yet written."""
        engine = lease.create_engine(sqlite_url)
        try:
            lease.migrate(engine)
            store = lease.LeaseStore(engine, clock=clock.lease_clock())
            store.ensure(["job"])
            clock.advance_to(HOUR)
            [claim] = store.claim(["job"], HOUR, "r")
            registry = cronjob.Registry()
            registry.register(lambda ctx: None, "0 0 * * * *", "job")
            [job] = registry._freeze(by="test")
            inbox = Inbox(clock)
            control = Control(clock, inbox)
            keeper = LeaseKeeper(
                clock=clock,
                store=store,
                control=control,
                replica_id="r",
                flags=Flags(),
                cancel=lambda run, cause: None,
                crash=lambda: None,
                on_fatal=lambda message: None,
            )
            ctx = Round(
                name="job",
                instant=HOUR,
                attempt=1,
                replica="r",
                trace_id="",
                clock=clock,
                transaction=lambda ctx: contextlib.nullcontext(),  # type: ignore[arg-type]
            )
            run = Run(
                state=JobState(job),
                ctx=ctx,
                pinned=Pinned.of(job, HOUR),
                token=claim.token,
                reason=Reason.SCHEDULE,
                renewed_at=clock.monotonic(),
            )
            keeper.hold(run, clock.monotonic())
            run.ended = True  # the job returned; the finisher has not written its end
            for _ in range(6):  # 30 s: twice the lease's time-to-live
                clock.advance(5)
                keeper.tick(clock.monotonic())
                clock.advance(0)  # the renewal statement settles
                inbox.run_pending()
            row = store.read(["job"])["job"]
            assert row.state is lease.LeaseState.RUNNING and row.token == claim.token
            assert row.expires_ms is not None
            assert row.expires_ms > store.now_ms()  # still held: nobody can re-run it
            assert run.lost_at is None
            control.shutdown(wait=5)
        finally:
            engine.dispose()


@pytest.mark.postgres
class TestClaimInFlightAtStop:
    def test_a_claim_that_returns_after_stop_gives_its_lease_back(self, postgres_url, clock):
        rounds = Rounds(clock)
        registry = cronjob.Registry()
        registry.register(rounds.lasting(1), "0 0 * * * *", "hourly")
        scheduler = cronjob.Scheduler(postgres_url, registry=registry, clock=clock, replica_id="a")
        scheduler.start()
        engine = sa.create_engine(postgres_url)
        advancing = threading.Thread(target=clock.advance, args=(3600,))
        stopping = threading.Thread(target=scheduler.stop)
        try:
            # start() returns before start-up has written the job's row: lock it once it is
            # there (locking no row would leave the claim unblocked).
            wait_until(lambda: _row_written(engine), 20, "start-up to write the lease row", 0.02)
            with engine.connect() as blocker:
                locked = blocker.execute(
                    sa.text("SELECT name FROM cronjob_lease WHERE name = 'hourly' FOR UPDATE")
                ).all()
                assert locked == [("hourly",)]
                pid = blocker.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
                advancing.start()  # at 10:00 the claim waits behind the row lock
                wait_until(
                    lambda: _claim_waiting(engine, pid), 20, "the claim to wait on its row", 0.02
                )
                stopping.start()
                thread = scheduler._thread
                assert thread is not None
                wait_until(lambda: not thread.is_alive(), 20, "the dispatcher to go", 0.02)
                blocker.rollback()  # the claim goes through after the dispatcher has gone
            stopping.join(30)
            advancing.join(30)
        finally:
            engine.dispose()
        assert rounds.seen == []
        row = lease_row(postgres_url, "hourly")
        assert row.instant == HOUR
        assert row.state is not lease.LeaseState.RUNNING  # given back: no 15 s hole


def _row_written(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        query = sa.text("SELECT count(*) FROM cronjob_lease WHERE name = 'hourly'")
        return bool(conn.execute(query).scalar_one())


def _claim_waiting(engine: sa.Engine, blocker: int) -> bool:
    """Whether a claim waits on the lock that backend ``blocker`` holds (not any claim of
    the server's: other tests' schemas have claims of their own)."""
    with engine.connect() as conn:
        waiting = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE :blocker = ANY(pg_blocking_pids(pid))"
                " AND query ILIKE 'UPDATE cronjob_lease%'"
            ),
            {"blocker": blocker},
        ).scalar_one()
    return bool(waiting)


class TestForcedExit:
    def test_the_exit_after_a_lost_lease_does_not_wait_on_a_blocked_log_handler(self):
        script = """
import logging, threading
from cronjob.engine._keeper import exit_process

class Blocked(logging.Handler):
    def emit(self, record):
        threading.Event().wait()  # a full pipe, a dead network, a held lock

logging.getLogger().addHandler(Blocked())
exit_process("job 'x': the round is still running 5 s after its lease was lost")
"""
        done = subprocess.run([sys.executable, "-c", script], timeout=30, capture_output=True)
        assert done.returncode == EXIT_LEASE_LOST


class TestCrash:
    def test_a_fenced_transaction_open_when_the_replica_crashes_does_not_commit(
        self, db_url, clock
    ):
        """``testing.crash`` stops a replica as a killed process: its open work dies."""
        engine = sa.create_engine(db_url)
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE written (n INTEGER)"))
        outcome: list[str] = []

        def job(ctx: cronjob.Round) -> None:
            try:
                with ctx.transaction() as conn:
                    conn.execute(sa.text("INSERT INTO written (n) VALUES (1)"))
                    ctx.wait(30)  # the replica crashes meanwhile
            except cronjob.LeaseLost as exc:
                outcome.append(str(exc))
                raise

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "writer")
        scheduler = cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="a")
        scheduler.start()
        try:
            clock.advance_to(HOUR + timedelta(seconds=1))
            crash(scheduler)
            clock.advance(1)
        finally:
            scheduler.stop()
        try:
            with engine.connect() as conn:
                count = conn.execute(sa.text("SELECT count(*) FROM written")).scalar_one()
        finally:
            engine.dispose()
        assert outcome == ["job 'writer': the replica crashed"]
        assert count == 0
