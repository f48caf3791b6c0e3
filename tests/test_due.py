"""The due column (revision 0006): each row's next instant, and the rest of an instant
found by it instead of by names (issue #31, ``lease/_claims.py``, ``engine/_claiming.py``).

The store's rules on every database; then replicas on one fake clock: what a claim and
a start write, a dead replica's share taken through the query, a lease given back, and
the statements and names each replica sends per instant, which must not grow with the
number of jobs.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import START, ManualClock, lease_row
from sqlalchemy import event

import cronjob
import lease
from cronjob import Registry
from cronjob.testing import FakeClock, crash

T0 = START
T1 = START + timedelta(minutes=1)
T2 = START + timedelta(minutes=2)


@pytest.fixture
def store(migrated_engine: sa.Engine, manual_clock: ManualClock) -> lease.LeaseStore:
    return lease.LeaseStore(migrated_engine, clock=manual_clock.now, claim_ahead=None)


def dues(store: lease.LeaseStore, *names: str) -> list[datetime | None]:
    rows = store.read(names)
    return [rows[name].due for name in names]


class TestEnsure:
    def test_it_writes_the_next_instant_of_a_row_that_has_none_and_lowers_a_later_one(self, store):
        store.ensure(["a", "b", "c"], due={"a": T1, "b": None})
        assert dues(store, "a", "b", "c") == [T1, None, None]
        store.ensure(["a", "b", "c"], due={"a": T2, "b": T2, "c": T0})
        assert dues(store, "a", "b", "c") == [T1, T2, T0]  # a due is lowered, never raised

    def test_without_due_it_leaves_the_column_alone(self, store):
        store.ensure(["a"], due={"a": T1})
        store.ensure(["a", "b"], specs={"a": "0 * * * * *"})
        store.ensure(["a", "b"])
        assert dues(store, "a", "b") == [T1, None]

    def test_a_fraction_of_a_second_is_rounded_down(self, store):
        store.ensure(["a"], due={"a": T1 + timedelta(seconds=0.9)})
        assert dues(store, "a") == [T1]


class TestClaim:
    def test_each_claimed_row_keeps_its_own_next_instant_and_its_previous_round(self, store):
        store.ensure(["a", "b", "c"], due={"c": T0})
        batch = store.claim_batch(["a", "b", "c"], T0, "r", due={"a": T1, "b": T2})
        assert batch.names == ("a", "b", "c")
        assert dues(store, "a", "b", "c") == [T1, T2, T0]  # c: left out, kept
        store.finish("a", batch.token, ended=T0)
        later = store.claim_batch(["a"], T1, "r", due={"a": T2})
        assert later.names == ("a",)
        row = store.read(["a"])["a"]
        # Written in the same statement, the copies into prev_* still read the old row.
        assert (row.instant, row.prev_instant, row.prev_state, row.due) == (
            T1,
            T0,
            lease.LeaseState.DONE,
            T2,
        )

    def test_a_row_not_won_keeps_its_due(self, store, manual_clock):
        store.ensure(["a", "b"], due={"a": T0, "b": T0})
        first = store.claim_batch(["a"], T0, "r1", due={"a": T1})
        assert first.names == ("a",)
        # a is held: the second claim wins only b, and writes only b's.
        second = store.claim_batch(["a", "b"], T1, "r2", due={"a": T2, "b": T2})
        assert second.names == ("b",)
        assert dues(store, "a", "b") == [T1, T2]

    def test_without_due_the_claim_leaves_the_column_alone(self, store):
        store.ensure(["a"], due={"a": T0})
        assert store.claim_batch(["a"], T0, "r").names == ("a",)
        assert dues(store, "a") == [T0]

    def test_a_due_that_is_not_an_aware_datetime_is_refused(self, store):
        store.ensure(["a"])
        with pytest.raises(ValueError, match="due"):
            store.claim_batch(["a"], T0, "r", due={"a": datetime(2026, 3, 8, 6, 1)})


class TestUnclaimed:
    """What the claims of an instant left: due, an older instant, free, not paused."""

    def test_it_finds_rows_due_at_or_before_the_instant_and_not_claimed_for_it(self, store):
        store.ensure(["on-time", "late", "later", "never"], due={"on-time": T1, "late": T0})
        store.ensure(["later"], due={"later": T1 + timedelta(seconds=1)})
        assert sorted(store.unclaimed(T1)) == ["late", "on-time"]  # NULL: never found
        store.claim_batch(["on-time"], T1, "r", due={"on-time": T2})
        assert store.unclaimed(T1) == ["late"]

    def test_a_held_lease_is_not_found_until_it_expires_to_the_millisecond(
        self, store, manual_clock
    ):
        store.ensure(["a"], due={"a": T0})
        store.claim_batch(["a"], T0, "r")  # no due: stays at T0, held until T0 + 15 s
        manual_clock.set(T1 - timedelta(seconds=50))  # T0 + 10 s: still held
        assert store.unclaimed(T1) == []
        manual_clock.set(T0 + timedelta(seconds=15))  # expires_ms == now: free
        assert store.unclaimed(T1) == ["a"]
        assert store.unclaimed(T0) == []  # its instant is T0: claimed for it already

    def test_a_paused_row_is_not_found(self, store):
        store.ensure(["a"], due={"a": T0})
        store.set_paused(["a"], paused=True, by="ops")
        assert store.unclaimed(T1) == []
        store.set_paused(["a"], paused=False, by="ops")
        assert store.unclaimed(T1) == ["a"]

    def test_it_returns_at_most_the_limit_lowest_due_first(self, store):
        store.ensure(["a", "b", "c"], due={"a": T1, "b": T0, "c": T2})
        assert store.unclaimed(T2, limit=2) == ["b", "a"]
        with pytest.raises(ValueError, match=r"^limit must be a positive whole number, not 0$"):
            store.unclaimed(T2, limit=0)

    def test_a_row_due_more_than_a_day_before_the_instant_is_not_found(self, store):
        # A job a deploy removed: its row keeps the due of its last claim for ever.
        day = timedelta(seconds=lease.UNCLAIMED_WITHIN)
        store.ensure(["removed", "edge"], due={"removed": T0 - day, "edge": T1 - day})
        assert store.unclaimed(T1) == ["edge"]  # exactly a day: still found
        assert store.unclaimed(T1 + timedelta(seconds=1)) == []

    def test_within_bounds_how_far_back_it_looks(self, store):
        """The engine's look at most instants reaches a few seconds back: a row due
        longer ago (it missed earlier instants) is left to its look of a day."""
        store.ensure(
            ["now", "ten-ago", "a-minute-ago"],
            due={"now": T1, "ten-ago": T1 - timedelta(seconds=10), "a-minute-ago": T0},
        )
        assert sorted(store.unclaimed(T1, within=10)) == ["now", "ten-ago"]
        assert sorted(store.unclaimed(T1)) == ["a-minute-ago", "now", "ten-ago"]
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match=r"^within must be a positive whole number"):
                store.unclaimed(T1, within=bad)

    def test_the_query_carries_no_name_whatever_the_number_of_rows(self, store):
        names = [f"job-{i:04d}" for i in range(300)]
        store.ensure(names, due=dict.fromkeys(names, T1))
        store.claim_batch(names, T1, "r", due=dict.fromkeys(names, T2))
        sent = []

        def before(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
            sent.append((statement, parameters))

        event.listen(store.engine, "before_cursor_execute", before)
        try:
            assert store.unclaimed(T1) == []
        finally:
            event.remove(store.engine, "before_cursor_execute", before)
        queries = [(s, p) for s, p in sent if "due_s" in s]
        assert len(queries) == 1
        statement, parameters = queries[0]
        assert "job-" not in statement + repr(parameters)


# -- replicas on one fake clock -------------------------------------------------------

#: Two minutes before an hour: the hourly jobs fall due within the tests.
NEAR_HOUR = datetime(2026, 3, 2, 9, 58, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NEAR_HOUR)


class Ran:
    """Rounds run, by (name, instant), with the replica that ran them."""

    def __init__(self) -> None:
        self.rounds: list[tuple[str, datetime, int, str]] = []
        self._lock = threading.Lock()

    def __call__(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.rounds.append((ctx.name, ctx.instant, ctx.attempt, ctx.replica))

    def pairs(self) -> list[tuple[str, datetime]]:
        return [(name, instant) for name, instant, _, _ in self.rounds]


def jobs(ran: Ran, count: int, *, hourly_every: int = 5) -> Registry:
    """``count`` jobs: every minute, and one in ``hourly_every`` hourly."""
    registry = Registry()
    for i in range(count):
        spec = "0 0 * * * *" if i % hourly_every == 0 else "0 * * * * *"
        registry.register(ran, spec, f"job-{i:04d}")
    return registry


class ClaimTraffic:
    """The claim path's statements and names, by replica and instant: every statement
    run inside ``LeaseStore.claim_batch`` and ``LeaseStore.unclaimed``, and the names
    each claim sent."""

    def __init__(self) -> None:
        self.statements: Counter[tuple[str, datetime]] = Counter()
        self.names: Counter[tuple[str, datetime]] = Counter()
        self.checks: Counter[tuple[str, datetime]] = Counter()
        self._local = threading.local()
        self._replica_of: dict[int, str] = {}

    def watch(self, scheduler: cronjob.Scheduler, replica: str) -> None:
        engine = scheduler.engine
        assert engine is not None
        self._replica_of[id(engine)] = replica
        event.listen(engine, "before_cursor_execute", self._before)

    def _before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        instant = getattr(self._local, "instant", None)
        replica = self._replica_of.get(id(conn.engine))
        if instant is not None and replica is not None and "cronjob_lease" in statement:
            self.statements[(replica, instant)] += 1

    @contextmanager
    def patched(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        claim_batch, unclaimed = lease.LeaseStore.claim_batch, lease.LeaseStore.unclaimed
        local, traffic = self._local, self

        def counted_claim(store, names, instant, holder, **kw):  # type: ignore[no-untyped-def]
            names = list(names)
            traffic.names[(holder, instant)] += len(names)
            local.instant = instant
            try:
                return claim_batch(store, names, instant, holder, **kw)
            finally:
                local.instant = None

        def counted_check(store, instant, **kw):  # type: ignore[no-untyped-def]
            local.instant = instant
            try:
                found = unclaimed(store, instant, **kw)
            finally:
                local.instant = None
            return found

        monkeypatch.setattr(lease.LeaseStore, "claim_batch", counted_claim)
        monkeypatch.setattr(lease.LeaseStore, "unclaimed", counted_check)
        yield


class TestWrittenByReplicas:
    def test_a_start_writes_each_jobs_next_instant_and_a_claim_the_one_after(
        self, url, replicas, clock
    ):
        ran = Ran()
        registry = jobs(ran, 5)
        replicas(registry, "a")
        clock.advance(0.5)  # its start-up statements ran
        hour = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
        assert lease_row(url, "job-0000").due == hour  # hourly
        assert lease_row(url, "job-0001").due == NEAR_HOUR + timedelta(minutes=1)
        clock.advance(60)
        assert lease_row(url, "job-0000").due == hour  # not due yet: untouched
        assert lease_row(url, "job-0001").due == NEAR_HOUR + timedelta(minutes=2)
        clock.advance(120)
        assert lease_row(url, "job-0000").due == hour + timedelta(hours=1)

    def test_a_schedule_that_comes_sooner_lowers_the_due_on_record_at_start(
        self, url, replicas, clock
    ):
        ran = Ran()
        hourly = Registry()
        hourly.register(ran, "0 0 * * * *", "report")
        a = replicas(hourly, "a")
        clock.advance(0.5)  # its start-up statements ran
        a.stop()
        assert lease_row(url, "report").due == datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
        minutely = Registry()
        minutely.register(ran, "0 * * * * *", "report")
        replicas(minutely, "b")
        clock.advance(0.5)
        assert lease_row(url, "report").due == NEAR_HOUR + timedelta(minutes=1)


class TestTheRestFoundByTheQuery:
    JOBS = 30

    def test_a_dead_replicas_share_is_claimed_with_only_its_names(
        self, replicas, clock, monkeypatch
    ):
        """After the grace, the live replicas claim by name only what the query found:
        the dead one's share, not the whole of the others' shares."""
        traffic = ClaimTraffic()
        ran = Ran()
        registry = Registry()
        for i in range(self.JOBS):
            registry.register(ran, "* * * * * *", f"job-{i:02d}")
        with traffic.patched(monkeypatch):
            *_, c = (replicas(registry, replica) for replica in "abc")
            clock.advance(20.5)  # views agree: 10 jobs each
            crash(c)
            died = clock.now()
            clock.advance(1)
        instant = died.replace(microsecond=0) + timedelta(seconds=1)
        done = [r for r in ran.rounds if r[1] == instant]
        assert sorted(r[0] for r in done) == [f"job-{i:02d}" for i in range(self.JOBS)]
        assert {r[3] for r in done} == {"a", "b"} and all(r[2] == 1 for r in done)
        # Each live replica sent its share (10) and, after the grace, at most the dead
        # one's (10): never the 20 of the others' shares.
        for replica in "ab":
            assert traffic.names[(replica, instant)] <= 20, traffic.names
        assert traffic.names[("a", instant)] + traffic.names[("b", instant)] <= 40
        assert len(ran.pairs()) == len(set(ran.pairs()))

    def test_a_lease_given_back_before_its_instant_runs_elsewhere_and_later_instants_too(
        self, url, replicas, clock, monkeypatch
    ):
        """A replica that drains between its claim (sent ahead) and the instant gives the
        leases back unrun: the other replica runs that instant (a second run, the sweep's)
        and every later one, found by its share's claims and the query."""
        claim = lease.LeaseStore.claim_batch

        def slow_claim(store, names, instant, holder, **kw):  # type: ignore[no-untyped-def]
            won = claim(store, names, instant, holder, **kw)
            clock.sleep(0.05)  # so claims go out ahead of their instant
            return won

        monkeypatch.setattr(lease.LeaseStore, "claim_batch", slow_claim)
        ran = Ran()
        registry = Registry()
        for i in range(4):
            registry.register(ran, "* * * * * *", f"tick-{i}")
        a = replicas(registry, "a")
        clock.advance(3.99)  # the claim of 09:58:04 went out ahead and won
        given = NEAR_HOUR + timedelta(seconds=4)
        assert lease_row(url, "tick-0").instant == given
        assert a.drain()  # the leases go back on its control thread, as cut short
        replicas(registry, "b")
        clock.advance(0)  # b started and swept once: the given-back rounds found
        clock.advance(20)
        ran_at = {
            (name, instant): (attempt, replica) for name, instant, attempt, replica in ran.rounds
        }
        for i in range(4):
            assert ran_at[(f"tick-{i}", given)] == (2, "b")
            later = [ran_at.get((f"tick-{i}", given + timedelta(seconds=s))) for s in range(5, 20)]
            assert later == [(1, "b")] * 15
        assert len(ran.pairs()) == len(set(ran.pairs()))
        row = lease_row(url, "tick-0")
        assert row.instant is not None and row.due == row.instant + timedelta(seconds=1)


class TestStatementsPerInstant:
    """Per replica and instant, the claim path sends its share's claim and one query:
    2 statements on PostgreSQL and SQLite (MariaDB: the claim's UPDATE, its SELECT of
    what it won, the due's UPDATE, the query), whatever the number of jobs."""

    REPLICAS = "abc"

    @pytest.mark.parametrize("count", [100, 300])
    def test_three_replicas_send_a_bounded_number_of_statements_and_only_their_shares_names(
        self, url, replicas, clock, monkeypatch, count
    ):
        traffic = ClaimTraffic()
        ran = Ran()
        registry = jobs(ran, count)
        with traffic.patched(monkeypatch):
            started = [replicas(registry, replica) for replica in self.REPLICAS]
            clock.advance(30)  # views settle before the first minute
            for scheduler, replica in zip(started, self.REPLICAS, strict=True):
                traffic.watch(scheduler, replica)
            clock.advance(5 * 60)  # 09:59 ... 10:03, the hour's 300 jobs included
        instants = sorted({instant for _, instant in traffic.statements})
        assert len(instants) == 5
        bound = 4 if url.startswith("mysql") else 2
        for instant in instants:
            due = count if instant.minute == 0 else count - math.ceil(count / 5)
            share = math.ceil(due / len(self.REPLICAS))
            for replica in self.REPLICAS:
                key = (replica, instant)
                assert traffic.statements[key] <= bound, (key, traffic.statements)
                assert traffic.names[key] <= share, (key, traffic.names[key])
        assert Counter(instant for _, instant in ran.pairs()) == {
            instant: count if instant.minute == 0 else count - math.ceil(count / 5)
            for instant in instants
        }
        assert len(ran.pairs()) == len(set(ran.pairs()))
