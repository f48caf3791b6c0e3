"""Where a hand-off's owed instants meet the rest: each ``overlap`` policy, a drain, a
retry, each ``catch_up`` policy, a schedule changed while instants are owed.

A replica killed -9 right after its claim of an instant keeps the job's lease until it
runs out; the instants it kept from every claim are owed (``cronjob.engine._owed``) and
published by the next round of the job: the claim that gives the dead round up, or that
round's second run. Whatever else happens to that round, each is published once.

On every database, on a fake clock, with a publisher of the test's own.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

import cronjob
import lease
from cronjob import admin
from cronjob.contrib import Occurrence, handoff
from cronjob.testing import FakeClock
from tests.test_handoff_rounds import EVERY_5S, START, outbox, seconds

EVERY_10S = "*/10 * * * * *"


@pytest.fixture
def name() -> str:
    return f"export-{uuid.uuid4().hex[:12]}"


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


class Publisher:
    """A publisher of the test's own: each send's occurrence and fake time; refuses a
    send while ``refuses(occurrence)`` says so."""

    target = "test"

    def __init__(
        self, clock: FakeClock, refuses: Callable[[Occurrence], bool] = lambda o: False
    ) -> None:
        self.clock = clock
        self.refuses = refuses
        self.tries: list[tuple[datetime, datetime]] = []  # (instant, fake time)
        self.sent: list[Occurrence] = []
        self._lock = threading.Lock()

    def describe(self) -> dict[str, object]:
        return {}

    def publish(self, occurrence: Occurrence) -> None:
        with self._lock:
            self.tries.append((occurrence.instant, self.clock.now()))
            if self.refuses(occurrence):
                raise ConnectionError("the broker is down")
            self.sent.append(occurrence)

    def instants(self) -> list[datetime]:
        """The instants accepted, in the order they were."""
        with self._lock:
            return [o.instant for o in self.sent]


def dead_claim(url: str, clock: FakeClock, name: str, instant: datetime) -> None:
    """The lease row of ``name`` as a replica killed -9 right after its claim of
    ``instant`` (now) leaves it: running, held until it expires (15 s on), nothing
    recorded."""
    engine = lease.create_engine(url)
    try:
        store = lease.LeaseStore(engine, clock=clock.lease_clock())
        assert store.claim([name], instant, "dead-replica")
    finally:
        engine.dispose()


def ended(url: str, name: str) -> list[tuple[datetime, int, str, str]]:
    """The job's history, oldest first: (instant, attempt, why, outcome)."""
    return [
        (r.instant, r.attempt, str(r.why), str(r.outcome))
        for r in reversed(admin.history(url, name))
    ]


def sent_once(url: str, publisher: Publisher, instants: list[datetime]) -> None:
    """Each of ``instants`` was accepted exactly once, and its outbox row is sent."""
    accepted = publisher.instants()
    assert {at: accepted.count(at) for at in instants} == dict.fromkeys(instants, 1)
    kept = outbox(url)
    assert all(kept[at]["sent_ms"] is not None for at in instants)


class TestEachOverlapPolicy:
    @pytest.mark.parametrize("overlap", ["skip", "buffer_one", "cancel_other"])
    def test_the_claim_that_gives_the_dead_round_up_publishes_each_kept_instant_once(
        self, db_url, replicas, clock, name, overlap
    ):
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_5S, name, overlap=overlap)
        replicas(registry, "b")
        clock.advance(1)
        dead_claim(db_url, clock, name, at(5))  # expires 09:00:16
        clock.advance(30)  # the claim of 09:00:20 gives it up
        # 09:00:05 (recorded by nobody) to 09:00:15, refused while the lease was held,
        # published by the round of 09:00:20, oldest first; then each on time.
        assert publisher.instants() == seconds(5, 10, 15, 20, 25, 30)
        sent_once(db_url, publisher, seconds(5, 10, 15, 20, 25, 30))

    def test_buffer_one_the_second_run_publishes_the_kept_instant_and_no_round_of_it_waits(
        self, db_url, replicas, clock, name
    ):
        """At 1 and 5 s past each minute: the dead lease of 09:00:01 keeps 09:00:05 from
        its claim; the sweep runs 09:00:01 a second time, which publishes 09:00:05 too.
        That run owed 09:00:05, so it did not run over it: under buffer_one no round of
        09:00:05 waits after it (a hand-off's instants run over are those past what its
        round owed)."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), "1,5 * * * * *", name, overlap="buffer_one")
        replicas(registry, "b")
        clock.advance(0.2)
        dead_claim(db_url, clock, name, at(1))  # expires 09:00:15.2
        clock.advance_to(at(62))  # 09:01:01 on time
        assert publisher.instants() == seconds(1, 5, 61)
        sent_once(db_url, publisher, seconds(1, 5, 61))
        assert ended(db_url, name) == [
            (at(1), 2, "re-run", "succeeded"),
            (at(61), 1, "schedule", "succeeded"),
        ]

    def test_cancel_other_a_round_superseded_while_it_publishes_kept_instants_loses_none(
        self, db_url, replicas, clock, name
    ):
        """The broker refuses until 09:00:24; the round of 09:00:20, which owes 09:00:05 to
        09:00:15, retries them (``retry_within`` 30 s) until 09:00:25 supersedes it; the
        rows it recorded are the sweep's, each sent once."""
        publisher = Publisher(clock, refuses=lambda o: clock.now() < at(24))
        registry = cronjob.Registry()
        registry.register(
            handoff(publisher, retry_within=30), EVERY_5S, name, overlap="cancel_other"
        )
        replicas(registry, "b")
        clock.advance(1)
        dead_claim(db_url, clock, name, at(5))
        clock.advance(60)
        assert (at(20), 1, "schedule", "superseded") in ended(db_url, name)
        assert {instant for instant, when in publisher.tries if when < at(24)} == {at(5)}
        sent_once(db_url, publisher, seconds(*range(5, 61, 5)))


class TestADrain:
    def test_a_drain_while_the_round_publishes_kept_instants_loses_none_sends_none_twice(
        self, db_url, replicas, clock, name
    ):
        """The round of 09:00:30 owes 09:00:10 and 09:00:20 and retries the first, the
        broker refusing, when its replica stops (09:00:33). Another replica starts at
        09:00:35, the broker accepting again: every instant is sent, once."""
        publisher = Publisher(clock, refuses=lambda o: clock.now() < at(34))
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_10S, name)
        b = replicas(registry, "b")
        clock.advance(6)
        dead_claim(db_url, clock, name, at(10))  # expires 09:00:21
        clock.advance(27)
        assert {instant for instant, _when in publisher.tries} == {at(10)}  # retrying
        b.stop()
        clock.advance(2)
        replicas(registry, "c")
        clock.advance(30)
        assert (at(30), 1, "schedule", "cut short") in ended(db_url, name)
        sent_once(db_url, publisher, seconds(10, 20, 30, 40, 50, 60))


class TestARetry:
    def test_a_retried_round_publishes_the_kept_instants_once_not_once_per_attempt(
        self, db_url, replicas, clock, name
    ):
        """The broker refuses the round's own instant (09:00:30) at its first attempt
        (one try: ``retry_within=0``), once the kept 09:00:10 and 09:00:20 are sent; the
        second attempt sends 09:00:30 alone."""
        own = at(30)
        refused: list[datetime] = []

        def first_of_own(o: Occurrence) -> bool:
            """The sends of 09:00:30 at the fake moment of its first (the first attempt:
            its send, and the send tried again at once after a quick failure); the second
            attempt comes a jittered delay later, which may be under any fixed bound."""
            if o.instant != own or (refused and clock.now() != refused[0]):
                return False
            refused.append(clock.now())
            return True

        publisher = Publisher(clock, refuses=first_of_own)
        registry = cronjob.Registry()
        registry.register(
            handoff(publisher, retry_within=0), EVERY_10S, name, retries=2, retry_backoff=1
        )
        replicas(registry, "b")
        clock.advance(6)
        dead_claim(db_url, clock, name, at(10))  # expires 09:00:21
        clock.advance(38)
        assert [(i, a, why) for i, a, why, _o in ended(db_url, name)][1:3] == [
            (own, 1, "schedule"),
            (own, 2, "retry"),
        ]
        assert {i for i, when in publisher.tries if own < when < at(40)} == {own}  # attempt 2
        assert publisher.instants() == seconds(10, 20, 30, 40)
        sent_once(db_url, publisher, seconds(10, 20, 30, 40))


class TestEachCatchUpPolicy:
    @pytest.mark.parametrize(
        ("catch_up", "caught_up", "skipped"),
        [
            ("latest", [60], 2),  # 09:00:40 and 09:00:50
            ("none", [], 3),  # 09:00:40 to 09:01:00
            ("all", [40, 50, 60], 0),
            ("oldest", [], 3),  # 09:00:10's second run was the oldest
        ],
    )
    def test_every_replica_down_the_kept_instants_are_published_the_rest_as_the_policy_says(
        self, db_url, replicas, clock, name, catch_up, caught_up, skipped
    ):
        """The dead lease of 09:00:10 (claimed at 09:00:06) could have been renewed until
        15 s after 09:00:20: 09:00:10 to 09:00:30 are owed. Every replica is down until
        09:01:05: the instants after those are the catch-up policy's."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_10S, name, catch_up=catch_up)
        b = replicas(registry, "b")
        clock.advance(6)
        dead_claim(db_url, clock, name, at(10))
        b.stop()
        clock.advance_to(at(65))
        replicas(registry, "c")
        clock.advance(10)
        published = seconds(10, 20, 30, *caught_up, 70)
        assert publisher.instants() == published
        sent_once(db_url, publisher, published)
        clock.advance_to(at(120))  # 09:01:00 is past the grace a claim has
        job = next(j for j in admin.status(db_url, now=clock.now()).jobs if j.name == name)
        assert (job.missed, job.skipped) == (0, skipped)


class TestAScheduleChange:
    """A schedule made of data whose timing changes while a dead round's lease keeps its
    instants: the dead round's own instant was claimed under the old timing, and runs as
    claimed; the new timing governs from the change, and none of its instants before the
    change is the job's."""

    @pytest.fixture
    def publisher(self, clock: FakeClock) -> Publisher:
        return Publisher(clock)

    @pytest.fixture
    def registry(self, publisher: Publisher) -> cronjob.Registry:
        registry = cronjob.Registry()
        registry.register_task(handoff(publisher), "export")
        return registry

    def test_the_claim_that_gives_it_up_publishes_its_instant_and_none_from_before_the_change(
        self, db_url, replicas, clock, name, registry, publisher
    ):
        """Every 5 s, then every 3 s from 09:00:08: the dead lease of 09:00:05 keeps
        09:00:09 to 09:00:15 from the claims; the claim of 09:00:18 gives it up."""
        replicas(registry, "b")
        cronjob.schedules.add(db_url, name, task="export", spec=EVERY_5S, registry=registry)
        clock.advance(1)
        dead_claim(db_url, clock, name, at(5))  # expires 09:00:16
        clock.advance(7)
        cronjob.schedules.update(db_url, name, spec="*/3 * * * * *")
        clock.advance(12)
        assert publisher.instants() == seconds(5, 9, 12, 15, 18)

    def test_its_second_run_publishes_none_of_the_new_timing_from_before_the_change(
        self, db_url, replicas, clock, name, registry, publisher
    ):
        """At 1 and 5 s past each minute, then at 2 and 7 from 09:00:03: the dead lease of
        09:00:01 keeps 09:00:07 from its claim; the sweep runs 09:00:01 a second time."""
        replicas(registry, "b")
        cronjob.schedules.add(db_url, name, task="export", spec="1,5 * * * * *", registry=registry)
        clock.advance(0.2)
        dead_claim(db_url, clock, name, at(1))  # expires 09:00:15.2
        clock.advance(2.8)
        cronjob.schedules.update(db_url, name, spec="2,7 * * * * *")
        clock.advance(45)
        assert (at(1), 2, "re-run", "succeeded") in ended(db_url, name)
        assert publisher.instants() == seconds(1, 7)

    def test_a_change_while_the_round_that_owes_them_runs_leaves_it_publishing_them(
        self, db_url, replicas, clock, name, registry, publisher
    ):
        """The round of 09:00:20 owes 09:00:05 to 09:00:15 and retries them, the broker
        refusing, when the timing changes to every 3 s (09:00:21): what it owes was
        handed to it at its claim; each is sent once, then the new timing's instants."""
        publisher.refuses = lambda o: clock.now() < at(23)
        replicas(registry, "b")
        cronjob.schedules.add(db_url, name, task="export", spec=EVERY_5S, registry=registry)
        clock.advance(1)
        dead_claim(db_url, clock, name, at(5))
        clock.advance(20)
        assert {instant for instant, _when in publisher.tries} == {at(5)}  # retrying
        cronjob.schedules.update(db_url, name, spec="*/3 * * * * *")
        clock.advance(30)
        sent_once(db_url, publisher, seconds(5, 10, 15, 20, 24, 27, 30))
        assert at(25) not in publisher.instants()
