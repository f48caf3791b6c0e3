"""Where a hand-off's owed instants meet the rest: the paths of ``cronjob.engine._owed``
beside give-backs, drains, dead rounds and the ``overlap`` policies.

A hand-off (``cronjob.contrib.handoff``) must lose no instant: a round that kept
instants from their claims (it died holding the lease, or it ran past them) leaves them
owed to a later round, which records them in the outbox and publishes them. Here the
claim that owes them cannot start its round (given back: a drain met it, it came back
too late, no thread could take it), or the round that ran past them meets a drain, a
dead replica, or a policy that would skip an overrun. Whichever round takes the row
next (another replica's claim, the sweep's second run, or the claim that gives up a
dead round), every instant is recorded once, under its occurrence id, and sent.

Not reachable from the public API, so not here: a follow-up claim (``owe_overrun``)
meeting busy worker threads or no thread at all. The follow-up is claimed by the replica
whose round just ended, on the worker thread that round frees (a worker thread lives
until the pool is shut down, so ``NoWorkerThread`` cannot come), and a round that waits
for a busy thread keeps its lease renewed and runs, as tests/test_rounds_robust.py
shows; a claim is refused before it is sent while every worker thread is busy
(``Claims._refuse_sync``), which is not a give-back. The other owing claims meet no
thread below.

On every database, on a fake clock, with several schedulers as replicas and a publisher
of the test's own.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.contrib import handoff
from cronjob.testing import FakeClock
from tests._helpers import refuse_thread_starts
from tests.conftest import lease_row
from tests.test_handoff_rounds import EVERY_2S, EVERY_5S
from tests.test_owed_meets import Publisher, at, dead_claim, ended, sent_once
from tests.test_owed_ran_over import ran_elsewhere

#: Every 2 s, from START.
EVERY_2 = [at(s) for s in range(0, 3600, 2)]
#: Every 5 s, from START.
EVERY_5 = [at(s) for s in range(0, 3600, 5)]


@pytest.fixture
def name() -> str:
    return f"export-{uuid.uuid4().hex[:12]}"


def between(instants: list[datetime], first: float, last: float) -> list[datetime]:
    """The instants from ``first`` to ``last`` seconds after START, both included."""
    return [i for i in instants if at(first) <= i <= at(last)]


def once(url: str, name: str, publisher: Publisher, instants: list[datetime]) -> None:
    """Each of ``instants`` is in the outbox once, under its occurrence id, and sent;
    accepted by the broker once; and nothing was accepted twice."""
    sent_once(url, publisher, instants)
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            table = lease.metadata.tables["cronjob_outbox"]
            query = sa.select(table.c.id, table.c.instant_ms).where(table.c.name == name)
            rows = conn.execute(query).all()
    finally:
        engine.dispose()
    recorded = Counter(datetime.fromtimestamp(ms / 1000, UTC) for _id, ms in rows)
    assert {i: recorded[i] for i in instants} == dict.fromkeys(instants, 1)
    ids = {datetime.fromtimestamp(ms / 1000, UTC): id for id, ms in rows}
    assert {i: ids[i] for i in instants} == {i: cronjob.occurrence_id(name, i) for i in instants}
    accepted = Counter(o.id for o in publisher.sent)
    assert [id for id, count in accepted.items() if count > 1] == []


def before(publisher: Publisher, earlier: Iterable[datetime], later: datetime) -> bool:
    """Whether every instant of ``earlier`` was accepted before ``later``."""
    accepted = publisher.instants()
    return all(accepted.index(i) < accepted.index(later) for i in earlier)


def slow_claim(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, holder: str, instant: datetime, took: float
) -> None:
    """``holder``'s claim of ``instant`` answers ``took`` seconds (fake time) after it
    won: a database slow to answer. Every other claim answers at once."""
    claim = lease.LeaseStore.claim_batch

    def slow(store, names, claimed, by, **kw):  # type: ignore[no-untyped-def]
        won = claim(store, names, claimed, by, **kw)
        if by == holder and claimed == instant:
            clock.sleep(took)
        return won

    monkeypatch.setattr(lease.LeaseStore, "claim_batch", slow)


def overrunning(clock: FakeClock, name: str, *, until: float = 17, **policy: object) -> tuple:
    """A hand-off every 5 s whose broker refuses until ``until`` seconds after START and
    whose round retries for 20 s: the round of 09:00:05 runs until 09:00:17.6 (by
    default), over 09:00:10 and 09:00:15; its replica then claims 09:00:15 at once, and
    that round owes 09:00:10 (``owe_overrun``)."""
    publisher = Publisher(clock, refuses=lambda o: clock.now() < at(until))
    registry = cronjob.Registry()
    registry.register(handoff(publisher, retry_within=20), EVERY_5S, name, **policy)
    return publisher, registry


class TestAFollowUpClaimGivenBack:
    """The follow-up claim of a round that ran over (``owe_overrun``) wins, and its round
    does not start: the instants it owed are on no record but the row's."""

    def test_met_by_a_drain_the_next_claim_elsewhere_publishes_what_it_owed(
        self, db_url, replicas, clock, name, monkeypatch
    ):
        """Replica a's follow-up claim of 09:00:15 answers a second after it won; a
        drains meanwhile and gives it back. Replica b's claim of 09:00:20 gives up the
        round of 09:00:15: its round publishes 09:00:10 and 09:00:15 first."""
        publisher, registry = overrunning(clock, name)
        slow_claim(monkeypatch, clock, "a", at(15), 1)
        a = replicas(registry, "a")
        clock.advance_to(at(6))
        replicas(registry, "b")
        clock.advance_to(at(17.7))  # the follow-up won, its answer not yet back
        assert (lease_row(db_url, name).instant, lease_row(db_url, name).holder) == (at(15), "a")
        assert a.drain()
        clock.advance_to(at(18.7))
        assert lease_row(db_url, name).state is lease.LeaseState.CUT
        clock.advance_to(at(40))
        once(db_url, name, publisher, between(EVERY_5, 5, 40))
        assert before(publisher, [at(10), at(15)], at(20))

    def test_met_by_a_drain_its_second_run_elsewhere_publishes_what_it_owed(
        self, db_url, replicas, clock, name, monkeypatch
    ):
        """As above, b started after the give-back: its sweep runs 09:00:15 a second
        time, which publishes 09:00:10 first (the row's previous round ran from 09:00:05
        until the follow-up was given back)."""
        publisher, registry = overrunning(clock, name)
        slow_claim(monkeypatch, clock, "a", at(15), 1)
        a = replicas(registry, "a")
        clock.advance_to(at(17.7))
        assert a.drain()
        clock.advance_to(at(18.7))
        replicas(registry, "b")
        clock.advance_to(at(40))
        assert (at(15), 2, "re-run", "succeeded") in ended(db_url, name)
        once(db_url, name, publisher, between(EVERY_5, 5, 40))
        assert before(publisher, [at(10)], at(15))

    def test_came_back_too_late_the_instants_its_lease_kept_are_published_too(
        self, db_url, replicas, clock, name, monkeypatch
    ):
        """Replica a's follow-up claim answers 10 s after it won (09:00:27.6): too late,
        given back. Its lease refused b's claims of 09:00:20 and 09:00:25 meanwhile, and
        a, its next instant (09:00:20) overdue, claims it late: that round publishes
        09:00:10 to 09:00:25."""
        publisher, registry = overrunning(clock, name)
        slow_claim(monkeypatch, clock, "a", at(15), 10)
        replicas(registry, "a")
        clock.advance_to(at(6))
        replicas(registry, "b")
        clock.advance_to(at(50))
        once(db_url, name, publisher, between(EVERY_5, 5, 50))


def every_2s(clock: FakeClock, name: str, **policy: object) -> tuple[Publisher, cronjob.Registry]:
    """A hand-off every 2 s. The tests below kill a replica right after its claim of
    09:00:02 (at 09:00:01.5, `dead_claim`): its lease keeps 09:00:02 to 09:00:16 from
    every claim until 09:00:16.5, and the claim of 09:00:18 gives that round up, owing
    them (``owe``)."""
    publisher = Publisher(clock)
    registry = cronjob.Registry()
    registry.register(handoff(publisher), EVERY_2S, name, **policy)
    return publisher, registry


class TestAClaimThatOwesGivenBack:
    """A claim that owes instants (it gave up a dead round, or the round before it ran
    past instants) is given back: it came back too late, or no thread could take its
    round. Whichever round takes the row next owes them."""

    @pytest.mark.parametrize("next_one", ["the next claim", "its second run"])
    def test_too_late_a_dead_rounds_instants_and_its_own_lease_s_are_published(
        self, db_url, replicas, clock, name, monkeypatch, next_one
    ):
        """Replica a's claim of 09:00:18 gives the dead round up and answers 10 s later:
        given back at 09:00:28, having kept 09:00:20 to 09:00:26 from every claim too.
        Either a's own claim of 09:00:20, overdue, takes the row; or a drains meanwhile
        and b, started then, runs 09:00:18 a second time."""
        publisher, registry = every_2s(clock, name, catch_up="none")
        a = replicas(registry, "a")
        clock.advance(1.5)
        dead_claim(db_url, clock, name, at(2))  # expires 09:00:16.5
        slow_claim(monkeypatch, clock, "a", at(18), 10)
        clock.advance_to(at(27.99))
        if next_one == "its second run":
            assert a.drain()
            clock.advance_to(at(28.5))
            replicas(registry, "b")
        clock.advance_to(at(60))
        rounds = ended(db_url, name)
        if next_one == "its second run":
            assert (at(18), 2, "re-run", "succeeded") in rounds
        else:
            assert (at(18), 1, "superseded", "given up") in rounds
        once(db_url, name, publisher, between(EVERY_2, 2, 60))

    @pytest.mark.parametrize("next_one", ["the next claim", "its second run"])
    def test_no_thread_a_dead_rounds_instants_are_published(
        self, db_url, replicas, clock, name, monkeypatch, next_one
    ):
        """Replica a can start no round thread (the OS refuses): its claim of 09:00:18
        gives the dead round up, no thread takes its round, and its lease is given back.
        Threads start again; then a's claim of 09:00:20 takes the row, or b's sweep
        runs 09:00:18 a second time first."""
        publisher, registry = every_2s(clock, name)
        refusing = refuse_thread_starts(monkeypatch, "cronjob-round")
        refusing[0] = True
        replicas(registry, "a")
        clock.advance(1.5)
        dead_claim(db_url, clock, name, at(2))
        clock.advance_to(at(18.5))
        row = lease_row(db_url, name)
        assert (row.instant, row.state, row.holder) == (at(18), lease.LeaseState.CUT, "a")
        assert publisher.instants() == []
        refusing[0] = False
        if next_one == "its second run":
            replicas(registry, "b")
        clock.advance_to(at(60))
        once(db_url, name, publisher, between(EVERY_2, 2, 60))
        assert before(publisher, between(EVERY_2, 2, 16), at(20))

    def test_no_thread_the_instant_a_round_ran_over_is_published(
        self, db_url, replicas, clock, name, monkeypatch
    ):
        """Another replica's round of 09:00:04 held the lease until 09:00:07.3: 09:00:06's
        claims were refused. Replica a's claim of 09:00:08 owes it (``owe_ran_over``);
        no thread takes its round, and its lease is given back. a's claim of 09:00:10
        takes the row: its round publishes 09:00:06 and 09:00:08."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_2S, name, catch_up="none")
        clock.advance_to(at(4))
        ran_elsewhere(db_url, clock, name, at(4), 7.3)
        refusing = refuse_thread_starts(monkeypatch, "cronjob-round")
        refusing[0] = True
        replicas(registry, "a")
        clock.advance_to(at(8.5))
        assert lease_row(db_url, name).state is lease.LeaseState.CUT
        refusing[0] = False
        clock.advance_to(at(30))
        once(db_url, name, publisher, between(EVERY_2, 6, 30))
        assert at(4) not in publisher.instants()  # the other replica's own
        assert before(publisher, [at(6), at(8)], at(10))


class TestARoundThatRanOver:
    """A round of a hand-off that runs past its next instants, meeting a drain, a dead
    replica, and each ``overlap`` policy."""

    @pytest.mark.parametrize("next_one", ["the next claim", "its second run"])
    def test_a_drain_while_it_runs_loses_none_of_the_instants_it_kept(
        self, db_url, replicas, clock, name, next_one
    ):
        """The round of 09:00:05 retries until 09:00:30.6 (the broker refusing until
        09:00:30); replica a stops at 09:00:20.5 (its drain cuts the round short),
        having kept 09:00:10 to 09:00:20 from b's claims. b's claim of 09:00:25 gives
        it up, or (b started at 09:00:06.3, its sweep at 09:00:21.3) b's sweep runs it
        a second time first."""
        publisher, registry = overrunning(clock, name, until=30, catch_up="none")
        a = replicas(registry, "a")
        if next_one == "its second run":
            clock.advance_to(at(6.3))
        else:
            clock.advance_to(at(12))  # its sweep at 09:00:27
        replicas(registry, "b")
        clock.advance_to(at(20.5))
        assert publisher.instants() == []
        a.stop()
        clock.advance_to(at(60))
        rounds = ended(db_url, name)
        assert (at(5), 1, "schedule", "cut short") in rounds
        if next_one == "its second run":
            assert (at(5), 2, "re-run", "succeeded") in rounds
        once(db_url, name, publisher, between(EVERY_5, 5, 60))

    @pytest.mark.parametrize("next_one", ["the next claim", "its second run"])
    def test_the_claim_after_it_dies_the_next_round_publishes_what_it_kept(
        self, db_url, replicas, clock, name, next_one
    ):
        """Another replica's round of 09:00:04 held the lease until 09:00:07.3, over
        09:00:06; a replica killed right after its claim of 09:00:08 (at 09:00:07.9)
        owed 09:00:06 and recorded nothing. Its lease runs out at 09:00:22.9: b's claim
        of 09:00:24 gives it up, or (b started at 09:00:07.9) b's sweep runs 09:00:08 a
        second time first."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_2S, name, catch_up="none")
        clock.advance_to(at(4))
        ran_elsewhere(db_url, clock, name, at(4), 7.3)
        clock.advance_to(at(7.9))
        dead_claim(db_url, clock, name, at(8))
        if next_one == "the next claim":
            clock.advance_to(at(9))  # its sweep at 09:00:24
        replicas(registry, "b")
        clock.advance_to(at(40))
        rounds = ended(db_url, name)
        if next_one == "its second run":
            assert (at(8), 2, "re-run", "succeeded") in rounds
        else:
            assert (at(8), 1, "superseded", "given up") in rounds
        once(db_url, name, publisher, between(EVERY_2, 6, 40))

    @pytest.mark.parametrize(
        "died",
        [
            11.5,
            pytest.param(
                16.5,
                marks=pytest.mark.xfail(
                    strict=True,
                    reason="left as found (docs/decisions.md): a dead round's owed instants are "
                    "bounded by the instant after its own plus the ttl; a round that ran over and "
                    "renewed its lease kept instants past that bound",
                ),
            ),
        ],
    )
    def test_it_dies_while_it_runs_the_claim_that_gives_it_up_publishes_them(
        self, db_url, replicas, clock, name, died
    ):
        """A replica's round of 09:00:05 runs over (its lease renewed) and dies at
        ``died``; its lease runs out 15 s later. Replica b's claim that gives it up
        publishes every instant it kept: within the bound the engine assumes (the
        instant after 09:00:05, plus the ttl and 2 s: 09:00:27), or past it."""
        publisher = Publisher(clock)
        registry = cronjob.Registry()
        registry.register(handoff(publisher), EVERY_5S, name, catch_up="none")
        replicas(registry, "b")
        clock.advance_to(at(4.9))
        engine = lease.create_engine(db_url)
        try:
            store = lease.LeaseStore(engine, clock=clock.lease_clock())
            (claim,) = store.claim([name], at(5), "dead-replica")
            clock.advance_to(at(died))
            assert store.renew([(name, claim.token)], "dead-replica")
        finally:
            engine.dispose()
        clock.advance_to(at(60))
        once(db_url, name, publisher, between(EVERY_5, 5, 60))

    @pytest.mark.parametrize("overlap", ["skip", "buffer_one", "cancel_other"])
    def test_whatever_its_overlap_policy_no_instant_is_skipped(
        self, db_url, replicas, clock, name, overlap
    ):
        """The round of 09:00:05 runs until 09:00:17.6 on replica a (b's claims refused):
        under each policy, 09:00:10 and 09:00:15 are published once, none skipped as an
        overrun."""
        publisher, registry = overrunning(clock, name, overlap=overlap)
        replicas(registry, "a")
        clock.advance_to(at(6))
        replicas(registry, "b")
        clock.advance_to(at(40))
        once(db_url, name, publisher, between(EVERY_5, 5, 40))
        # The latest instant it ran past was claimed as it ended, not skipped.
        assert at(15) in [instant for instant, _a, _why, _o in ended(db_url, name)]

    @pytest.mark.parametrize("overlap", ["skip", "buffer_one", "cancel_other"])
    def test_whatever_its_overlap_policy_a_follow_up_given_back_loses_none(
        self, db_url, replicas, clock, name, monkeypatch, overlap
    ):
        """As `TestAFollowUpClaimGivenBack`, under each policy: replica a, alone, drains
        while the follow-up claim it makes as the round ends is out (``cancel_other``
        ends the round at 09:00:10, the others at 09:00:17.6), and gives it back.
        Replica b, started then, takes the row (its sweep's second run, or its catch-up
        claim) and publishes what the follow-up owed."""
        publisher, registry = overrunning(clock, name, overlap=overlap)
        a = replicas(registry, "a")
        follow_ups: list[datetime] = []
        claim = lease.LeaseStore.claim_batch

        def drained_meanwhile(store, names, instant, holder, **kw):  # type: ignore[no-untyped-def]
            won = claim(store, names, instant, holder, **kw)
            if holder == "a" and won.names and at(10) <= instant <= at(15):
                follow_ups.append(instant)  # won: the lease is free, the round has ended
                assert a.drain()
            return won

        monkeypatch.setattr(lease.LeaseStore, "claim_batch", drained_meanwhile)
        clock.advance_to(at(18))
        assert len(follow_ups) == 1
        row = lease_row(db_url, name)
        assert (row.instant, row.state) == (follow_ups[0], lease.LeaseState.CUT)
        replicas(registry, "b")
        clock.advance_to(at(40))
        once(db_url, name, publisher, between(EVERY_5, 5, 40))
