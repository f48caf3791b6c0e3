"""A hand-off round that ran past an instant, and a later instant's claim that came
before its replica's follow-up (``cronjob.engine._owed.owe_ran_over``).

A round of a hand-off job that holds its lease past an instant keeps that instant from
its claims; its replica claims it as the round ends (``owe_overrun``). Under load that
follow-up can come after another replica's claim of the next instant, sent ahead of it:
the follow-up then wins nothing. The claim that took the row sees that the round before
it ended after the instant (the row's last end), and its round records and publishes the
instant first. Here the other replica is the lease store itself, on the test's fake
clock; on every database, with a publisher of the test's own.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

import cronjob
import lease
from cronjob.contrib import handoff
from cronjob.testing import FakeClock
from tests.test_handoff_rounds import START, outbox
from tests.test_owed_meets import Publisher, sent_once

EVERY_2S = "*/2 * * * * *"


@pytest.fixture
def name() -> str:
    return f"export-{uuid.uuid4().hex[:12]}"


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def ran_elsewhere(url: str, clock: FakeClock, name: str, instant: datetime, ended: float) -> None:
    """Another replica's round of ``instant`` that ran until ``ended`` (seconds after
    START) and ended there, its follow-up claim never made."""
    engine = lease.create_engine(url)
    try:
        store = lease.LeaseStore(engine, clock=clock.lease_clock())
        lease.migrate(engine)
        store.ensure([name])
        (claim,) = store.claim([name], instant, "other-replica")
        clock.advance_to(at(ended))
        assert store.finish(name, claim.token, ended=at(ended))
    finally:
        engine.dispose()


@pytest.mark.parametrize("catch_up", ["none", "latest"])
def test_the_next_claim_publishes_the_instant_a_round_that_ended_late_kept(
    db_url, replicas, clock, name, catch_up
):
    publisher = Publisher(clock)
    registry = cronjob.Registry()
    registry.register(handoff(publisher), EVERY_2S, name, catch_up=catch_up)
    clock.advance_to(at(4))
    # The round of 09:00:04 held the lease until 09:00:07.3: 09:00:06's claims were refused.
    ran_elsewhere(db_url, clock, name, at(4), 7.3)
    replicas(registry, "a")
    clock.advance_to(at(9))  # the claim of 09:00:08
    sent_once(db_url, publisher, [at(6), at(8)])
    assert publisher.instants().index(at(6)) < publisher.instants().index(at(8))
    assert at(4) not in publisher.instants()  # the other replica's own, not owed


def test_a_round_that_ended_before_the_next_instant_owes_nothing(db_url, replicas, clock, name):
    publisher = Publisher(clock)
    registry = cronjob.Registry()
    registry.register(handoff(publisher), EVERY_2S, name, catch_up="none")
    clock.advance_to(at(4))
    ran_elsewhere(db_url, clock, name, at(4), 4.3)
    replicas(registry, "a")
    clock.advance_to(at(7))  # the claim of 09:00:06
    sent_once(db_url, publisher, [at(6)])
    assert publisher.instants() == [at(6)]
    assert set(outbox(db_url)) == {at(6)}
