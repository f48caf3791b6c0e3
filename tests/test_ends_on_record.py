"""Nothing lost, nothing mis-recorded: the ends the policies decide and the rounds handed
back unrun, on several replicas, a fake clock and each database.

Each test names a path where an end used to go missing or be recorded wrong: a round
that outlives its timeout, a retry given up at its timer, a self-pause counting rounds
given up, a second run handed back unrun, a round handed back before its instant. (The
history rows of ends that are not on record are in ``test_lease.py``.)
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from conftest import lease_row

import cronjob
import lease
from cronjob import Registry, admin
from cronjob.testing import FakeClock, crash
from tests._helpers import JobBodies

#: A Monday, on the hour (the conftest's clock starts here).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(hours: int = 0, minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes, seconds=seconds)


class Rounds(JobBodies[tuple[str, datetime, int, str, datetime]]):
    """Notes each round: (name, instant, attempt, replica, when it started)."""

    def _noted(self, ctx: cronjob.Round) -> tuple[str, datetime, int, str, datetime]:
        return (ctx.name, ctx.instant, ctx.attempt, ctx.replica, self.clock.now())

    def note(self, ctx: cronjob.Round) -> None:
        self._record(ctx)

    def attempts(self, name: str) -> list[tuple[datetime, int]]:
        return [(instant, attempt) for n, instant, attempt, *_ in self.seen if n == name]


@pytest.fixture
def rounds(clock: FakeClock) -> Rounds:
    return Rounds(clock)


class Hooked:
    """A failure hook that notes the records it is handed (on the hooks thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[cronjob.admin.RoundRecord] = []

    def __call__(self, record: cronjob.admin.RoundRecord) -> None:
        with self._lock:
            self.records.append(record)

    def seen(self) -> list[tuple[datetime, int, str]]:
        with self._lock:
            return [(r.instant, r.attempt, str(r.outcome)) for r in self.records]


def ended(url: str, name: str) -> list[tuple[datetime, int, str]]:
    """The job's rounds in the history, oldest first: (instant, attempt, outcome); the
    notes (a pause, a resume) left out."""
    return [
        (r.instant, r.attempt, str(r.outcome))
        for r in reversed(admin.history(url, name))
        if str(r.outcome) not in ("paused", "resumed")
    ]


class TestARoundThatOutlivesItsTimeout:
    def test_it_is_on_record_timed_out_counted_and_hooked_before_each_forced_exit(
        self, url, replicas, clock, rounds
    ):
        """The job ignores its timeout's cancellation, so each replica that runs it is
        ended by the forced exit in turn: each round is still on record as timed_out,
        the hook runs once for each, and the second makes the job pause itself, so the
        replicas left live on."""
        exits: list[str] = []
        hook = Hooked()

        def stuck(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            clock.sleep(3600)  # never looks at its cancellation

        registry = Registry()
        registry.register(
            stuck, "0 * * * * *", "stuck", timeout=10, pause_after_failures=2, on_failure=hook
        )
        for replica in "abcd":
            replicas(registry, replica, on_fatal=exits.append)
        clock.advance(60 + 15)  # 09:01 times out at 09:01:10; 5 s later its process ends
        assert len(exits) == 1
        assert ended(url, "stuck") == [(at(minutes=1), 1, "timed_out")]
        row = lease_row(url, "stuck")
        assert (row.last_outcome, row.failures, row.attempt) == ("timed_out", 1, 2)
        assert "TimedOut" in (row.last_error or "")
        assert hook.seen() == [(at(minutes=1), 1, "timed_out")]
        clock.advance(60)  # 09:02, on another replica, once 09:01's lease has expired
        assert len(exits) == 2
        assert ended(url, "stuck") == [
            (at(minutes=1), 1, "timed_out"),
            (at(minutes=2), 1, "timed_out"),
        ]
        assert hook.seen() == [(at(minutes=1), 1, "timed_out"), (at(minutes=2), 1, "timed_out")]
        row = lease_row(url, "stuck")
        assert row.paused is not None and row.paused_by == "cronjob"
        clock.advance(300)  # paused: nothing more runs, and no other replica is ended
        assert len(exits) == 2
        assert [instant for instant, _ in rounds.attempts("stuck")] == [
            at(minutes=1),
            at(minutes=2),
        ]
        # No second run of a timed-out round, ever, and no two replicas ran one instant.
        assert all(attempt == 1 for _, attempt in rounds.attempts("stuck"))

    def test_a_round_that_returns_as_its_exit_is_decided_is_recorded_once(
        self, url, replicas, clock, rounds
    ):
        """The job returns 5 s after its timeout, as the forced exit comes due: one end
        on record, one hook call, whichever of the two settled it."""
        exits: list[str] = []
        hook = Hooked()

        def late(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            clock.sleep(15)

        registry = Registry()
        registry.register(late, "0 0 * * * *", "late", timeout=10, on_failure=hook)
        replicas(registry, "a", on_fatal=exits.append)
        clock.advance(3600 + 30)
        assert ended(url, "late") == [(at(hours=1), 1, "timed_out")]
        assert hook.seen() == [(at(hours=1), 1, "timed_out")]
        assert lease_row(url, "late").failures == 1


class TestARetryGivenUpAtItsTimer:
    def test_a_clock_step_during_the_backoff_ends_the_round_failed_counted_and_hooked(
        self, url, replicas, clock, rounds
    ):
        hook = Hooked()

        def failing(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            ctx.retry_in(30)

        registry = Registry()
        registry.register(
            failing,
            "0 * * * * *",
            "failing",
            retries=1,
            pause_after_failures=1,
            on_failure=hook,
        )
        replicas(registry, "a")
        clock.advance(60)  # 09:01: attempt 1 fails, its retry due at 09:01:30
        assert rounds.attempts("failing") == [(at(minutes=1), 1)]
        clock.step_wall(40)  # the wall clock jumps past 09:02 during the backoff
        clock.advance(30)  # the retry's timer: 09:02 is due, the retry is given up
        assert rounds.attempts("failing") == [(at(minutes=1), 1)]
        assert ended(url, "failing") == [
            (at(minutes=1), 1, "retrying"),
            (at(minutes=1), 2, "failed"),
        ]
        row = lease_row(url, "failing")
        assert (row.last_outcome, row.failures, row.expires_ms) == ("failed", 1, None)
        assert "retry given up" in (row.last_error or "")
        assert hook.seen() == [(at(minutes=1), 2, "failed")]
        assert row.paused is not None and row.paused_by == "cronjob"


class TestTheSelfPause:
    def test_a_round_given_up_at_a_drain_neither_counts_nor_breaks_the_run(
        self, url, replicas, clock, rounds
    ):
        def failing(ctx: cronjob.Round) -> None:
            rounds.note(ctx)
            ctx.retry_in(60)

        registry = Registry()
        registry.register(failing, "0 0 * * * *", "failing", retries=1, pause_after_failures=2)
        a = replicas(registry, "a")
        clock.advance(3600 + 30)  # 10:00 fails, its retry due at 10:01
        assert a.drain()  # given up during its backoff
        a.stop()
        assert lease_row(url, "failing").last_outcome == "given up"
        replicas(registry, "b")
        clock.advance(3600 + 30)  # 11:00 fails both attempts: one failed round, not two
        assert lease_row(url, "failing").last_outcome == "failed"
        assert lease_row(url, "failing").paused is None
        clock.advance(3600)  # 12:00 fails both attempts: two in a row
        row = lease_row(url, "failing")
        assert row.paused is not None and row.paused_by == "cronjob"
        assert "after 2 failed rounds in a row" in (row.pause_reason or "")


class TestASecondRunHandedBackUnrun:
    def _crashed_mid_round(self, url, replicas, clock, rounds) -> Registry:
        """Replica a dies during the 10:00 round of the hourly job ``job``."""
        registry = Registry()
        registry.register(rounds.lasting(600), "0 0 * * * *", "job")
        a = replicas(registry, "a")
        clock.advance(3600 + 5)
        crash(a)
        return registry

    def test_a_drain_while_its_claim_is_out_leaves_it_owed(
        self, url, replicas, clock, rounds, monkeypatch
    ):
        registry = self._crashed_mid_round(url, replicas, clock, rounds)
        claim_reruns = lease.LeaseStore.claim_reruns
        out = threading.Event()

        def slow(store: lease.LeaseStore, names: object, instant: datetime, holder: str):
            claims = claim_reruns(store, names, instant, holder)  # type: ignore[arg-type]
            if holder == "b" and not out.is_set():
                out.set()
                clock.sleep(0.5)  # the claim is still out when the drain begins
            return claims

        monkeypatch.setattr(lease.LeaseStore, "claim_reruns", slow)
        b = replicas(registry, "b")
        # a's lease expires at 10:00:15: b's sweep claims the second run after it.
        while not out.is_set() and clock.now() < at(hours=1, minutes=1):
            clock.advance(0.1)
        assert out.is_set()
        assert b.drain()
        clock.advance(1)  # the claim comes back to a draining replica: handed back unrun
        b.stop()
        row = lease_row(url, "job")
        assert (row.state, row.attempt, row.last_outcome) == (lease.LeaseState.CUT, 1, "cut short")
        replicas(registry, "c")
        clock.advance(60)
        assert rounds.attempts("job") == [(at(hours=1), 1), (at(hours=1), 2)]
        assert [
            (name, replica) for name, _, attempt, replica, _ in rounds.seen if attempt == 2
        ] == [("job", "c")]

    def test_a_claim_that_comes_back_too_late_leaves_it_owed(
        self, url, replicas, clock, rounds, monkeypatch
    ):
        registry = self._crashed_mid_round(url, replicas, clock, rounds)
        claim_reruns = lease.LeaseStore.claim_reruns
        slowed: list[datetime] = []

        def slow(store: lease.LeaseStore, names: object, instant: datetime, holder: str):
            claims = claim_reruns(store, names, instant, holder)  # type: ignore[arg-type]
            if not slowed:
                slowed.append(instant)
                clock.sleep(10.5)  # past the loss deadline: not to be run
            return claims

        monkeypatch.setattr(lease.LeaseStore, "claim_reruns", slow)
        replicas(registry, "b")
        clock.advance(60)
        assert slowed == [at(hours=1)]
        # Handed back, then claimed again by a later sweep and run: never given up.
        assert rounds.attempts("job") == [(at(hours=1), 1), (at(hours=1), 2)]
        assert [r for r in ended(url, "job") if r[2] == "given up"] == []


class TestARoundHandedBackBeforeItsInstant:
    def test_its_second_run_waits_for_its_instant(self, url, replicas, clock, rounds, monkeypatch):
        """Replica a drains between its share's claim, sent ahead, and the instant; b's
        sweep finds the rounds handed back before their instant: they start on it."""
        claim_batch = lease.LeaseStore.claim_batch

        def slow(store: lease.LeaseStore, names: object, instant: datetime, holder: str, **kw):
            claims = claim_batch(store, names, instant, holder, **kw)  # type: ignore[arg-type]
            clock.sleep(0.05)  # claims go out 62.5 ms ahead
            return claims

        monkeypatch.setattr(lease.LeaseStore, "claim_batch", slow)
        registry = Registry()
        names = [f"tick-{i}" for i in range(8)]
        for name in names:
            registry.register(rounds.note, "* * * * * *", name)
        a = replicas(registry, "a")
        clock.advance(3.99)  # the claims of 09:00:04 are won and held
        assert lease_row(url, "tick-0").instant == at(seconds=4)
        assert a.drain()
        replicas(registry, "b")  # its first sweep runs at once, at 09:00:03.99
        clock.advance(2)
        four = [seen for seen in rounds.seen if seen[1] == at(seconds=4)]
        assert sorted((name, attempt, replica) for name, _, attempt, replica, _ in four) == [
            (name, 2, "b") for name in names
        ]
        assert all(started >= at(seconds=4) for *_, started in four)
