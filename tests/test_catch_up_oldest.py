"""``catch_up="oldest"`` on a registered job: after every replica was down across several
instants, the oldest missed one runs once, then the job goes on with its next instant; the
ones passed over are on record as skipped by the policy, and ``status`` counts them so.

One, two or three replicas on one fake clock and one database (each of the three in
turn); nothing sleeps in real time.
"""

from __future__ import annotations

import functools
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

import cronjob
import lease
from cronjob import Registry, admin
from cronjob.admin._cli import main
from cronjob.contrib import Occurrence, handoff
from cronjob.testing import FakeClock

#: A Monday, on the hour (the ``clock`` fixture's start).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = "0 * * * * *"


def at(minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


@pytest.fixture
def name() -> str:
    return f"report-{uuid.uuid4().hex[:12]}"


class Rounds:
    """A job's body that notes each round: (instant, replica, why)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: list[tuple[datetime, str, str]] = []

    def __call__(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.seen.append((ctx.instant, ctx.replica, str(ctx.why)))

    def instants(self) -> list[datetime]:
        with self._lock:
            return [instant for instant, _replica, _why in self.seen]


class Publisher:
    """A publisher of the test's own: each occurrence it accepted."""

    target = "test"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[Occurrence] = []

    def describe(self) -> dict[str, object]:
        return {}

    def publish(self, occurrence: Occurrence) -> None:
        with self._lock:
            self.sent.append(occurrence)

    def instants(self) -> list[datetime]:
        with self._lock:
            return [o.instant for o in self.sent]


def ended(url: str, name: str) -> list[tuple[datetime, str, str]]:
    """The job's history, oldest first: (instant, why, outcome)."""
    return [(r.instant, str(r.why), str(r.outcome)) for r in reversed(admin.history(url, name))]


def report(url: str, clock: FakeClock, name: str) -> admin.JobStatus:
    return next(job for job in admin.status(url, now=clock.now()).jobs if job.name == name)


def down_across_four_minutes(replicas, clock: FakeClock, registry: Registry, *ids: str) -> None:
    """Replicas ``ids`` run 09:01, then all stop; 09:02 to 09:05 come while none is up;
    the same replicas start again at 09:05:30."""
    started = [replicas(registry, replica) for replica in ids]
    clock.advance(60 + 5)  # 09:01 runs
    for scheduler in started:
        scheduler.stop()
    clock.advance_to(at(5, 30))
    for replica in ids:
        replicas(registry, f"{replica}-again")


class TestARegisteredJob:
    def test_the_oldest_missed_instant_runs_once_then_the_next_to_come(
        self, db_url, replicas, clock, name
    ):
        rounds = Rounds()
        registry = Registry()
        registry.register(rounds, MINUTELY, name, catch_up="oldest")
        down_across_four_minutes(replicas, clock, registry, "a")
        clock.advance(10)
        assert rounds.instants() == [at(1), at(2)]  # 09:02, the oldest of 09:02 .. 09:05
        assert rounds.seen[1][2] == "catch-up"
        clock.advance_to(at(6, 5))  # 09:06 on time, nothing of 09:03 .. 09:05 after
        assert rounds.instants() == [at(1), at(2), at(6)]
        assert sorted(ended(db_url, name)) == [
            (at(1), "schedule", "succeeded"),
            (at(2), "catch-up", "succeeded"),
            (at(5), "skipped", "catch_up=oldest"),  # 09:03 through 09:05
            (at(6), "schedule", "succeeded"),
        ]

    def test_with_two_replicas_the_oldest_runs_once_on_one_of_them(
        self, db_url, replicas, clock, name
    ):
        rounds = Rounds()
        registry = Registry()
        registry.register(rounds, MINUTELY, name, catch_up="oldest")
        down_across_four_minutes(replicas, clock, registry, "a", "b")
        clock.advance_to(at(7, 5))
        assert rounds.instants() == [at(1), at(2), at(6), at(7)]
        assert rounds.seen[1][1] in {"a-again", "b-again"}
        assert [(i, why) for i, why, _o in ended(db_url, name)].count((at(2), "catch-up")) == 1
        # Both replicas caught up together: one note of what they passed over.
        notes = [(i, o) for i, why, o in ended(db_url, name) if why == "skipped"]
        assert notes == [(at(5), "catch_up=oldest")]

    def test_a_hand_off_publishes_the_oldest_missed_instant_once(
        self, db_url, replicas, clock, name
    ):
        publisher = Publisher()
        registry = Registry()
        registry.register(handoff(publisher), MINUTELY, name, catch_up="oldest")
        down_across_four_minutes(replicas, clock, registry, "a", "b")
        clock.advance_to(at(7, 5))
        assert publisher.instants() == [at(1), at(2), at(6), at(7)]
        assert len({o.id for o in publisher.sent}) == 4

    def test_status_counts_the_instants_passed_over_as_skipped_not_missed(
        self, db_url, replicas, clock, name, monkeypatch, capsys
    ):
        registry = Registry()
        registry.register(Rounds(), MINUTELY, name, catch_up="oldest")
        down_across_four_minutes(replicas, clock, registry, "a")
        clock.advance_to(at(8))  # 09:03 .. 09:05 are past the grace a claim has
        job = report(db_url, clock, name)
        assert (job.missed, job.skipped, job.problems) == (0, 3, ())
        monkeypatch.setattr(admin, "status", functools.partial(admin.status, now=clock.now()))
        assert main(["status", "--database-url", db_url, "--json"]) == 0
        [shown] = [j for j in json.loads(capsys.readouterr().out)["jobs"] if j["name"] == name]
        assert (shown["missed"], shown["skipped"]) == (0, 3)

    def test_status_counts_as_skipped_what_a_dead_rounds_second_run_passed_over(
        self, db_url, replicas, clock, name
    ):
        """The replica died (kill -9) holding 09:01's lease, and none was up after: the
        sweep's second run of 09:01 is the oldest instant owed; 09:02 .. 09:05 are passed
        over by the policy, not missed."""
        rounds = Rounds()
        registry = Registry()
        registry.register(rounds, MINUTELY, name, catch_up="oldest")
        a = replicas(registry, "a")
        clock.advance(59)
        engine = lease.create_engine(db_url)
        try:  # the lease row as a replica killed right after its claim of 09:01 leaves it
            store = lease.LeaseStore(engine, clock=clock.lease_clock())
            assert store.claim([name], at(1), "dead-replica")
        finally:
            engine.dispose()
        a.stop()
        clock.advance_to(at(5, 30))
        replicas(registry, "b")
        clock.advance_to(at(7, 30))  # 09:02 .. 09:05 are past the grace a claim has
        assert rounds.instants() == [at(1), at(6), at(7)]  # 09:01's second run, then on
        assert (at(1), "re-run", "succeeded") in ended(db_url, name)
        job = report(db_url, clock, name)
        assert (job.missed, job.skipped, job.problems) == (0, 4, ())
