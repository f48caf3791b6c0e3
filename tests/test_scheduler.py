"""Every rule of the scheduler, on a fake clock, with replicas sharing one database.

Each test builds two or three schedulers (replicas) on one fake clock and one database
(an SQLite file, PostgreSQL and MariaDB), advances the clock, and checks the rounds the jobs
recorded. Nothing sleeps in real time.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from conftest import DATABASES, PGBOUNCER, database_url, lease_row

import cronjob
import lease
from cronjob import Registry, Scheduler
from cronjob.engine._peers import GRACE, REST_RECENT, Peers
from cronjob.testing import FakeClock, crash
from tests._helpers import JobBodies, statements

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(hours: int = 0, minutes: int = 0, seconds: int = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes, seconds=seconds)


@dataclass(frozen=True)
class Ran:
    name: str
    instant: datetime
    attempt: int
    replica: str
    started: datetime


class Recorder(JobBodies):
    """Job bodies that record each round they run (thread-safe)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.rounds: list[Ran] = []
        self.contexts: list[cronjob.Round] = []

    def _record(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.rounds.append(
                Ran(ctx.name, ctx.instant, ctx.attempt, ctx.replica, self.clock.now())
            )
            self.contexts.append(ctx)

    def quick(self, ctx: cronjob.Round) -> None:
        self._record(ctx)

    def instants(self, name: str | None = None) -> list[datetime]:
        return sorted(r.instant for r in self.rounds if name in (None, r.name))


@pytest.fixture
def recorder(clock: FakeClock) -> Recorder:
    return Recorder(clock)


def execute(url: str, statement: str, **params) -> None:
    engine = lease.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement), params)
    finally:
        engine.dispose()


class TestOncePerInstant:
    @pytest.fixture(params=[*DATABASES, PGBOUNCER])
    def db_url(self, request: pytest.FixtureRequest) -> str:
        """Each database, and PostgreSQL through PgBouncer in transaction mode."""
        return database_url(request, request.param)

    def test_each_instant_runs_once_across_three_replicas(self, replicas, clock, recorder):
        registry = Registry()
        registry.register(recorder.quick, "0 * * * * *", "tick")
        for replica in "abc":
            replicas(registry, replica)
        clock.advance(3600)
        assert recorder.instants() == [at(minutes=m) for m in range(1, 61)]
        assert all(r.attempt == 1 for r in recorder.rounds)

    def test_a_round_gets_its_instant_trace_id_and_replica(self, replicas, clock, recorder):
        registry = Registry()
        registry.register(recorder.quick, "0 */5 * * * *", "five")
        replicas(registry, "solo")
        clock.advance(600)
        first, second = recorder.contexts
        assert (first.name, first.instant, first.attempt, first.replica) == (
            "five",
            at(minutes=5),
            1,
            "solo",
        )
        assert first.instant.tzinfo is UTC
        assert len(first.trace_id) == 32 and int(first.trace_id, 16)
        assert first.trace_id != second.trace_id

    def test_a_held_lease_keeps_the_next_instants_from_every_replica(
        self, url, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register(recorder.lasting(90), "0 * * * * *", "slow")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(6 * 60)
        # 09:01 runs until 09:02:30: nobody runs 09:02; 09:03 until 09:04:30; and so on.
        assert recorder.instants() == [at(minutes=1), at(minutes=3), at(minutes=5)]
        assert all(r.attempt == 1 for r in recorder.rounds)

    def test_an_overrun_instant_is_put_on_record(self, url, replicas, clock, recorder):
        registry = Registry()
        registry.register(recorder.lasting(90), "0 * * * * *", "slow")
        replicas(registry, "a")
        clock.advance(3 * 60)  # the 09:01 round ends at 09:02:30
        row = lease_row(url, "slow")
        assert row.skipped_through == at(minutes=2, seconds=30)


class TestSpreading:
    """The rounds of an instant are shared across the live replicas (``cronjob/_peers.py``)."""

    @pytest.fixture(params=[*DATABASES, PGBOUNCER])
    def db_url(self, request: pytest.FixtureRequest) -> str:
        """Each database, and PostgreSQL through PgBouncer in transaction mode."""
        return database_url(request, request.param)

    JOBS = 30

    def _registry(self, recorder: Recorder) -> Registry:
        registry = Registry()
        for i in range(self.JOBS):
            registry.register(recorder.quick, "* * * * * *", f"job-{i:02d}")
        return registry

    def _per_instant(self, recorder: Recorder, since: datetime) -> dict[datetime, Counter[str]]:
        per: dict[datetime, Counter[str]] = {}
        for r in recorder.rounds:
            if r.instant > since:
                per.setdefault(r.instant, Counter())[r.replica] += 1
        return per

    def test_three_replicas_each_start_a_fair_share_of_every_instant(
        self, replicas, clock, recorder
    ):
        registry = self._registry(recorder)
        for replica in "abc":
            replicas(registry, replica)
        clock.advance(60)  # each learns the others from the lease holders
        since = clock.now()
        clock.advance(20)
        per = self._per_instant(recorder, since)
        assert len(per) == 20
        for instant, counts in sorted(per.items()):
            # A fair share is 10 of the 30 jobs: 80-120 % is 8 to 12, at every instant.
            assert sorted(counts) == ["a", "b", "c"], instant
            assert all(8 <= n <= 12 for n in counts.values()), (instant, counts)
            assert sum(counts.values()) == self.JOBS, instant
        pairs = [(r.name, r.instant) for r in recorder.rounds]
        assert len(pairs) == len(set(pairs))  # no instant ran twice
        assert all(r.attempt == 1 for r in recorder.rounds)

    def test_replicas_started_together_share_fairly_within_seconds(self, replicas, clock, recorder):
        """Views converge in a few instants: each counts the replicas on record from its
        first read, and reads a second apart while reads change the view."""
        registry = self._registry(recorder)
        for replica in "abc":
            replicas(registry, replica)
        clock.advance(5)
        since = clock.now()
        clock.advance(10)
        per = self._per_instant(recorder, since)
        assert len(per) == 10
        for instant, counts in sorted(per.items()):
            assert sorted(counts) == ["a", "b", "c"], instant
            assert all(8 <= n <= 12 for n in counts.values()), (instant, counts)

    def test_the_replicas_look_for_the_rest_one_after_the_other_a_grace_apart(self, clock):
        """Not every replica reading the rows left at the same moment and racing for
        them: at each instant one looks first (the one that deals the first job), the
        others a grace apart, and the first changes with the instant."""
        view = ("a", "b", "c")
        peers = {}
        for replica in view:
            peers[replica] = Peers(
                clock=clock, store=None, control=None, replica_id=replica, jobs={}
            )  # type: ignore[arg-type]
            peers[replica].view = view
        for step in (timedelta(seconds=1), timedelta(minutes=1), timedelta(hours=1)):
            # Instants a minute or an hour apart too: their seconds are multiples of 3.
            firsts = set()
            for n in range(12):
                instant = at(seconds=0) + n * step
                after = {r: p.rest_after(instant) for r, p in peers.items()}
                assert sorted(after.values()) == [timedelta(seconds=GRACE * k) for k in (1, 2, 3)]
                firsts.add(min(after, key=after.__getitem__))
            assert firsts == set(view), step

    def test_the_look_for_the_rest_reaches_a_day_back_once_a_minute(self, clock):
        """Most looks reach REST_RECENT seconds back; one a minute reaches a whole day,
        for rows that missed earlier instants."""
        peers = Peers(clock=clock, store=None, control=None, replica_id="a", jobs={})  # type: ignore[arg-type]
        reach = [peers.rest_within(at(seconds=s)) for s in range(0, 121)]
        wide = [s for s, within in enumerate(reach) if within == lease.UNCLAIMED_WITHIN]
        assert wide == [0, 60, 120]
        assert set(reach) == {lease.UNCLAIMED_WITHIN, REST_RECENT}
        assert peers.rest_within(at(seconds=5)) == lease.UNCLAIMED_WITHIN  # a clock set back

    @pytest.mark.parametrize("leave", ["crash", "drain"])
    def test_a_dead_or_draining_replicas_share_is_taken_in_the_same_instant(
        self, replicas, clock, recorder, leave
    ):
        registry = self._registry(recorder)
        *_, c = (replicas(registry, replica) for replica in "abc")
        clock.advance(60.5)
        if leave == "crash":
            crash(c)
        else:
            assert c.drain()  # its rounds (instant) ended long ago: nothing to wait for
        died = clock.now()
        clock.advance(15)
        per = self._per_instant(recorder, died)
        assert len(per) == 15
        for instant, counts in sorted(per.items()):
            assert sum(counts.values()) == self.JOBS, instant  # nothing left unclaimed
            assert sorted(counts) == ["a", "b"], instant
        # The first instant after it died, its share included: started within the grace.
        first = [r for r in recorder.rounds if r.instant == min(per)]
        assert max(r.started - r.instant for r in first) <= timedelta(seconds=0.25)
        # The first live one in turn takes the whole of the dead one's share.
        assert sorted(per[min(per)].values()) == [10, 20]
        # Once the others read who claims (within 5 s), its share goes to them: 15 each.
        later = {i: n for i, n in per.items() if i >= died + timedelta(seconds=8)}
        assert later and all(12 <= n <= 18 for counts in later.values() for n in counts.values())
        pairs = [(r.name, r.instant) for r in recorder.rounds]
        assert len(pairs) == len(set(pairs))


class TestClaimLead:
    """A replica's share of an instant is claimed as far ahead as its claims take
    (``cronjob/_lead.py``); the rounds it won start on the instant."""

    JOBS = 4  # enough to share, even for a replica alone (see _peers.SPREAD_FROM)

    @staticmethod
    def _slow_claims(monkeypatch, clock, seconds, sent=None):
        claim = lease.LeaseStore.claim_batch

        def slow_claim(store, names, instant, holder, **kw):  # an answer `seconds` away
            if sent is not None:
                sent.append((instant, clock.now()))
            claims = claim(store, names, instant, holder, **kw)
            clock.sleep(seconds)
            return claims

        monkeypatch.setattr(lease.LeaseStore, "claim_batch", slow_claim)

    def test_claims_go_out_ahead_by_what_they_take_and_rounds_start_on_time(
        self, replicas, clock, recorder, monkeypatch
    ):
        sent: list[tuple[datetime, datetime]] = []
        self._slow_claims(monkeypatch, clock, 0.04, sent)
        registry = Registry()
        for i in range(self.JOBS):
            registry.register(recorder.quick, "* * * * * *", f"tick-{i}")
        replicas(registry, "a")
        clock.advance(5.5)
        rounds = sorted(recorder.rounds, key=lambda r: (r.instant, r.name))
        assert sorted({r.instant for r in rounds}) == [at(seconds=s) for s in range(1, 6)]
        assert len(rounds) == 5 * self.JOBS
        # The first claim knew nothing yet: sent on its instant, its rounds 40 ms late.
        assert sent[0] == (at(seconds=1), at(seconds=1))
        assert all(r.started == at(seconds=1.04) for r in rounds[: self.JOBS])
        for instant, when in sent[1:]:  # then 1.25 x the 40 ms ahead
            assert instant - when == timedelta(seconds=0.05), instant
        assert all(r.started == r.instant for r in rounds[self.JOBS :])
        assert len(sent) == 5  # one claim per instant: none lost, none twice

    def test_an_instant_too_small_to_share_is_claimed_on_it(
        self, replicas, clock, recorder, monkeypatch
    ):
        """Every replica claims it whole, and the first wins: none goes ahead, so a
        replica never finds its lease still held by a round about to end, and loses it."""
        sent: list[tuple[datetime, datetime]] = []
        self._slow_claims(monkeypatch, clock, 0.04, sent)
        registry = Registry()
        registry.register(recorder.quick, "* * * * * *", "tick")
        replicas(registry, "a")
        clock.advance(3.5)
        assert sent == [(at(seconds=s), at(seconds=s)) for s in (1, 2, 3)]
        assert [r.started for r in recorder.rounds] == [at(seconds=s + 0.04) for s in (1, 2, 3)]

    def test_a_replica_drained_between_its_claim_and_the_instant_hands_the_round_on(
        self, url, replicas, clock, recorder, monkeypatch
    ):
        # Below the grace: a claim sleeping on the clock holds the replica's one thread
        # for statements, so a second statement queued behind it would stop the clock.
        self._slow_claims(monkeypatch, clock, 0.05)
        registry = Registry()
        for i in range(self.JOBS):
            registry.register(recorder.quick, "* * * * * *", f"tick-{i}")
        a = replicas(registry, "a")
        clock.advance(3.99)  # claims go out 62.5 ms ahead now: those of 4 s are won, held
        assert lease_row(url, "tick-0").instant == at(seconds=4)
        assert not any(r.instant == at(seconds=4) for r in recorder.rounds)
        assert a.drain()
        replicas(registry, "b")
        clock.advance(2)
        ran = {(r.name, r.instant): r for r in recorder.rounds}
        for i in range(self.JOBS):  # handed on as cut short, not lost: the other ran them
            then = ran[(f"tick-{i}", at(seconds=4))]
            assert (then.replica, then.attempt) == ("b", 2)
        assert len(recorder.rounds) == len(ran)  # and no instant twice

    def test_a_lease_still_held_ahead_of_the_instant_is_claimed_again_after_the_grace(
        self, replicas, clock, recorder, monkeypatch
    ):
        """A share's claim sent ahead finds a job's lease held by the round before, which
        ends just before the instant on a replica that then drains: the instant still
        runs, one grace (and a claim) late, on the replica whose claim lost it."""
        self._slow_claims(monkeypatch, clock, 0.04)
        slow, instant = at(minutes=1), at(minutes=1, seconds=1)

        def long(ctx: cronjob.Round) -> None:
            recorder.quick(ctx)
            if ctx.instant == slow and ctx.wait(0.98):  # ends 20 ms before the next
                ctx.check()

        registry = Registry()
        for i in range(8):
            registry.register(recorder.quick, "* * * * * *", f"tick-{i}")
        registry.register(long, "* * * * * *", "long")
        schedulers = {name: replicas(registry, name) for name in "ab"}
        clock.advance(60)  # each sees the other; claims go out 50 ms ahead
        clock.advance(0.99)
        (runner,) = [r.replica for r in recorder.rounds if r.name == "long" and r.instant == slow]
        assert schedulers[runner].drain()
        clock.advance(0.3)
        (then,) = [r for r in recorder.rounds if r.name == "long" and r.instant == instant]
        # The other replica runs it: in its share, its claim found the lease held and it
        # claims it again one grace later; in the runner's, which drained, the other's
        # look for the rest takes it at its turn (one or two graces). Plus the 40 ms claim.
        assert then.replica != runner
        assert then.attempt == 1
        assert then.started - instant in (timedelta(seconds=0.14), timedelta(seconds=0.24))
        pairs = [(r.name, r.instant) for r in recorder.rounds]
        assert len(pairs) == len(set(pairs))


class TestPerInstance:
    def test_run_at_start_runs_a_per_instance_job_once_as_each_replica_starts(
        self, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register_per_instance(recorder.quick, "@every 3600s", "warm", run_at_start=True)
        clock.advance(1800)  # 09:30
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(1800)  # 10:00: the schedule, on both
        starts = [(r.instant, r.replica) for r in recorder.rounds]
        assert sorted(starts) == [(at(0, 30), "a"), (at(0, 30), "b"), (at(1), "a"), (at(1), "b")]

    def test_without_run_at_start_a_per_instance_job_waits_for_its_instant(
        self, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register_per_instance(recorder.quick, "@every 3600s", "warm")
        clock.advance(1800)
        replicas(registry, "a")
        clock.advance(1800)
        assert [r.instant for r in recorder.rounds] == [at(1)]

    def test_every_replica_runs_each_instant(self, replicas, clock, recorder):
        registry = Registry()
        registry.register_per_instance(recorder.quick, "*/20 * * * * *", "local")
        for replica in "abc":
            replicas(registry, replica)
        clock.advance(60)
        assert sorted((r.instant, r.replica) for r in recorder.rounds) == [
            (at(seconds=s), replica) for s in (20, 40, 60) for replica in "abc"
        ]

    def test_it_never_takes_a_lease(self, url, replicas, clock, recorder):
        registry = Registry()
        registry.register_per_instance(recorder.quick, "*/20 * * * * *", "local")
        replicas(registry, "a")
        clock.advance(60)
        engine = lease.create_engine(url)
        try:
            assert lease.LeaseStore(engine).read(["local"]) == {}
        finally:
            engine.dispose()

    def test_a_round_cut_short_is_not_run_again(self, replicas, clock, recorder):
        registry = Registry()
        registry.register_per_instance(recorder.lasting(30), "0 0 * * * *", "local")
        a = replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(3600)
        a.stop()
        clock.advance(60)
        assert sorted((r.replica, r.attempt) for r in recorder.rounds) == [("a", 1), ("b", 1)]


class TestOutcomes:
    def test_a_job_that_raises_ran_to_its_end_and_is_not_run_again(
        self, url, replicas, clock, recorder, caplog
    ):
        def failing(ctx: cronjob.Round) -> None:
            recorder.quick(ctx)
            raise ValueError("boom")

        registry = Registry()
        registry.register(failing, "0 0 * * * *", "failing")
        replicas(registry, "a")
        replicas(registry, "b")
        with caplog.at_level(logging.ERROR, logger="cronjob"):
            clock.advance(3600 + 60)
        assert [(r.instant, r.attempt) for r in recorder.rounds] == [(at(hours=1), 1)]
        assert lease_row(url, "failing").state is lease.LeaseState.DONE
        assert any("failed" in r.getMessage() and r.exc_info for r in caplog.records)

    def test_a_group_holding_the_cancellation_is_cut_short(self, url, replicas, clock, recorder):
        def grouped(ctx: cronjob.Round) -> None:
            recorder.quick(ctx)
            ctx.wait(60)
            try:
                ctx.check()
            except cronjob.Cancelled as cancelled:
                raise ExceptionGroup("both", [cancelled, KeyError("own")]) from None

        registry = Registry()
        registry.register(grouped, "0 0 * * * *", "grouped")
        a = replicas(registry, "a")
        clock.advance(3600)
        a.stop()
        assert lease_row(url, "grouped").state is lease.LeaseState.CUT

    def test_a_cancellation_merely_chained_reads_as_ran_to_its_end(
        self, url, replicas, clock, recorder, caplog
    ):
        def chained(ctx: cronjob.Round) -> None:
            recorder.quick(ctx)
            ctx.wait(60)
            try:
                ctx.check()
            except cronjob.Cancelled as cancelled:
                raise RuntimeError("own failure") from cancelled

        registry = Registry()
        registry.register(chained, "0 0 * * * *", "chained")
        a = replicas(registry, "a")
        clock.advance(3600)
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            a.stop()
        assert lease_row(url, "chained").state is lease.LeaseState.DONE
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert any(
            "round of job 'chained' instant 2026-03-02T10:00:00+00:00 attempt 1 was cancelled"
            in r.getMessage()
            and "will not run again" in r.getMessage()
            for r in warned
        )


class TestSecondRun:
    @pytest.fixture(params=[*DATABASES, PGBOUNCER])
    def db_url(self, request: pytest.FixtureRequest) -> str:
        """Each database, and PostgreSQL through PgBouncer in transaction mode."""
        return database_url(request, request.param)

    def test_drain_gives_the_lease_back_and_another_replica_runs_attempt_2(
        self, url, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register(recorder.lasting(30), "0 0 * * * *", "hourly")
        a = replicas(registry, "a")
        b = replicas(registry, "b")
        clock.advance(3600)
        [first] = recorder.rounds
        runner, other = (a, b) if first.replica == "a" else (b, a)
        drained_at = clock.now()
        assert runner.drain() is True
        runner.stop()
        assert lease_row(url, "hourly").state is lease.LeaseState.CUT
        clock.advance(15)
        second = recorder.rounds[1]
        assert (second.instant, second.attempt, second.replica) == (
            at(hours=1),
            2,
            other.replica_id,
        )
        assert second.started - drained_at <= timedelta(seconds=15)
        clock.advance(30)
        assert lease_row(url, "hourly").state is lease.LeaseState.DONE
        assert len(recorder.rounds) == 2

    def test_a_crashed_replicas_round_runs_again_once_its_lease_expired(
        self, url, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register(recorder.lasting(100), "0 0 * * * *", "hourly")
        a = replicas(registry, "a")
        clock.advance(3600 + 5)  # a runs 10:00 and renews at 10:00:05
        replicas(registry, "b")
        crash(a)
        crashed_at = clock.now()
        clock.advance(14)  # the lease (renewed at 10:00:05) lives until 10:00:20
        assert [r.attempt for r in recorder.rounds] == [1]
        clock.advance(30)
        second = recorder.rounds[1]
        assert (second.instant, second.attempt, second.replica) == (at(hours=1), 2, "b")
        assert second.started - crashed_at <= timedelta(seconds=30)

    def test_the_rounds_a_crashed_replica_left_run_again_in_one_claim_per_instant(
        self, url, replicas, clock, recorder
    ):
        registry = Registry()
        names = [f"job-{i:02d}" for i in range(40)]
        for name in names:
            registry.register(recorder.lasting(100), "0 0 * * * *", name)
        a = replicas(registry, "a")
        clock.advance(3600 + 5)  # a runs the 40 rounds of 10:00
        engine = lease.create_engine(url)
        second_runs = statements(
            engine, keep=lambda s: s.startswith("UPDATE") and ".attempt = " in s
        )
        with second_runs as sent:
            replicas(registry, "b", database=engine)
            crash(a)
            clock.advance(45)  # the leases expire; b's sweep finds the rounds cut short
        engine.dispose()
        again = [r for r in recorder.rounds if r.attempt == 2]
        assert sorted(r.name for r in again) == names
        assert {(r.instant, r.replica) for r in again} == {(at(hours=1), "b")}
        assert len(sent) == 1, sent

    def test_a_round_cut_short_twice_is_given_up(self, url, replicas, clock, recorder, caplog):
        registry = Registry()
        registry.register(recorder.lasting(100), "0 0 * * * *", "hourly")
        a = replicas(registry, "a")
        clock.advance(3600)
        b = replicas(registry, "b")
        a.stop()  # cut short: b runs it a second time
        clock.advance(15)
        assert [(r.attempt, r.replica) for r in recorder.rounds] == [(1, "a"), (2, "b")]
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            b.stop()  # cut short again: given up
        assert any("cut short a second time" in r.getMessage() for r in caplog.records)
        replicas(registry, "c")
        clock.advance(60)
        assert len(recorder.rounds) == 2

    def test_a_later_instant_supersedes_an_unfinished_round(
        self, url, replicas, clock, recorder, caplog
    ):
        registry = Registry()
        registry.register(recorder.lasting(100), "*/20 * * * * *", "often")
        a = replicas(registry, "a")
        b = replicas(registry, "b")
        clock.advance(20)  # a or b claims 09:00:20
        [first] = recorder.rounds
        runner, other = (a, b) if first.replica == "a" else (b, a)
        clock.advance(1)
        crash(runner)  # the lease (claimed 09:00:20, never renewed) lives until 09:00:35
        with caplog.at_level(logging.WARNING, logger="cronjob"):
            clock.advance(40)  # other claims 09:00:40 before a sweep at 09:00:45 finds :20
        assert [(r.instant, r.attempt, r.replica) for r in recorder.rounds] == [
            (at(seconds=20), 1, runner.replica_id),
            (at(seconds=40), 1, other.replica_id),
        ]
        assert any(
            "unfinished round of 2026-03-02T09:00:20+00:00" in r.getMessage()
            for r in caplog.records
        )


class TestCatchUp:
    @staticmethod
    def run_then_stop(replicas, registry, seconds: float) -> None:
        scheduler = replicas(registry, "first")
        scheduler.clock.advance(seconds)
        scheduler.stop()

    def test_after_a_three_hour_outage_the_latest_instant_runs_once(
        self, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register(recorder.quick, "0 0 * * * *", "hourly")
        self.run_then_stop(replicas, registry, 3600)  # runs 10:00
        clock.advance(3 * 3600 + 1800)  # down through 11:00, 12:00, 13:00; now 13:30
        replicas(registry, "b")
        replicas(registry, "c")
        clock.advance(0)
        assert recorder.instants() == [at(hours=1), at(hours=4)]
        clock.advance(1800)
        assert recorder.instants() == [at(hours=1), at(hours=4), at(hours=5)]

    def test_an_hourly_job_down_for_two_days_catches_up_its_latest_hour(
        self, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register(recorder.quick, "0 0 * * * *", "hourly")
        self.run_then_stop(replicas, registry, 3600)
        clock.advance(48 * 3600 + 600)
        replicas(registry, "b")
        clock.advance(0)
        assert recorder.instants() == [at(hours=1), at(hours=49)]

    def test_a_weekly_job_whose_instant_passed_47_hours_ago_is_not_caught_up(
        self, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register(recorder.quick, "@weekly", "weekly")  # Sundays 00:00 UTC
        clock.advance_to(datetime(2026, 3, 7, 23, 0, tzinfo=UTC))  # Saturday night
        self.run_then_stop(replicas, registry, 3600 + 60)
        assert recorder.instants() == [datetime(2026, 3, 8, tzinfo=UTC)]
        clock.advance_to(datetime(2026, 3, 16, 23, 0, tzinfo=UTC))  # 47 h after 03-15
        replicas(registry, "b")
        clock.advance(0)
        assert recorder.instants() == [datetime(2026, 3, 8, tzinfo=UTC)]

    def test_a_job_that_never_ran_starts_with_its_next_instant(self, replicas, clock, recorder):
        registry = Registry()
        registry.register(recorder.quick, "0 0 * * * *", "hourly")
        clock.advance(1800)
        replicas(registry, "a")
        clock.advance(0)
        assert recorder.rounds == []
        clock.advance(1800)
        assert recorder.instants() == [at(hours=1)]

    def test_a_first_instant_that_passed_while_every_replica_restarted_runs_once(
        self, url, replicas, clock, recorder
    ):
        """Deployed at 09:00:10 (its row written then), stopped before its first instant
        (09:00:24), started again after it: that instant was the job's to run."""
        registry = Registry()
        registry.register(recorder.quick, "24 0 9 * * *", "daily")
        clock.advance(10)
        self.run_then_stop(replicas, registry, 5)  # up from 09:00:10 to 09:00:15
        assert recorder.rounds == []
        assert lease_row(url, "daily").deployed == at(seconds=10)
        clock.advance(15)  # 09:00:30
        replicas(registry, "b")
        replicas(registry, "c")
        clock.advance(0)
        assert recorder.instants() == [at(seconds=24)]
        clock.advance(3600)
        assert recorder.instants() == [at(seconds=24)]

    def test_a_first_instant_at_the_moment_its_row_was_written_is_not_owed(
        self, url, replicas, clock, recorder
    ):
        """The boundary: a row written 1 ms before the instant owes it; one written at the
        instant itself does not (the replica that wrote it started at or before it, and a
        schedule starts strictly after its start)."""
        before, at_it = Registry(), Registry()
        before.register(recorder.quick, "24 0 9 * * *", "before")
        at_it.register(recorder.quick, "24 0 9 * * *", "at")
        clock.advance_to(at(seconds=24) - timedelta(milliseconds=1))
        self.run_then_stop(replicas, before, 0)
        clock.advance(0.001)  # 09:00:24.000
        scheduler = replicas(at_it, "second")
        clock.advance(0)
        scheduler.stop()
        assert recorder.rounds == []
        assert lease_row(url, "before").deployed == at(seconds=24) - timedelta(milliseconds=1)
        assert lease_row(url, "at").deployed == at(seconds=24)
        clock.advance(6)  # 09:00:30, every replica down since 09:00:24
        both = Registry()
        both.register(recorder.quick, "24 0 9 * * *", "before")
        both.register(recorder.quick, "24 0 9 * * *", "at")
        replicas(both, "b")
        clock.advance(0)
        assert [(r.name, r.instant) for r in recorder.rounds] == [("before", at(seconds=24))]

    def test_a_row_an_older_release_wrote_owes_no_instant_before_it_ran(
        self, url, replicas, clock, recorder
    ):
        """No deployment on record (a replica of release 0004 wrote the row): the rule of
        that release holds — 09:00:24 is not caught up — and this release's start puts its
        own deployment on record, which owes the instants after it."""
        engine = lease.create_engine(url)
        lease.migrate(engine)
        engine.dispose()
        execute(  # what release 0004's ensure inserts: no deployed_ms
            url,
            "INSERT INTO cronjob_lease (name, instant, attempt, state, token)"
            " VALUES ('daily', -1, 1, 'new', 0)",
        )
        registry = Registry()
        registry.register(recorder.quick, "24 0 9 * * *", "daily")
        clock.advance(30)  # 09:00:30
        self.run_then_stop(replicas, registry, 0)
        assert recorder.rounds == []
        assert lease_row(url, "daily").deployed == at(seconds=30)
        clock.advance(24 * 3600)  # every replica down across tomorrow's 09:00:24
        replicas(registry, "b")
        clock.advance(0)
        assert recorder.instants() == [at(hours=24, seconds=24)]

    def test_an_instant_overrun_by_a_round_that_ran_to_its_end_is_not_caught_up(
        self, replicas, clock, recorder
    ):
        registry = Registry()
        registry.register(recorder.lasting(90), "0 * * * * *", "slow")
        self.run_then_stop(replicas, registry, 60 + 95)  # 09:01 runs to 09:02:30
        clock.advance(10)  # 09:02:45: the latest instant, 09:02, was overrun
        replicas(registry, "b")
        clock.advance(0)
        assert recorder.instants() == [at(minutes=1)]


class TestLeaseLoss:
    def test_a_taken_lease_cancels_the_round_and_ends_the_process_5_s_later(
        self, url, replicas, clock, recorder
    ):
        exits: list[str] = []
        registry = Registry()
        registry.register(recorder.stubborn(60), "0 0 * * * *", "hourly")
        a = replicas(registry, "a", on_fatal=exits.append)
        clock.advance(3600)
        # Another claim takes the lease: the fencing token changes under the round.
        execute(url, "UPDATE cronjob_lease SET token = 12345 WHERE name = 'hourly'")
        clock.advance(5)  # the renewal finds it taken
        [ctx] = recorder.contexts
        assert isinstance(ctx.cause, cronjob.LeaseLost)
        assert exits == []
        clock.advance(4)
        assert exits == []
        clock.advance(1)  # 5 s after the loss, the round still runs
        assert len(exits) == 1 and "still running 5 s after its lease was lost" in exits[0]
        assert a._crashed

    def test_no_renewal_for_10_s_counts_as_lost(self, url, replicas, clock, recorder):
        exits: list[str] = []
        registry = Registry()
        registry.register(recorder.lasting(60), "0 0 * * * *", "hourly")
        replicas(registry, "a", on_fatal=exits.append)
        clock.advance(3600)
        execute(url, "ALTER TABLE cronjob_lease RENAME TO cronjob_lease_away")
        try:
            clock.advance(9)
            [ctx] = recorder.contexts
            assert not ctx.cancelled
            clock.advance(1)
            assert isinstance(ctx.cause, cronjob.LeaseLost)
        finally:
            execute(url, "ALTER TABLE cronjob_lease_away RENAME TO cronjob_lease")
        assert exits == []  # the round stopped when told

    def test_a_fenced_transaction_refuses_once_the_lease_is_gone(
        self, url, replicas, clock, recorder
    ):
        errors: list[BaseException] = []

        def writer(ctx: cronjob.Round) -> None:
            recorder.quick(ctx)
            ctx.wait(2)
            try:
                with ctx.transaction() as conn:
                    conn.execute(sa.text("SELECT 1"))
            except cronjob.LeaseLost as exc:
                errors.append(exc)
                raise

        registry = Registry()
        registry.register(writer, "0 0 * * * *", "writer")
        replicas(registry, "a", on_fatal=lambda message: None)
        clock.advance(3600)
        execute(url, "UPDATE cronjob_lease SET token = 12345 WHERE name = 'writer'")
        clock.advance(2)
        assert len(errors) == 1

    def test_a_ctx_kept_past_its_round_holds_nothing(self, replicas, clock, recorder):
        """The round's record is freed once the round is over, without the cyclic garbage
        collector (no cycle between the round and its ``ctx``); a fenced transaction
        opened on the ``ctx`` afterwards is refused."""
        registry = Registry()
        registry.register(recorder.quick, "0 0 * * * *", "hourly")
        replicas(registry, "a")
        gc.disable()  # only reference counts free anything now
        try:
            # Two rounds: the threads' loops keep their last round until their next one.
            clock.advance(2 * 3600)
            first, _second = recorder.contexts
            assert first._run() is None
        finally:
            gc.enable()
        with pytest.raises(cronjob.LeaseLost, match="no longer holds it"):
            first.transaction().__enter__()

    def test_a_fenced_transaction_commits_while_the_lease_holds(self, url, replicas, clock):
        execute(url, "CREATE TABLE IF NOT EXISTS report_out (n INTEGER)")
        execute(url, "DELETE FROM report_out")

        def writer(ctx: cronjob.Round) -> None:
            with ctx.transaction() as conn:
                conn.execute(sa.text("INSERT INTO report_out (n) VALUES (7)"))

        registry = Registry()
        registry.register(writer, "0 0 * * * *", "writer")
        replicas(registry, "a")
        clock.advance(3600)
        engine = lease.create_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT n FROM report_out")).scalars().all() == [7]
                conn.execute(sa.text("DROP TABLE report_out"))
                conn.commit()
        finally:
            engine.dispose()


class TestAsyncJobs:
    def test_an_async_job_runs_with_its_round(self, replicas, clock, recorder):
        async def job(ctx: cronjob.Round) -> None:
            await asyncio.sleep(0)
            recorder.quick(ctx)

        registry = Registry()
        registry.register(job, "0 */30 * * * *", "async")
        replicas(registry, "a")
        clock.advance(3600)
        assert recorder.instants() == [at(minutes=30), at(hours=1)]

    def test_an_object_with_an_async_call_runs_as_an_async_job(self, replicas, clock, recorder):
        """Not mistaken for a sync job, whose coroutine a worker would drop unawaited."""

        class Job:
            async def __call__(self, ctx: cronjob.Round) -> None:
                await asyncio.sleep(0)
                recorder.quick(ctx)

        registry = Registry()
        registry.register(Job(), "0 */30 * * * *", "object")
        registry.register(functools.partial(Job()), "0 */30 * * * *", "partial")
        replicas(registry, "a")
        clock.advance(3600)
        assert recorder.instants("object") == [at(minutes=30), at(hours=1)]
        assert recorder.instants("partial") == [at(minutes=30), at(hours=1)]

    def test_an_async_job_waits_on_the_clock_and_is_cut_short_by_drain(
        self, url, replicas, clock, recorder
    ):
        woke: list[datetime] = []

        async def job(ctx: cronjob.Round) -> None:
            recorder.quick(ctx)
            await ctx.wait_async(10)
            woke.append(clock.now())
            await ctx.wait_async(100)

        registry = Registry()
        registry.register(job, "0 0 * * * *", "async")
        a = replicas(registry, "a")
        clock.advance(3600 + 10)
        assert woke == [at(hours=1, seconds=10)]
        a.stop()
        assert lease_row(url, "async").state is lease.LeaseState.CUT


class TestLifecycle:
    def test_an_empty_registry_opens_no_connection(self, clock):
        scheduler = Scheduler(
            "postgresql+psycopg://nobody@127.0.0.1:1/none", registry=Registry(), clock=clock
        )
        with scheduler:
            assert scheduler.engine is None

    def test_registering_after_start_raises(self, replicas, recorder):
        registry = Registry()
        registry.register(recorder.quick, "@hourly", "a")
        replicas(registry, "a")
        with pytest.raises(RuntimeError, match=r"^cannot register job 'b'"):
            registry.register(recorder.quick, "@hourly", "b")

    def test_a_scheduler_starts_once(self, replicas, recorder):
        registry = Registry()
        registry.register(recorder.quick, "@hourly", "a")
        scheduler = replicas(registry, "a")
        with pytest.raises(RuntimeError, match=r"^scheduler 'a' was already started$"):
            scheduler.start()

    def test_a_replica_id_the_holder_column_cannot_store_is_refused_at_construction(
        self, tmp_path, clock, recorder
    ):
        """Accepted, it would fail every claim after the start instead."""
        registry = Registry()
        registry.register(recorder.quick, "@hourly", "a")
        url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
        with pytest.raises(ValueError, match=r"^a holder must be a string of 1 to 255 char"):
            Scheduler(url, registry=registry, clock=clock, replica_id="x" * 256)
        with pytest.raises(ValueError, match=r"^holder 'r\\x00' contains a NUL character"):
            Scheduler(url, registry=registry, clock=clock, replica_id="r\x00")

    @pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
    def test_an_in_memory_sqlite_database_is_refused_at_start(self, url, clock, recorder):
        registry = Registry()
        registry.register_per_instance(recorder.quick, "@hourly", "a")
        scheduler = Scheduler(url, registry=registry, clock=clock)
        with pytest.raises(lease.UnsupportedDatabase, match=r"^the in-memory SQLite database"):
            scheduler.start()
        with pytest.raises(lease.UnsupportedDatabase, match=r"^the in-memory SQLite database"):
            Scheduler(sa.create_engine(url), registry=registry, clock=clock).start()

    def test_auto_migrate_off_refuses_a_blank_database(self, tmp_path, clock, recorder):
        registry = Registry()
        registry.register(recorder.quick, "@hourly", "a")
        scheduler = Scheduler(
            f"sqlite:///{tmp_path / 'blank.sqlite'}",
            registry=registry,
            clock=clock,
            auto_migrate=False,
        )
        with pytest.raises(lease.MigrationRequired):
            scheduler.start()


class TestDaylightSaving:
    def test_a_fixed_time_job_runs_once_on_the_spring_forward_night(self, url, recorder):
        # America/New_York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00Z); 02:30 does
        # not exist that night and fires once, at 03:00 EDT = 07:00Z. The next night it
        # is 02:30 EDT = 06:30Z.
        clock = FakeClock(datetime(2026, 3, 8, 6, 0, tzinfo=UTC))
        recorder.clock = clock
        registry = Registry()
        registry.register(recorder.quick, "CRON_TZ=America/New_York 0 30 2 * * *", "nightly")
        for night in (8, 9):  # replicas down during the day: the test need not sweep it
            clock.advance_to(datetime(2026, 3, night, 6, 0, tzinfo=UTC))
            with (
                Scheduler(url, registry=registry, clock=clock, replica_id="a"),
                Scheduler(url, registry=registry, clock=clock, replica_id="b"),
            ):
                clock.advance(2 * 3600)
        assert recorder.instants() == [
            datetime(2026, 3, 8, 7, 0, tzinfo=UTC),
            datetime(2026, 3, 9, 6, 30, tzinfo=UTC),
        ]

    def test_a_wildcard_job_runs_on_both_passes_of_the_repeated_hour(self, url, recorder):
        # America/New_York, 2026-11-01: 02:00 EDT falls back to 01:00 EST (06:00Z); the
        # hour 01:00-02:00 happens twice, and 01:30 is two real instants: 05:30Z, 06:30Z.
        clock = FakeClock(datetime(2026, 11, 1, 4, 0, tzinfo=UTC))
        recorder.clock = clock
        registry = Registry()
        registry.register(recorder.quick, "CRON_TZ=America/New_York 0 30 * * * *", "half")
        with Scheduler(url, registry=registry, clock=clock, replica_id="a"):
            clock.advance(3 * 3600)
        assert recorder.instants() == [
            datetime(2026, 11, 1, 4, 30, tzinfo=UTC),
            datetime(2026, 11, 1, 5, 30, tzinfo=UTC),
            datetime(2026, 11, 1, 6, 30, tzinfo=UTC),
        ]
