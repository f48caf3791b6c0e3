"""A hand-off's round is its publication: bounded by the next instant, failed when the
broker does not accept, and owing the instants a round that died kept from every claim.
On every database, with a publisher of the test's own (the sweep's and the brokers' own
tests are elsewhere: tests/test_outbox*.py, tests/faults/)."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.contrib import Occurrence, handoff
from cronjob.engine._owed import owed_instants
from cronjob.testing import FakeClock
from tests.conftest import lease_row

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
EVERY_2S = "*/2 * * * * *"
EVERY_5S = "*/5 * * * * *"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def name() -> str:
    return f"export-{uuid.uuid4().hex[:12]}"


class Publisher:
    """A publisher of the test's own: each send's occurrence and fake time; refuses
    while ``refusing``."""

    target = "test"

    def __init__(self, clock: FakeClock, *, refusing: bool = False) -> None:
        self.clock = clock
        self.refusing = refusing
        self.tries: list[tuple[str, datetime]] = []
        self.sent: list[Occurrence] = []
        self._lock = threading.Lock()

    def describe(self) -> dict[str, object]:
        return {}

    def publish(self, occurrence: Occurrence) -> None:
        with self._lock:
            self.tries.append((occurrence.id, self.clock.now()))
            if self.refusing:
                raise ConnectionError("the broker is down")
            self.sent.append(occurrence)


def outbox(url: str) -> dict[datetime, sa.RowMapping]:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            table = lease.metadata.tables["cronjob_outbox"]
            rows = conn.execute(sa.select(table)).mappings()
            return {datetime.fromtimestamp(row["instant_ms"] / 1000, UTC): row for row in rows}
    finally:
        engine.dispose()


def seconds(*offsets: int) -> list[datetime]:
    return [START + timedelta(seconds=s) for s in offsets]


def ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def sent_at(publisher: Publisher) -> dict[datetime, datetime]:
    """When each instant was first sent (fake time), in the order of the sends."""
    by_id = {o.id: o.instant for o in publisher.sent}
    found: dict[datetime, datetime] = {}
    for id, at in publisher.tries:
        if id in by_id:
            found.setdefault(by_id[id], at)
    return found


def record(
    url: str, name: str, instant: datetime, *, at: datetime, hold_ms: int, sent: bool = False
) -> None:
    """Put ``name``'s occurrence of ``instant`` on record as a round that recorded it at
    ``at`` and held it ``hold_ms`` would (and marked it sent, with ``sent``)."""
    engine = lease.create_engine(url)
    try:
        with engine.begin() as conn:
            row, new = lease.record_publication(
                conn,
                id=cronjob.occurrence_id(name, instant),
                name=name,
                instant=instant,
                target="test",
                payload={"headers": {}},
                now_ms=ms(at),
                hold_ms=hold_ms,
            )
            assert new
            if sent:
                assert lease.mark_published(conn, row.id, now_ms=ms(at))
    finally:
        engine.dispose()


class TestTheRoundIsBoundByTheNextInstant:
    def test_a_refused_send_is_retried_on_the_peer_s_pauses_and_ends_before_the_next_instant(
        self, db_url, replicas, clock, name
    ):
        publisher = Publisher(clock, refusing=True)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_5S, name)
        replicas(registry, "a")
        clock.advance(9)  # 09:00:05's round, and 09:00:10 not yet
        oid = cronjob.occurrence_id(name, START + timedelta(seconds=5))
        times = [at for id, at in publisher.tries if id == oid]
        # 100 ms, 500 ms, 2 s: the 5 s pause would end past 09:00:10 less its margin;
        # each attempt publishes twice, the second at once (a stale connection).
        offsets = [round((at - times[0]).total_seconds(), 1) for at in times]
        assert offsets == [0, 0, 0.1, 0.1, 0.6, 0.6, 2.6, 2.6]
        clock.advance(2)  # 09:00:10: its own round, not skipped as an overrun
        assert cronjob.occurrence_id(name, START + timedelta(seconds=10)) in {
            id for id, _at in publisher.tries
        }

    def test_a_publication_not_accepted_fails_the_round_and_counts(
        self, db_url, replicas, clock, name
    ):
        publisher = Publisher(clock, refusing=True)
        failures: list[str] = []
        both = threading.Event()

        def failed(record: cronjob.admin.RoundRecord) -> None:
            failures.append(str(record.error))
            if len(failures) == 2:
                both.set()

        registry = cronjob.Registry()
        registry.register(
            handoff(publisher), EVERY_5S, name, on_failure=failed, pause_after_failures=2
        )
        replicas(registry, "a")
        clock.advance(14)  # 09:00:05 and 09:00:10 refused
        both.wait(10)  # the hooks thread calls it after the round's end, in real time
        assert len(failures) == 2 and all(e.startswith("NotPublished") for e in failures)
        row = lease_row(db_url, name)
        assert row.last_outcome == "failed" and "NotPublished" in str(row.last_error)
        assert row.paused is not None  # the self-pause after two rounds in a row failed
        kept = outbox(db_url)
        assert [kept[at]["sent_ms"] for at in seconds(5, 10)] == [None, None]

    def test_the_sweep_sends_the_rows_a_failed_round_left_once_the_broker_accepts(
        self, db_url, replicas, clock, name
    ):
        publisher = Publisher(clock, refusing=True)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), "0 0 0 * * *", name)  # daily: five attempts
        midnight = datetime(2026, 3, 3, tzinfo=UTC)
        # Started just before midnight: fifteen idle hours of fake time would wake the
        # replica's sweeps thousands of times for nothing this test asserts.
        clock.advance_to(midnight - timedelta(seconds=10))
        replicas(registry, "a")
        clock.advance(20)  # midnight's round, refused
        oid = cronjob.occurrence_id(name, midnight)
        # The round's five attempts (a stale-connection retry each) ended the round; the
        # sweep may have tried once more since the round handed the row over.
        assert "after 5 attempt(s)" in str(lease_row(db_url, name).last_error)
        assert len([id for id, _at in publisher.tries if id == oid]) >= 5 * 2
        publisher.refusing = False
        clock.advance(30)
        assert [o.id for o in publisher.sent] == [oid]
        assert outbox(db_url)[midnight]["sent_ms"] is not None

    def test_a_given_retry_within_is_used_as_given(self, db_url, replicas, clock, name):
        publisher = Publisher(clock, refusing=True)
        registry = cronjob.Registry()
        registry.register(handoff(publisher, retry_within=0), EVERY_5S, name)
        replicas(registry, "a")
        clock.advance(6)
        oid = cronjob.occurrence_id(name, START + timedelta(seconds=5))
        assert len([id for id, _at in publisher.tries if id == oid]) == 2  # one attempt


class Stale(Publisher):
    """Fails the first publish after the broker came back (its connection went stale)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.stale = True

    def publish(self, occurrence: Occurrence) -> None:
        if self.stale:
            self.stale = False
            self.tries.append((occurrence.id, self.clock.now()))
            raise ConnectionError("the connection went stale")
        super().publish(occurrence)


def test_a_stale_connection_is_tried_again_at_once_not_counted_refused(
    db_url, replicas, clock, name
):
    publisher = Stale(clock)
    registry = cronjob.Registry()
    registry.register(handoff(publisher), EVERY_5S, name)
    replicas(registry, "a")
    clock.advance(6)
    instant = START + timedelta(seconds=5)
    assert [o.instant for o in publisher.sent] == [instant]
    assert [at for _id, at in publisher.tries] == [instant, instant]  # no pause between
    row = outbox(db_url)[instant]
    assert row["tries"] == 0 and row["error"] is None
    assert lease_row(db_url, name).last_outcome == "succeeded"


def dead_claim(
    url: str, clock: FakeClock, name: str, instant: datetime, *, settle: float = 1
) -> None:
    """The lease row of ``name`` as a replica killed -9 right after its claim of
    ``instant`` leaves it: running, held until it expires, nothing recorded."""
    clock.advance(settle)  # the replica's rows are on record (not yet its claim's lead)
    engine = lease.create_engine(url)
    try:
        store = lease.LeaseStore(engine, clock=clock.lease_clock())
        assert store.claim([name], instant, "dead-replica")
    finally:
        engine.dispose()


class TestADeadRoundsInstantsAreOwed:
    def test_the_claim_that_gives_it_up_publishes_every_instant_it_kept(
        self, db_url, replicas, clock, name
    ):
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_2S, name)
        replicas(registry, "b")
        dead_claim(db_url, clock, name, START + timedelta(seconds=2))  # expires 09:00:16
        clock.advance(18)
        published = [o.instant for o in publisher.sent]
        # 09:00:02 (recorded by nobody) to 09:00:14, refused while the lease was held,
        # each published once, oldest first; then the instants after, on time.
        assert published == seconds(*range(2, 20, 2))
        assert len({o.id for o in publisher.sent}) == len(published)
        kept = outbox(db_url)
        assert all(kept[at]["sent_ms"] is not None for at in published)

    def test_an_instant_the_dead_round_sent_is_not_sent_again(self, db_url, replicas, clock, name):
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher, hold=30), EVERY_2S, name)
        replicas(registry, "b")
        instant = START + timedelta(seconds=2)
        dead_claim(db_url, clock, name, instant)
        record(db_url, name, instant, at=clock.now(), hold_ms=30_000, sent=True)
        clock.advance(17)  # the claim of 09:00:16 gives the dead round up
        assert [o.instant for o in publisher.sent][:7] == seconds(4, 6, 8, 10, 12, 14, 16)
        clock.advance(60)  # past its hold too
        assert instant not in [o.instant for o in publisher.sent]

    def test_the_rows_it_recorded_and_held_unsent_are_sent_by_the_claim_that_gives_it_up(
        self, db_url, replicas, clock, name
    ):
        """With a hold longer than the dead lease: the claim of 09:00:16 sends the rows
        the dead round recorded untouched (an earlier dead round's instant it owed, and
        its own) at once, each once, not when their hold ends at 09:00:31. A row whose
        next try was moved since its record (a retry's claim) is left to its hold."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher, hold=30), EVERY_2S, name)
        replicas(registry, "b")
        dead_claim(db_url, clock, name, START + timedelta(seconds=2))  # at 09:00:01
        for at in seconds(0, 2, -2):  # recorded by the dead round, held 30 s, unsent
            record(db_url, name, at, at=clock.now(), hold_ms=30_000)
        retried = cronjob.occurrence_id(name, START - timedelta(seconds=2))
        engine = lease.create_engine(db_url)
        try:
            with engine.begin() as conn:  # a retry of 08:59:58 took it until 09:00:36
                assert lease.claim_publication(
                    conn,
                    retried,
                    seen_next_try_ms=ms(START) + 31_000,
                    next_try_ms=ms(START) + 36_000,
                )
        finally:
            engine.dispose()
        clock.advance(17)
        sent = sent_at(publisher)
        assert {at: sent[at] for at in seconds(0, 2)} == dict.fromkeys(
            seconds(0, 2), seconds(16)[0]
        )
        assert list(sent)[:9] == seconds(0, 2, 4, 6, 8, 10, 12, 14, 16)  # oldest first
        assert START - timedelta(seconds=2) not in sent
        clock.advance(30)
        assert sent_at(publisher)[START - timedelta(seconds=2)] >= START + timedelta(seconds=36)
        assert len(publisher.sent) == len({o.id for o in publisher.sent})  # each once

    def test_its_second_run_takes_over_the_rows_it_held(self, db_url, replicas, clock, name):
        """At 1 and 5 s past each minute, a hold of 60 s: the dead round of 09:00:01
        recorded its row and died; its second run, at the sweep after its lease ran out
        (09:00:30), sends that row at once, not at 09:01:01.2, with 09:00:05."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher, hold=60), "1,5 * * * * *", name)
        replicas(registry, "b")
        instant = START + timedelta(seconds=1)
        dead_claim(db_url, clock, name, instant, settle=0.2)
        record(db_url, name, instant, at=clock.now(), hold_ms=60_000)
        clock.advance(45)
        assert sent_at(publisher) == dict.fromkeys(seconds(1, 5), START + timedelta(seconds=30))

    def test_a_kill_of_the_round_that_publishes_them_delays_them_to_its_hold_s_end(
        self, db_url, replicas, clock, name
    ):
        """The default hold (10 s) ends before the second dead lease (15 s): the rows the
        second dead round recorded are sent by the sweep as their hold ends, 10 s after it
        recorded them, before any claim could give it up; the instants its own lease kept
        come with the claim that does (09:00:32). 09:00:02, kept by the first dead round,
        is thus sent 23.6 s after its instant."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_2S, name)
        replicas(registry, "b")
        dead_claim(db_url, clock, name, START + timedelta(seconds=2), settle=0.5)  # to 15.5
        clock.advance(15.1)
        second = START + timedelta(seconds=16)
        engine = lease.create_engine(db_url)
        try:  # the claim that gives the first up, on a replica killed as it publishes
            store = lease.LeaseStore(engine, clock=clock.lease_clock())
            assert store.claim([name], second, "second-dead-replica")
        finally:
            engine.dispose()
        for at in seconds(*range(2, 17, 2)):
            record(db_url, name, at, at=clock.now(), hold_ms=10_000)
        clock.advance(20)
        sent = sent_at(publisher)
        held_until = clock.now() - timedelta(seconds=20) + timedelta(seconds=10)
        assert all(
            held_until <= sent[at] <= held_until + timedelta(seconds=1)
            for at in seconds(*range(2, 17, 2))
        )
        assert {sent[at] for at in seconds(*range(18, 31, 2))} == {START + timedelta(seconds=32)}

    def test_every_instant_is_published_when_the_sweep_runs_the_dead_round_again_first(
        self, db_url, replicas, clock, name
    ):
        """Every 6 s: the dead lease of 09:00:06 runs out at 09:00:20, before the claim of
        09:00:24; whichever comes first (the sweep's second run of 09:00:06, or that
        claim), 09:00:12 and 09:00:18 are published too."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), "*/6 * * * * *", name)
        replicas(registry, "b")
        clock.advance(4)
        dead_claim(db_url, clock, name, START + timedelta(seconds=6))  # expires 09:00:20
        clock.advance(26)
        assert [o.instant for o in publisher.sent] == seconds(6, 12, 18, 24, 30)

    def test_its_second_run_publishes_the_instants_after_it_the_lease_kept(
        self, db_url, replicas, clock, name, caplog
    ):
        """At 1 and 5 s past each minute: the dead lease of 09:00:01 keeps 09:00:05 from
        its claim and runs out long before 09:01:01; the sweep runs 09:00:01 a second
        time, and that round publishes 09:00:05 too."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), "1,5 * * * * *", name)
        replicas(registry, "b")
        caplog.set_level(logging.INFO, logger="cronjob")
        dead_claim(db_url, clock, name, START + timedelta(seconds=1), settle=0.2)
        clock.advance(45)  # the dead lease ran out at 09:00:15.2
        assert [o.instant for o in publisher.sent] == seconds(1, 5)
        assert any("a second time" in r.getMessage() for r in caplog.records)
        clock.advance_to(START + timedelta(seconds=62))  # 09:01:01 on time
        assert [o.instant for o in publisher.sent] == seconds(1, 5, 61)

    def test_an_instant_its_second_run_ran_over_is_published_as_it_ends(
        self, db_url, replicas, clock, name
    ):
        """Every 4 s: the dead lease of 09:00:16 runs out at 09:00:29.6, and the sweep's
        second run (09:00:30) owes 20, 24 and 28; the broker refuses, and it retries until
        09:00:32.6, its lease refusing the claim of 09:00:32. That instant is claimed as
        the second run ends, not skipped as an overrun: every instant is recorded, and
        sent once the broker accepts. (Under load, with the derived knobs, the same
        comes of a second run whose record and first send outlast the time to the next
        instant.)"""
        publisher = Publisher(clock, refusing=True)
        registry = cronjob.Registry()
        registry.register(handoff(publisher, retry_within=3), "*/4 * * * * *", name)
        replicas(registry, "b")
        clock.advance(14.1)
        dead_claim(db_url, clock, name, START + timedelta(seconds=16), settle=0.5)
        clock.advance(20)
        kept = outbox(db_url)
        assert set(seconds(16, 20, 24, 28, 32)) <= set(kept)
        assert kept[START + timedelta(seconds=32)]["created_ms"] < ms(START) + 33_000
        publisher.refusing = False
        clock.advance(30)
        kept = outbox(db_url)
        assert all(kept[at]["sent_ms"] is not None for at in seconds(*range(16, 64, 4)))

    def test_an_ordinary_job_still_skips_the_instants_a_dead_round_held(
        self, db_url, replicas, clock, name
    ):
        ran: list[datetime] = []
        registry = cronjob.Registry()
        registry.register(lambda ctx: ran.append(ctx.instant), EVERY_2S, name)
        replicas(registry, "b")
        dead_claim(db_url, clock, name, START + timedelta(seconds=2))
        clock.advance(19)
        assert ran and ran[0] >= START + timedelta(seconds=15)  # the seed's rule


def test_an_instant_a_round_ran_over_is_published_by_the_round_claimed_as_it_ends(
    db_url, replicas, clock, name
):
    """Every 2 s, retried for up to 3 s (registration warns): each round refused by the
    broker runs over the next instant; that instant is claimed as it ends, not skipped,
    so every instant is recorded and, once the broker accepts, sent once."""
    publisher = Publisher(clock, refusing=True)
    registry = cronjob.Registry()
    registry.register(handoff(publisher, retry_within=3), EVERY_2S, name)
    replicas(registry, "b")
    clock.advance(15)
    assert set(seconds(*range(2, 13, 2))) <= set(outbox(db_url))
    publisher.refusing = False
    clock.advance(40)
    kept = outbox(db_url)
    assert all(kept[at]["sent_ms"] is not None for at in seconds(*range(2, 13, 2)))
    assert len(publisher.sent) == len({o.id for o in publisher.sent})


def test_owed_instants_stop_where_the_dead_lease_could_have_run_out():
    schedule = cronjob.parse(EVERY_2S)
    held = START
    owed = owed_instants(schedule, held, START + timedelta(hours=1), ttl=15)
    # The instant after it (09:00:02) plus the lease's 15 s and 2 s of slack.
    assert owed == tuple(seconds(*range(0, 19, 2)))
    # A claim sooner bounds them; an instant that is not the schedule's is not owed.
    assert owed_instants(schedule, held, START + timedelta(seconds=6), ttl=15) == tuple(
        seconds(0, 2, 4)
    )
    odd = START + timedelta(seconds=1)
    assert owed_instants(schedule, odd, START + timedelta(seconds=6), ttl=15) == tuple(
        seconds(2, 4)
    )
