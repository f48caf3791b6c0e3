"""Every attempt given up is on record: a retry a drain or a lost lease gives up in its
backoff is in the history as ``'given up'``, and ``cronjob history --failed`` shows it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import cronjob
import lease
from cronjob import Registry, admin
from cronjob.admin._cli import main
from cronjob.testing import FakeClock, crash
from tests._helpers import JobBodies

#: A Monday, on the hour (the conftest's clock starts here).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(hours: int = 0, minutes: int = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes)


def _failing(ctx: cronjob.Round) -> None:
    ctx.retry_in(60)


class TestARetryGivenUpInItsBackoff:
    def test_a_drain_puts_the_attempt_that_never_started_on_record(
        self, url, replicas, clock: FakeClock
    ):
        registry = Registry()
        registry.register(_failing, "0 0 * * * *", "failing", retries=1)
        a = replicas(registry, "a")
        clock.advance(3600 + 30)  # 10:00 fails, its retry due at 10:01
        assert a.drain()  # given up during its backoff
        a.stop()
        failed = admin.history(url, "failing", failed=True)
        assert [(r.instant, r.attempt, str(r.outcome), r.why) for r in failed] == [
            (at(hours=1), 2, "given up", "retry")
        ]
        assert failed[0].error is not None
        assert failed[0].error.startswith("retry given up: the scheduler is draining; attempt 1:")

    def test_history_failed_on_the_command_line_shows_it(
        self, url, replicas, clock: FakeClock, capsys
    ):
        registry = Registry()
        registry.register(_failing, "0 0 * * * *", "failing", retries=1)
        a = replicas(registry, "a")
        clock.advance(3600 + 30)
        assert a.drain()
        a.stop()
        assert main(["history", "failing", "--failed", "--database-url", url]) == 0
        out = capsys.readouterr().out
        assert "no rounds on record" not in out
        assert "given up" in out

    def test_a_lost_lease_puts_the_attempt_that_never_started_on_record(
        self, url, replicas, clock: FakeClock, monkeypatch
    ):
        registry = Registry()
        registry.register(_failing, "0 0 * * * *", "failing", retries=1)
        replicas(registry, "a")
        clock.advance(3600 + 1)  # 10:00 fails, its retry due at 10:01
        # The renewals fail from now on: the lease is lost during the backoff.
        monkeypatch.setattr(lease.LeaseStore, "renew", _taken)
        clock.advance(60)
        failed = admin.history(url, "failing", failed=True)
        assert [(r.instant, r.attempt, str(r.outcome)) for r in failed] == [
            (at(hours=1), 2, "given up")
        ]
        assert (failed[0].error or "").startswith("retry given up: its lease was lost")


def _taken(store: lease.LeaseStore, pairs: object, holder: str) -> set[str]:
    """A renewal that finds every lease taken by another claim."""
    return set()


class TestAnUnfinishedRoundALaterClaimGivesUp:
    def test_it_is_on_record_given_up_by_the_replica_that_claimed(
        self, url, replicas, clock: FakeClock, monkeypatch
    ):
        """Replica a dies during its 09:01 round; no second run is won (the sweep's claim
        finds nothing), so b's claim of 09:02 gives the round up."""
        bodies = _Names(clock)
        registry = Registry()
        registry.register(bodies.lasting(600), "0 * * * * *", "job")
        a = replicas(registry, "a")
        clock.advance(60 + 5)
        crash(a)

        def nothing(store: lease.LeaseStore, names: object, instant: datetime, holder: str):
            return lease.ClaimBatch(instant=instant, token=0, names=(), superseded={}, attempt=2)

        monkeypatch.setattr(lease.LeaseStore, "claim_reruns", nothing)
        replicas(registry, "b")
        clock.advance(60)  # 09:02: b's claim replaces the unfinished 09:01 round
        failed = admin.history(url, "job", failed=True)
        assert [(r.instant, r.attempt, str(r.outcome), r.replica, r.why) for r in failed] == [
            (at(minutes=1), 1, "given up", "b", "superseded")
        ]
        assert failed[0].error == (
            f"given up unfinished: instant {at(minutes=2).isoformat()} started first"
        )


class _Names(JobBodies[str]):
    """Notes each round's job name."""

    def _noted(self, ctx: cronjob.Round) -> str:
        return ctx.name
