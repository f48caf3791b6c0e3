"""The hand-off rounds of a scheduler due at one instant record their occurrences in one
group: one transaction, one lease check of all their rounds, one multi-row insert
(`cronjob.contrib._records`). Each round keeps what its own record promised.

On every database, on a fake clock, with a publisher of the test's own. How rounds fall
into groups depends on the threads' timing: nothing here asserts a group's size.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.contrib import Handoff, handoff
from tests.test_handoff_rounds import (
    EVERY_2S,
    EVERY_5S,
    START,
    Publisher,
    ms,
    record,
    seconds,
    sent_at,
)

JOBS = 8


@pytest.fixture
def names() -> list[str]:
    prefix = uuid.uuid4().hex[:8]
    return [f"export-{prefix}-{n}" for n in range(JOBS)]


def rows(url: str) -> list[sa.RowMapping]:
    """Every row of the outbox."""
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.select(lease.metadata.tables["cronjob_outbox"])).mappings())
    finally:
        engine.dispose()


def on_record(url: str) -> dict[tuple[str, datetime], sa.RowMapping]:
    """The outbox's rows by (name, instant)."""
    return {
        (row["name"], datetime.fromtimestamp(row["instant_ms"] / 1000, START.tzinfo)): row
        for row in rows(url)
    }


def execute(url: str, statement: str) -> None:
    engine = lease.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


class Together(Handoff):
    """A hand-off whose rounds of one instant go to their record together (each waits,
    in real time and for a bounded while, until all ``parties`` have come): they then
    wait for each other's records and write theirs in a group. The round of ``victim``
    first has its lease taken, as another replica's claim would (its token moved on);
    each round that raises LeaseLost is noted in ``lost``."""

    def __init__(self, publisher: Publisher, barrier: threading.Barrier, victim: str) -> None:
        super().__init__(publisher)
        self.barrier = barrier
        self.victim = victim
        self.lost: list[tuple[str, datetime]] = []
        self.url = ""

    def __call__(self, ctx: cronjob.Round) -> None:
        if ctx.name == self.victim:
            table = lease.metadata.tables["cronjob_lease"]
            engine = lease.create_engine(self.url)
            try:
                with engine.begin() as conn:
                    conn.execute(
                        table.update()
                        .where(table.c.name == ctx.name)
                        .values(token=table.c.token + 1)
                    )
            finally:
                engine.dispose()
        # A slow machine: grouped as they come.
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait(10)
        try:
            super().__call__(ctx)
        except cronjob.LeaseLost:
            self.lost.append((ctx.name, ctx.instant))
            raise


def test_many_hand_offs_due_at_one_instant_on_two_replicas_are_each_recorded_and_sent_once(
    db_url, replicas, clock, names
):
    publisher = Publisher(clock)
    registry = cronjob.Registry()
    for name in names:
        registry.register(handoff(publisher), EVERY_5S, name)
    replicas(registry, "a")
    replicas(registry, "b")
    clock.advance(11)  # 09:00:05 and 09:00:10
    instants = seconds(5, 10)
    wanted = {(name, at) for name in names for at in instants}
    sends = Counter((o.name, o.instant) for o in publisher.sent)
    assert set(sends) == wanted
    assert set(sends.values()) == {1}
    kept = on_record(db_url)
    assert set(kept) == wanted
    assert all(row["sent_ms"] is not None and row["tries"] == 0 for row in kept.values())
    for name in names:
        assert {kept[name, at]["id"] for at in instants} == {
            cronjob.occurrence_id(name, at) for at in instants
        }


def test_a_round_whose_lease_was_taken_records_nothing_and_the_others_of_its_group_do(
    db_url, replicas, clock, names
):
    publisher = Publisher(clock)
    victim, others = names[0], names[1:]
    job = Together(publisher, threading.Barrier(len(names)), victim)
    job.url = db_url
    registry = cronjob.Registry()
    for name in names:
        registry.register(job, EVERY_5S, name)
    replicas(registry, "a")
    clock.advance(6)  # 09:00:05
    five = seconds(5)[0]
    assert job.lost == [(victim, five)]
    kept = on_record(db_url)
    assert (victim, five) not in kept
    assert {(name, five) for name in others} <= set(kept)
    sends = Counter((o.name, o.instant) for o in publisher.sent)
    assert (victim, five) not in sends
    assert all(sends[name, five] == 1 for name in others)
    clock.advance(30)  # the sweeps: nothing of the victim's 09:00:05 was on record to send
    assert (victim, five) not in Counter((o.name, o.instant) for o in publisher.sent)


def test_a_round_finds_what_an_earlier_run_of_its_instant_recorded(db_url, replicas, clock, names):
    """Of the rounds of one instant: those whose occurrence is on record and sent send
    nothing; those on record unsent and due send it again under its id, once; the others
    record and send theirs."""
    publisher = Publisher(clock)
    registry = cronjob.Registry()
    for name in names:
        registry.register(handoff(publisher), EVERY_5S, name)
    replicas(registry, "a")
    five = seconds(5)[0]
    sent, unsent, new = names[:3], names[3:6], names[6:]
    for name in sent + unsent:  # recorded at 08:59:50, held 5 s: due again since 08:59:55
        record(
            db_url,
            name,
            five,
            at=START - timedelta(seconds=10),
            hold_ms=5_000,
            sent=name in sent,
        )
    clock.advance(6)  # 09:00:05
    sends = Counter((o.name, o.instant) for o in publisher.sent)
    assert set(sends) == {(name, five) for name in unsent + new}
    assert set(sends.values()) == {1}
    assert all(o.id == cronjob.occurrence_id(o.name, five) for o in publisher.sent)
    kept = on_record(db_url)
    assert all(kept[name, five]["sent_ms"] is not None for name in names)
    assert all(kept[name, five]["created_ms"] == ms(START) - 10_000 for name in sent + unsent)


def test_the_rounds_of_a_group_each_record_and_publish_the_instants_they_owe(
    db_url, replicas, clock, names
):
    """A replica killed -9 right after its claims of 09:00:02 kept every job's lease
    until 09:00:16, half of them with a row it recorded and held 30 s: the rounds of the
    claim that gives the dead rounds up owe 09:00:02 onwards, record them each under its
    own id, and send at once the held rows too, each once, oldest first."""
    publisher = Publisher(clock)
    registry = cronjob.Registry()
    for name in names:
        registry.register(handoff(publisher, hold=30), EVERY_2S, name)
    replicas(registry, "b")
    clock.advance(1)  # the replica's rows are on record
    engine = lease.create_engine(db_url)
    try:
        store = lease.LeaseStore(engine, clock=clock.lease_clock())
        assert {c.name for c in store.claim(names, seconds(2)[0], "dead-replica")} == set(names)
    finally:
        engine.dispose()
    held = names[: JOBS // 2]
    for name in held:  # the dead round's own instant, recorded and held 30 s
        record(db_url, name, seconds(2)[0], at=clock.now(), hold_ms=30_000)
    clock.advance(18)  # 09:00:19
    owed = seconds(*range(2, 20, 2))
    first = sent_at(publisher)
    for name in names:
        mine = [o.instant for o in publisher.sent if o.name == name]
        assert mine == owed, name  # each once, oldest first
    # The held rows: with the claim that gives the dead rounds up, not at 09:00:32.
    assert first[seconds(2)[0]] <= seconds(18)[0]
    kept = on_record(db_url)
    assert all(
        kept[name, at]["id"] == cronjob.occurrence_id(name, at) and kept[name, at]["sent_ms"]
        for name in names
        for at in owed
    )


def test_a_database_error_fails_every_round_of_its_group_and_nothing_unrecorded_is_sent(
    db_url, replicas, clock, names
):
    publisher = Publisher(clock)
    failed: list[str] = []
    every = threading.Event()

    def note(record: cronjob.admin.RoundRecord) -> None:
        failed.append(str(record.error))
        if len(failed) == len(names):
            every.set()

    registry = cronjob.Registry()
    for name in names:
        registry.register(handoff(publisher), EVERY_5S, name, on_failure=note)
    replicas(registry, "a")
    clock.advance(4)  # 09:00:04: the outbox goes away until the rounds of 09:00:05 ended
    execute(db_url, "ALTER TABLE cronjob_outbox RENAME TO cronjob_outbox_away")
    try:
        clock.advance(2)
        assert every.wait(10)  # the hooks thread calls it after each round's end
    finally:
        execute(db_url, "ALTER TABLE cronjob_outbox_away RENAME TO cronjob_outbox")
    assert len(failed) == len(names)
    assert all("record a publication" in error for error in failed), failed
    clock.advance(30)  # the sweeps, and the rounds of 09:00:10 to 09:00:35
    five = seconds(5)[0]
    later = seconds(*range(10, 40, 5))
    sends = Counter((o.name, o.instant) for o in publisher.sent)
    assert set(sends) == {(name, at) for name in names for at in later}
    assert set(sends.values()) == {1}
    assert not any(at == five for _name, at in on_record(db_url))


class TestHoldsMany:
    def test_it_tells_which_leases_still_hold_in_one_statement(self, migrated_engine, clock):
        store = lease.LeaseStore(migrated_engine, clock=clock.lease_clock())
        store.ensure(["a", "b", "c"])
        tokens = {c.name: c.token for c in store.claim(["a", "b", "c"], START, "r1")}
        asked = [("a", tokens["a"]), ("b", tokens["b"] + 1), ("c", tokens["c"])]
        with migrated_engine.begin() as conn:
            assert store.holds_many(conn, []) == set()
            with store.locking_held():
                held = store.holds_many(conn, asked, lock=True)
        assert held == {("a", tokens["a"]), ("c", tokens["c"])}
        clock.advance(store.ttl)  # now == expires_ms: lost
        with migrated_engine.begin() as conn:
            assert store.holds_many(conn, asked) == set()


class TestRecordPublications:
    def test_it_writes_the_new_finds_those_on_record_and_writes_a_repeated_id_once(
        self, migrated_engine
    ):
        given = [
            lease.Publication(
                id=f"id-{n}",
                name="job",
                instant=START + timedelta(seconds=n),
                target="test",
                payload={"n": n},
                now_ms=1_000,
                hold_ms=500,
            )
            for n in range(3)
        ]
        with migrated_engine.begin() as conn:
            ((first, new),) = lease.record_publications(conn, given[:1])
        assert new and first.next_try_ms == 1_500 and first.payload == {"n": 0}
        with migrated_engine.begin() as conn:
            found = lease.record_publications(conn, [given[1], given[0], given[2], given[1]])
        assert [(row.id, new) for row, new in found] == [
            ("id-1", True),
            ("id-0", False),
            ("id-2", True),
            ("id-1", False),
        ]
        assert found[1][0] == first
        assert found[0][0] == found[3][0]
        assert found[2][0].instant == START + timedelta(seconds=2)
