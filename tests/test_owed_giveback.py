"""A hand-off's claim that owes instants and is given back unrun loses none of them.

A replica killed -9 right after its claim of an instant keeps the job's lease until it
runs out; the claim that then gives that round up owes the instants it kept from every
claim (``cronjob.engine._owed``). When that claim is given back unrun (its replica began
a drain after claiming ahead of the instant; see ``cronjob.engine._giveback``), the
round is left cut short and another replica's sweep runs it as a second run: that run
still records and publishes each owed instant, once, and ``status`` counts none as
missed.

On every database, on a fake clock, with a publisher of the test's own.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import admin
from cronjob.contrib import handoff
from cronjob.testing import FakeClock
from tests.conftest import lease_row
from tests.test_handoff_rounds import START
from tests.test_owed_meets import Publisher, dead_claim

EVERY_2S = "*/2 * * * * *"


@pytest.fixture
def name() -> str:
    return f"export-{uuid.uuid4().hex[:12]}"


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def outbox(url: str, name: str) -> dict[datetime, sa.RowMapping]:
    """The outbox rows of ``name``, by instant."""
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            table = lease.metadata.tables["cronjob_outbox"]
            rows = conn.execute(sa.select(table).where(table.c.name == name)).mappings()
            return {datetime.fromtimestamp(row["instant_ms"] / 1000, UTC): row for row in rows}
    finally:
        engine.dispose()


def sent_once(url: str, name: str, publisher: Publisher, instants: list[datetime]) -> None:
    """Each of ``instants`` was accepted exactly once, and its outbox row is sent."""
    accepted = publisher.instants()
    assert {i: accepted.count(i) for i in instants} == dict.fromkeys(instants, 1)
    kept = outbox(url, name)
    assert {i: kept[i]["sent_ms"] is not None for i in instants if i in kept} == dict.fromkeys(
        instants, True
    )


def tick(ctx: cronjob.Round) -> None:
    """A job of its own, due with the hand-off: enough jobs at an instant for a replica
    to claim them as its share, ahead of the instant."""


def jobs(publisher: Publisher, name: str) -> cronjob.Registry:
    """The hand-off ``name`` every 2 s, and three plain jobs due at its instants."""
    registry = cronjob.Registry()
    registry.register(handoff(publisher), EVERY_2S, name)
    for i in range(3):
        registry.register(tick, EVERY_2S, f"{name}-tick-{i}")
    return registry


@pytest.fixture
def claims_ahead(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claims that take 50 ms (fake time): the replicas send them ahead of the instant,
    and hold what they won until it comes."""
    claim = lease.LeaseStore.claim_batch

    def slow_claim(store, names, instant, holder, **kw):  # type: ignore[no-untyped-def]
        won = claim(store, names, instant, holder, **kw)
        if holder != "dead-replica":  # the test's own claim does not wait
            clock.sleep(0.05)
        return won

    monkeypatch.setattr(lease.LeaseStore, "claim_batch", slow_claim)


@pytest.mark.usefixtures("claims_ahead")
class TestAClaimGivenBackThatOwesInstants:
    def test_the_second_run_elsewhere_publishes_every_owed_instant_once(
        self, db_url, replicas, clock, name
    ):
        """Every 2 s, the dead lease of 09:00:02 runs until 09:00:16.5: the claims of
        09:00:04 to 09:00:16 are refused. Replica a's claim of 09:00:18, sent ahead, gives
        the dead round up and owes 09:00:02 to 09:00:16; a drains before 09:00:18 comes
        and gives it back unrun. Replica b's sweep runs 09:00:18 a second time: it
        publishes each owed instant, then its own, and b every later instant."""
        publisher = Publisher(clock)
        registry = jobs(publisher, name)
        a = replicas(registry, "a")
        clock.advance(1.5)
        dead_claim(db_url, clock, name, at(2))  # expires 09:00:16.5
        clock.advance_to(at(17.99))  # the claim of 09:00:18 went out ahead and won
        row = lease_row(db_url, name)
        assert (row.instant, row.holder) == (at(18), "a")
        assert a.drain()  # given back unrun, as cut short, on its control thread
        clock.advance(0)
        assert lease_row(db_url, name).state is lease.LeaseState.CUT
        assert publisher.instants() == []
        replicas(registry, "b")
        clock.advance_to(at(31))
        owed = [at(s) for s in range(2, 17, 2)]
        assert publisher.instants()[: len(owed) + 1] == [*owed, at(18)]
        everything = [at(s) for s in range(2, 31, 2)]
        sent_once(db_url, name, publisher, everything)
        clock.advance_to(at(120))  # past the grace a claim has
        job = next(j for j in admin.status(db_url, now=clock.now()).jobs if j.name == name)
        assert job.missed == 0

    def test_a_second_run_given_back_in_turn_leaves_the_next_one_owing_them(
        self, db_url, replicas, clock, name
    ):
        """As above; replica b, started before 09:00:18, wins its second run ahead of the
        instant and drains in turn, giving it back unrun: replica c's second run still
        publishes each instant a's claim owed, once (the row keeps what that claim gave
        up through the second runs)."""
        publisher = Publisher(clock)
        registry = jobs(publisher, name)
        a = replicas(registry, "a")
        clock.advance(1.5)
        dead_claim(db_url, clock, name, at(2))  # expires 09:00:16.5
        clock.advance_to(at(17.99))
        assert a.drain()
        b = replicas(registry, "b")
        clock.advance(0)  # b swept: its second run of 09:00:18 won, held until it comes
        row = lease_row(db_url, name)
        assert (row.instant, row.attempt, row.holder) == (at(18), 2, "b")
        assert b.drain()
        clock.advance(0)
        assert lease_row(db_url, name).state is lease.LeaseState.CUT
        replicas(registry, "c")
        clock.advance_to(at(31))
        owed = [at(s) for s in range(2, 17, 2)]
        assert publisher.instants()[: len(owed) + 1] == [*owed, at(18)]
        sent_once(db_url, name, publisher, [at(s) for s in range(2, 31, 2)])
        clock.advance_to(at(120))
        job = next(j for j in admin.status(db_url, now=clock.now()).jobs if j.name == name)
        assert job.missed == 0
