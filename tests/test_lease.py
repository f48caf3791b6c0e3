"""The lease rules, with their boundaries, on every database (see lease/_store.py)."""

from __future__ import annotations

import logging
import math
import multiprocessing
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from conftest import DATABASES, PGBOUNCER, START, ManualClock, database_url
from sqlalchemy import event

import lease
import lease._store as lease_store
from tests._helpers import statements

T0 = START
T1 = START + timedelta(minutes=1)
T2 = START + timedelta(minutes=2)
TTL_MS = 15_000


def ms(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


@pytest.fixture(params=[*DATABASES, PGBOUNCER])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each database in turn, and PostgreSQL through PgBouncer in transaction mode."""
    return database_url(request, request.param)


@pytest.fixture
def store(migrated_engine: sa.Engine, manual_clock: ManualClock) -> lease.LeaseStore:
    """A store on the manual clock, claiming any instant it is given (the tests claim
    instants ahead of a frozen clock; the limit has tests of its own)."""
    return lease.LeaseStore(migrated_engine, clock=manual_clock.now, claim_ahead=None)


def lease_statements(engine: sa.Engine) -> AbstractContextManager[list[str]]:
    """Collect the statements sent to the database that touch the lease table."""
    return statements(engine, keep=lambda statement: "cronjob_lease" in statement)


def insert_row(engine: sa.Engine, **values: Any) -> None:
    row = {
        "instant": -1,
        "attempt": 1,
        "state": "new",
        "token": 0,
        "holder": None,
        "expires_ms": None,
        "skipped_through": None,
        "prev_instant": None,
        "prev_state": None,
        "prev_attempt": None,
    } | values
    with engine.begin() as conn:
        conn.execute(sa.insert(lease.metadata.tables["cronjob_lease"]), row)


def cut_short_twice(store: lease.LeaseStore, claim: lease.Claim) -> None:
    """Give ``claim`` (of instant T0) back, run its round a second time on r2 and give
    that back too: a round that already ran twice, each run cut short."""
    store.give_back(claim.name, claim.token)
    rerun = store.claim_rerun(claim.name, T0, "r2")
    assert rerun is not None
    store.give_back(claim.name, rerun.token)


def supersede(store: lease.LeaseStore, claim: lease.Claim) -> lease.Claim:
    """Give ``claim`` back and claim its job's next instant (T1) on r2: the round given
    back is superseded. Returns the new claim."""
    store.give_back(claim.name, claim.token)
    (later,) = store.claim([claim.name], T1, "r2")
    return later


class TestEnsure:
    def test_it_inserts_a_never_claimed_row_per_missing_name(self, store):
        store.ensure(["a", "b"])
        rows = store.read(["a", "b", "c"])
        assert set(rows) == {"a", "b"}
        assert rows["a"] == lease.LeaseRow(
            name="a",
            instant=None,
            attempt=1,
            state=lease.LeaseState.NEW,
            token=0,
            holder=None,
            expires_ms=None,
            skipped_through=None,
            prev_instant=None,
            prev_state=None,
            prev_attempt=None,
            deployed=T0,
        )

    def test_it_leaves_existing_rows_as_they_are(self, store):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        store.ensure(["a", "b"])
        assert store.read(["a"])["a"].token == claim.token
        assert store.read(["a"])["a"].state is lease.LeaseState.RUNNING

    def test_the_first_deployment_never_moves(self, store, manual_clock):
        store.ensure(["a"])
        manual_clock.advance(60)
        store.ensure(["a", "b"])
        store.ensure(["a", "b"], specs={"a": "* * * * *", "b": "* * * * *"})
        rows = store.read(["a", "b"])
        assert (rows["a"].deployed, rows["b"].deployed) == (T0, T1)

    def test_a_row_without_a_deployment_gets_the_first_ensure_that_sees_it(
        self, store, manual_clock
    ):
        """A row an older release wrote (no deployed_ms): this release's next ensure tells
        when it knows the name deployed for sure, with a spec or without."""
        insert_row(store.engine, name="old")
        insert_row(store.engine, name="old-spec")
        insert_row(store.engine, name="ran", instant=60, state="done")
        assert store.read(["old"])["old"].deployed is None
        manual_clock.advance(60)
        store.ensure(["old", "ran"])
        store.ensure(["old-spec"], specs={"old-spec": "0 * * * * *"})
        rows = store.read(["old", "old-spec", "ran"])
        assert [rows[n].deployed for n in ("old", "old-spec", "ran")] == [T1, T1, T1]
        assert rows["ran"].instant == datetime(1970, 1, 1, 0, 1, tzinfo=UTC)  # untouched

    def test_the_first_deployment_is_on_the_database_clock_without_a_given_one(
        self, migrated_engine
    ):
        store = lease.LeaseStore(migrated_engine)
        before = store.now_ms()
        store.ensure(["a"])
        after = store.now_ms()
        deployed = store.read(["a"])["a"].deployed
        assert deployed is not None
        assert before <= ms(deployed) <= after

    def test_it_inserts_many_names_with_one_read_and_one_write_per_batch(self, store):
        names = [f"job-{i}" for i in range(2_000)]
        with lease_statements(store.engine) as statements:
            store.ensure(names)
        batches = math.ceil(2_000 / lease_store.ENSURE_BATCH)
        assert [s.split()[0] for s in statements] == ["SELECT"] + ["INSERT"] * batches
        assert len(store.read(names)) == 2_000

    def test_it_refuses_a_name_that_cannot_be_a_lease(self, store):
        with pytest.raises(ValueError, match=r"^a lease name must be a string of 1 to 200"):
            store.ensure(["x" * 201])
        with pytest.raises(ValueError, match=r"^a lease name must not start or end with"):
            store.ensure(["job "])
        with pytest.raises(TypeError, match=r"^names must be a collection of names"):
            store.ensure("job")


#: Names unusual but storable: every database round-trips them (a 200-character name of
#: 4-byte characters too: MariaDB's utf8mb4 counts characters, not bytes).
STORABLE = [
    "r\u00e9sum\u00e9",
    "clock-\u23f0-\U0001f980",
    "a\x01\x7fb",
    "\ufeffbom",
    "\U0010ffff",
    "\U0001f980" * 200,
]


class TestNamesAndHolders:
    def test_every_storable_name_and_holder_round_trips(self, store):
        store.ensure([*STORABLE, "plain"])
        claims = store.claim([*STORABLE, "plain"], T0, holder="\U0001f980" * 255)
        assert [claim.name for claim in claims] == [*STORABLE, "plain"]
        rows = store.read([*STORABLE, "plain"])
        assert sorted(rows) == sorted([*STORABLE, "plain"])
        assert {row.name for row in rows.values()} == {*STORABLE, "plain"}
        assert {row.holder for row in rows.values()} == {"\U0001f980" * 255}

    @pytest.mark.parametrize(
        ("name", "problem"),
        [
            ("a\x00b", "contains a NUL character at index 1, which PostgreSQL cannot store"),
            (
                "a\udc80b",
                "contains the lone surrogate '\\udc80' at index 1, "
                "which is not valid Unicode and no database can store",
            ),
        ],
        ids=["nul", "surrogate"],
    )
    def test_it_refuses_a_name_some_database_cannot_store(self, store, name, problem):
        """Refused before any statement, on every database: one bad name in the batch
        would otherwise fail the statement that carries all of them."""
        message = f"lease name {name!r} {problem}"
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            store.ensure(["ok", name])
        assert store.read(["ok"]) == {}
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            store.claim(["ok", name], T0, holder="r")

    def test_check_holder_returns_a_storable_holder(self):
        assert lease.check_holder("replica-1") == "replica-1"
        assert lease.check_holder("x" * 255) == "x" * 255

    @pytest.mark.parametrize(
        ("holder", "message"),
        [
            ("", "a holder must be a string of 1 to 255 characters, not ''"),
            (
                "x" * 256,
                "a holder must be a string of 1 to 255 characters, not 'xxxxxxxxxxxxxxxxxxxx"
                "xxxxxxxxxxxxxxxxxxxx'... (256 characters)",
            ),
            (42, "a holder must be a string of 1 to 255 characters, not 42"),
            (
                "r\x00",
                "holder 'r\\x00' contains a NUL character at index 1, "
                "which PostgreSQL cannot store",
            ),
            (
                "r\udc80",
                "holder 'r\\udc80' contains the lone surrogate '\\udc80' at index 1, "
                "which is not valid Unicode and no database can store",
            ),
        ],
        ids=["empty", "too-long", "not-a-string", "nul", "surrogate"],
    )
    def test_check_holder_refuses_what_the_holder_column_cannot_store(self, holder, message):
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            lease.check_holder(holder)


class TestClaim:
    def test_it_claims_a_free_lease_for_the_holder(self, store, manual_clock):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        assert (claim.name, claim.instant, claim.attempt, claim.superseded) == ("a", T0, 1, None)
        assert 0 < claim.token < 2**63
        row = store.read(["a"])["a"]
        assert row.state is lease.LeaseState.RUNNING
        assert (row.instant, row.attempt, row.token, row.holder) == (T0, 1, claim.token, "r1")
        assert row.expires_ms == ms(manual_clock.now()) + TTL_MS
        assert (row.prev_instant, row.prev_state, row.prev_attempt) == (
            None,
            lease.LeaseState.NEW,
            1,
        )

    def test_it_refuses_an_instant_more_than_5_s_past_the_lease_clock(
        self, migrated_engine, manual_clock
    ):
        """A replica whose clock runs an hour ahead must not take instants from the rest."""
        store = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        store.ensure(["a"])
        now = manual_clock.now()
        assert store.claim(["a"], now + timedelta(hours=1), "fast") == []
        assert store.claim(["a"], now + timedelta(seconds=6), "fast") == []
        [claim] = store.claim(["a"], now + timedelta(seconds=lease.CLAIM_AHEAD_LIMIT), "fast")
        assert claim.instant == now + timedelta(seconds=5)

    def test_it_claims_only_names_that_have_a_row(self, store):
        store.ensure(["a"])
        assert [c.name for c in store.claim(["a", "b"], T0, "r1")] == ["a"]

    def test_it_returns_claims_in_the_order_of_names(self, store):
        store.ensure(["a", "b", "c"])
        claims = store.claim(["c", "a", "b"], T0, "r1")
        assert [c.name for c in claims] == ["c", "a", "b"]

    def test_it_refuses_while_the_lease_is_held(self, store, manual_clock):
        store.ensure(["a"])
        store.claim(["a"], T0, "r1")
        manual_clock.advance(14.999)
        assert store.claim(["a"], T1, "r2") == []

    def test_it_refuses_an_instant_not_newer_than_the_recorded_one(self, store):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T1, "r1")
        assert store.finish("a", claim.token, ended=T1)
        assert store.claim(["a"], T1, "r2") == []
        assert store.claim(["a"], T0, "r2") == []
        assert [c.instant for c in store.claim(["a"], T2, "r2")] == [T2]

    def test_it_draws_a_new_token_on_every_claim(self, store):
        store.ensure(["a"])
        tokens = set()
        for minute in range(5):
            (claim,) = store.claim(["a"], T0 + timedelta(minutes=minute), "r1")
            tokens.add(claim.token)
            assert store.finish("a", claim.token, ended=claim.instant)
        assert len(tokens) == 5

    def test_it_is_free_exactly_when_now_reaches_the_expiry(self, store, manual_clock):
        """At now == expires_ms the lease is free; one millisecond earlier it is held."""
        store.ensure(["a"])
        store.claim(["a"], T0, "r1")
        manual_clock.advance(15 - 0.001)
        assert store.claim(["a"], T1, "r2") == []
        manual_clock.advance(0.001)
        assert store.read(["a"])["a"].holder == "r1"
        assert [c.name for c in store.claim(["a"], T1, "r2")] == ["a"]

    def test_a_claim_after_expiry_fences_the_old_holder(self, store, manual_clock):
        store.ensure(["a"])
        (old,) = store.claim(["a"], T0, "r1")
        manual_clock.advance(15)
        (new,) = store.claim(["a"], T1, "r2")
        assert new.token != old.token
        assert store.renew([("a", old.token)], "r1") == set()
        assert store.finish("a", old.token, ended=T1) is False
        assert store.give_back("a", old.token) is False
        with store.engine.begin() as conn:
            assert store.holds(conn, "a", old.token) is False
            assert store.holds(conn, "a", new.token) is True
        row = store.read(["a"])["a"]
        assert (row.holder, row.token, row.state) == ("r2", new.token, lease.LeaseState.RUNNING)

    def test_it_reports_the_unfinished_round_it_supersedes(self, store, manual_clock):
        store.ensure(["given-back", "crashed", "done"])
        claims = {c.name: c for c in store.claim(["given-back", "crashed", "done"], T0, "r1")}
        store.give_back("given-back", claims["given-back"].token)
        store.finish("done", claims["done"].token, ended=T0 + timedelta(seconds=3))
        manual_clock.advance(15)
        superseded = {c.name: c.superseded for c in store.claim(list(claims), T1, "r2")}
        assert superseded == {"given-back": (T0, 1), "crashed": (T0, 1), "done": None}

    def test_a_batch_holds_the_names_won_in_the_order_asked_under_one_token(
        self, store, manual_clock
    ):
        store.ensure(["c", "a", "b", "held"])
        (held,) = store.claim(["held"], T0, "r0")
        first = store.claim_batch(["c", "held", "a", "missing", "b"], T0, "r1")
        assert (first.instant, first.names, first.superseded) == (T0, ("c", "a", "b"), {})
        rows = store.read(["a", "b", "c", "held"])
        assert {rows[n].token for n in "abc"} == {first.token}
        assert rows["held"].token == held.token  # its lease was held: not claimed
        store.give_back("a", first.token)
        manual_clock.advance(15)
        second = store.claim_batch(["a", "b", "c"], T1, "r2")
        assert second.superseded == {"a": (T0, 1), "b": (T0, 1), "c": (T0, 1)}
        assert second.claims() == [
            lease.Claim(name=n, instant=T1, attempt=1, token=second.token, superseded=(T0, 1))
            for n in "abc"
        ]

    def test_an_empty_batch_claims_nothing(self, store):
        store.ensure(["a"])
        nothing = store.claim_batch([], T0, "r1")
        assert (nothing.names, nothing.token, nothing.claims()) == ((), 0, [])

    def test_it_reports_a_superseded_second_run_with_its_attempt(self, store, manual_clock):
        store.ensure(["a"])
        (first,) = store.claim(["a"], T0, "r1")
        store.give_back("a", first.token)
        rerun = store.claim_rerun("a", T0, "r2")
        assert rerun is not None
        manual_clock.advance(15)
        (claim,) = store.claim(["a"], T1, "r3")
        assert claim.superseded == (T0, 2)

    def test_it_refuses_instants_that_are_not_aware_whole_seconds(self, store):
        store.ensure(["a"])
        with pytest.raises(ValueError, match=r"^instant must be an aware datetime"):
            store.claim(["a"], datetime(2026, 1, 1), "r1")
        with pytest.raises(ValueError, match=r"^an instant has whole seconds"):
            store.claim(["a"], T0 + timedelta(milliseconds=5), "r1")
        with pytest.raises(ValueError, match=r"^a holder must be a string of 1 to 255"):
            store.claim(["a"], T0, "")


class TestRenew:
    def test_it_extends_every_held_lease_in_one_statement(self, store, manual_clock):
        names = [f"job-{i}" for i in range(50)]
        store.ensure(names)
        claims = store.claim(names, T0, "r1")
        manual_clock.advance(5)
        with lease_statements(store.engine) as statements:
            renewed = store.renew([(c.name, c.token) for c in claims], "r1")
        assert renewed == set(names)
        # Without UPDATE ... RETURNING (MySQL, MariaDB): the UPDATE, then one SELECT.
        assert len(statements) == (1 if store.engine.dialect.update_returning else 2)
        assert {row.expires_ms for row in store.read(names).values()} == {
            ms(manual_clock.now()) + TTL_MS
        }

    def test_it_renews_a_lease_even_when_the_expiry_does_not_move(self, store):
        """A renewal at the instant of the claim writes the same expiry: still renewed."""
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        assert store.renew([("a", claim.token)], "r1") == {"a"}

    def test_it_keeps_only_the_leases_still_held(self, store, manual_clock):
        store.ensure(["kept", "taken", "stale", "other-holder"])
        claims = {c.name: c for c in store.claim(["kept", "taken", "stale"], T0, "r1")}
        (other,) = store.claim(["other-holder"], T0, "r9")
        store.give_back("taken", claims["taken"].token)
        store.claim(["taken"], T1, "r2")
        held = [(name, claim.token) for name, claim in claims.items()]
        held += [("stale", claims["stale"].token + 1), ("other-holder", other.token)]
        assert store.renew(held, "r1") == {"kept", "stale"}

    def test_it_loses_a_lease_exactly_when_now_reaches_the_expiry(self, store, manual_clock):
        store.ensure(["a", "b"])
        (a,) = store.claim(["a"], T0, "r1")
        manual_clock.advance(1)
        (b,) = store.claim(["b"], T0, "r1")
        manual_clock.advance(14)  # a expires now; b one second later
        assert store.renew([("a", a.token), ("b", b.token)], "r1") == {"b"}

    def test_it_does_not_renew_a_lease_given_back(self, store):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        store.give_back("a", claim.token)
        assert store.renew([("a", claim.token)], "r1") == set()

    def test_it_sends_no_statement_for_nothing(self, store):
        with lease_statements(store.engine) as statements:
            assert store.renew([], "r1") == set()
        assert statements == []


def ended_round(name: str, outcome: str, error: str | None = None) -> lease.RoundRow:
    """The history row of a first round of ``name`` at T0 by r1, ended at T1."""
    return lease.RoundRow(
        name=name,
        instant=T0,
        attempt=1,
        holder="r1",
        why="schedule",
        started=T0,
        ended=T1,
        outcome=outcome,
        error=None if outcome == "succeeded" else error,
    )


class TestGiveBackAndFinish:
    def test_give_back_frees_the_lease_and_marks_the_round_cut(self, store):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        assert store.give_back("a", claim.token) is True
        row = store.read(["a"])["a"]
        assert (row.state, row.expires_ms, row.instant) == (lease.LeaseState.CUT, None, T0)
        assert store.give_back("a", claim.token) is False

    def test_finish_records_the_end_and_frees_the_lease(self, store):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        ended = T0 + timedelta(minutes=2, seconds=5, microseconds=999_999)
        assert store.finish("a", claim.token, ended=ended) is True
        row = store.read(["a"])["a"]
        assert (row.state, row.expires_ms) == (lease.LeaseState.DONE, None)
        assert row.skipped_through == T0 + timedelta(minutes=2, seconds=5)
        assert [c.instant for c in store.claim(["a"], T1, "r2")] == [T1]

    def test_finish_records_the_end_after_expiry_while_no_one_claimed(self, store, manual_clock):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        manual_clock.advance(60)
        assert store.finish("a", claim.token, ended=manual_clock.now()) is True

    def test_a_stale_token_can_neither_finish_nor_give_back(self, store):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        assert store.finish("a", claim.token - 1, ended=T1) is False
        assert store.give_back("a", claim.token + 1) is False
        assert store.read(["a"])["a"].state is lease.LeaseState.RUNNING

    def test_a_round_cut_short_cannot_then_finish(self, store):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        store.give_back("a", claim.token)
        assert store.finish("a", claim.token, ended=T1) is False
        assert store.read(["a"])["a"].state is lease.LeaseState.CUT

    def test_finish_many_records_the_current_tokens_only(self, store, migrated_engine):
        store.ensure(["a", "b", "c"])
        claims = {c.name: c for c in store.claim(["a", "b", "c"], T0, "r1")}
        store.give_back("c", claims["c"].token)  # cut short: no longer finishable
        ends = [
            ("a", claims["a"].token, T0 + timedelta(seconds=3)),
            ("b", claims["b"].token, T0 + timedelta(seconds=4, microseconds=500)),
            ("c", claims["c"].token, T0 + timedelta(seconds=4)),
        ]
        with lease_statements(migrated_engine) as statements:
            written = store.finish_many(ends)
        assert written == {("a", claims["a"].token), ("b", claims["b"].token)}
        rows = store.read(["a", "b", "c"])
        assert rows["a"].skipped_through == T0 + timedelta(seconds=3)
        assert rows["b"].skipped_through == T0 + timedelta(seconds=4)
        assert [rows[n].state for n in "abc"] == [
            lease.LeaseState.DONE,
            lease.LeaseState.DONE,
            lease.LeaseState.CUT,
        ]
        # On PostgreSQL an UPDATE begins with the CTE that locks its rows in name order.
        updates = [s for s in statements if re.search(r"(?i)\bUPDATE\s+cronjob_lease\b", s)]
        assert len(updates) == 2  # one per distinct end second, not one per round

    def test_a_batch_of_ends_with_their_history_is_one_statement_on_postgres(
        self, store, migrated_engine
    ):
        names = ["a", "b", "c"]
        store.ensure(names)
        claims = store.claim(names, T0, "r1")
        ends = [
            lease.Ending(
                name=c.name,
                token=c.token,
                ended=T1,
                succeeded=c.name != "b",
                error=None if c.name != "b" else "Boom: b",
                record=ended_round(c.name, "succeeded" if c.name != "b" else "failed", "Boom: b"),
            )
            for c in claims
        ]
        with statements(migrated_engine, keep=lambda s: "cronjob_" in s) as sent:
            assert store.finish_many(ends) == {(c.name, c.token) for c in claims}
        # Two groups (succeeded, failed): one UPDATE each, after the batch's lock of its
        # rows in name order (not on SQLite), and the history's INSERT: on PostgreSQL
        # each group's rows carried by its UPDATE, elsewhere one statement of its own.
        dialect = migrated_engine.dialect.name
        assert len(sent) == {"postgresql": 3, "sqlite": 3, "mysql": 4}[dialect]
        inserts = [s for s in sent if "INSERT INTO cronjob_round" in s]
        assert len(inserts) == (2 if dialect == "postgresql" else 1)
        assert all(("UPDATE cronjob_lease" in s) == (dialect == "postgresql") for s in inserts)
        for name in names:
            [round_] = store.rounds(name, limit=5)
            assert (round_.instant, round_.ended, round_.holder) == (T0, T1, "r1")
            assert round_.outcome == ("failed" if name == "b" else "succeeded")
        rows = store.read(names)
        assert [rows[n].state for n in names] == [lease.LeaseState.DONE] * 3
        assert rows["b"].failures == 1 and rows["a"].failures == 0

    def test_a_single_end_with_its_history_is_one_statement_on_postgres(
        self, store, migrated_engine
    ):
        store.ensure(["a"])
        [claim] = store.claim(["a"], T0, "r1")
        record = ended_round("a", "succeeded")
        with statements(migrated_engine, keep=lambda s: "cronjob_" in s) as sent:
            assert store.finish("a", claim.token, ended=T1, record=record) is True
        assert len(sent) == (1 if migrated_engine.dialect.name == "postgresql" else 2)
        [round_] = store.rounds("a", limit=5)
        assert (round_.instant, round_.outcome) == (T0, "succeeded")

    def test_finish_many_of_nothing_runs_no_statement(self, store, migrated_engine):
        with lease_statements(migrated_engine) as statements:
            assert store.finish_many([]) == set()
        assert statements == []

    @pytest.mark.parametrize("token", [True, -1, 2**63, 1.0, "7"])
    def test_finish_many_refuses_a_bad_token_before_any_statement(
        self, store, migrated_engine, token
    ):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        ends = [("a", claim.token, T1), ("a", token, T1)]
        with (
            lease_statements(migrated_engine) as statements,
            pytest.raises(ValueError, match=r"^a token must be an integer in \[0, 2\*\*63\)"),
        ):
            store.finish_many(ends)
        assert statements == []
        assert store.read(["a"])["a"].state is lease.LeaseState.RUNNING

    def test_finish_refuses_a_naive_end(self, store):
        with pytest.raises(ValueError, match=r"^ended must be an aware datetime"):
            store.finish("a", 1, ended=datetime(2026, 1, 1))


class TestFindCutShort:
    def test_it_returns_exactly_the_rounds_the_rule_names(self, store, manual_clock):
        names = ["given-back", "crashed", "done", "rerun", "superseded", "never", "live"]
        store.ensure(names)
        claims = {c.name: c for c in store.claim(names[:5], T0, "r1")}
        store.give_back("given-back", claims["given-back"].token)
        store.finish("done", claims["done"].token, ended=T0)
        cut_short_twice(store, claims["rerun"])
        # A round given up when the next instant was claimed, that one then finished.
        later = supersede(store, claims["superseded"])
        store.finish("superseded", later.token, ended=T1)
        manual_clock.advance(15)  # "crashed" expires, running
        (live,) = store.claim(["live"], T1, "r3")
        store.give_back("live", live.token)
        store.claim_rerun("live", T1, "r3")  # held: a second run, still live
        with lease_statements(store.engine) as statements:
            found = store.find_cut_short(names)
        assert found == [
            lease.CutShort(name="crashed", instant=T0),
            lease.CutShort(name="given-back", instant=T0, given_back=True),
        ]
        assert len(statements) == 1

    def test_a_survey_names_the_earliest_expiry_of_a_lease_still_held(self, store, manual_clock):
        store.ensure(["a", "b", "c"])
        store.claim(["a"], T0, "r1")
        manual_clock.advance(5)
        store.claim(["b"], T0, "r1")
        survey = store.survey(["a", "b", "c"])
        assert survey.cut_short == []
        assert survey.next_expiry == T0 + timedelta(seconds=15)
        manual_clock.advance(10)  # a's lease expired: found; b's is the next to expire
        survey = store.survey(["a", "b", "c"])
        assert survey.cut_short == [lease.CutShort(name="a", instant=T0, given_back=False)]
        assert survey.next_expiry == T0 + timedelta(seconds=20)

    def test_watchers_hear_what_each_write_did_to_the_leases(
        self, store, migrated_engine, manual_clock
    ):
        heard: list[lease.LeaseWrite] = []
        other = lease.LeaseStore(migrated_engine, claim_ahead=None)  # another replica's
        stop = other.watch(heard.append)
        store.ensure(["a", "b"])  # new rows hold nothing
        store.read(["a"])  # a read is not a write
        now_ms = round(manual_clock.now().timestamp() * 1000)
        claims = {c.name: c.token for c in store.claim(["a", "b"], T0, "r1")}
        assert store.claim(["a"], T0, "r2") == []  # won nothing: nothing to tell
        assert store.renew([("a", claims["a"])], "r1") == {"a"}
        assert store.finish("a", claims["a"], ended=T0)
        assert store.give_back("b", claims["b"])
        assert not store.give_back("b", claims["b"])  # nothing changed: nothing told
        held, kinds = lease.WriteKind.HELD, [write.kind for write in heard]
        assert kinds == [held, held, lease.WriteKind.RELEASED, lease.WriteKind.GIVEN_BACK]
        claim, renewal, finish, give_back = heard
        assert sorted(claim.leases) == sorted(claims.items())
        assert (claim.expires_ms, claim.instant) == (now_ms + 15_000, int(T0.timestamp()))
        assert (renewal.leases, renewal.instant) == ((("a", claims["a"]),), None)
        assert finish.leases == (("a", claims["a"]),)
        assert give_back.leases == (("b", claims["b"]),)
        stop()
        store.claim(["a"], T1, "r1")
        assert len(heard) == 4

    def test_it_ignores_a_running_round_until_its_lease_expires(self, store, manual_clock):
        """A running round is cut short at now == expires_ms, not a millisecond earlier."""
        store.ensure(["a"])
        store.claim(["a"], T0, "r1")
        manual_clock.advance(15 - 0.001)
        assert store.find_cut_short(["a"]) == []
        manual_clock.advance(0.001)
        assert store.find_cut_short(["a"]) == [lease.CutShort(name="a", instant=T0)]

    def test_it_ignores_a_round_given_back_then_claimed_again(self, store):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        store.give_back("a", claim.token)
        store.claim(["a"], T1, "r2")
        assert store.find_cut_short(["a"]) == []

    def test_it_reads_10000_names_with_one_small_query(self, store):
        names = [f"job-{i}" for i in range(10_000)]
        store.ensure([*names[:3], "not-mine"])
        claims = store.claim([*names[:3], "not-mine"], T0, "r1")
        for claim in claims:
            store.give_back(claim.name, claim.token)
        params: list[int] = []

        def before(conn, cursor, statement, parameters, context, executemany):
            params.append(len(parameters or ()))

        event.listen(store.engine, "before_cursor_execute", before)
        try:
            found = store.find_cut_short(names)
        finally:
            event.remove(store.engine, "before_cursor_execute", before)
        assert [cut.name for cut in found] == ["job-0", "job-1", "job-2"]
        assert max(params) < 100


class TestClaimRerun:
    def test_it_claims_the_second_run_of_a_round_given_back(self, store):
        store.ensure(["a"])
        (first,) = store.claim(["a"], T0, "r1")
        store.give_back("a", first.token)
        rerun = store.claim_rerun("a", T0, "r2")
        assert rerun == lease.Claim(name="a", instant=T0, attempt=2, token=rerun.token)
        assert rerun.token != first.token
        row = store.read(["a"])["a"]
        assert (row.attempt, row.state, row.holder) == (2, lease.LeaseState.RUNNING, "r2")
        assert store.finish("a", first.token, ended=T1) is False

    def test_it_claims_the_second_run_of_a_round_whose_lease_expired(self, store, manual_clock):
        store.ensure(["a"])
        (first,) = store.claim(["a"], T0, "r1")
        assert store.claim_rerun("a", T0, "r2") is None  # still held
        manual_clock.advance(15)
        rerun = store.claim_rerun("a", T0, "r2")
        assert rerun is not None
        assert store.renew([("a", first.token)], "r1") == set()

    def test_its_second_runs_report_the_round_its_first_claim_gave_up(self, store):
        """The row keeps what the instant's first claim gave up through its second runs,
        each handed back unrun: a hand-off's second run owes what that claim owed."""
        store.ensure(["a"])
        (first,) = store.claim(["a"], T0, "r1")
        later = supersede(store, first)
        assert later.superseded == (T0, 1)
        store.give_back_all(["a"], later.token)
        rerun = store.claim_rerun("a", T1, "r3")
        assert rerun is not None and rerun.superseded == (T0, 1)
        store.give_back_all(["a"], rerun.token)
        again = store.claim_reruns(["a"], T1, "r4")
        assert (again.names, again.superseded) == (("a",), {"a": (T0, 1)})
        row = store.read(["a"])["a"]
        assert (row.instant, row.attempt, row.prev_instant, row.prev_state) == (
            T1,
            2,
            T0,
            lease.LeaseState.CUT,
        )

    def test_it_refuses_what_the_rule_refuses(self, store):
        store.ensure(["done", "twice", "superseded", "never"])
        claims = {c.name: c for c in store.claim(["done", "twice", "superseded"], T0, "r1")}
        store.finish("done", claims["done"].token, ended=T0)
        cut_short_twice(store, claims["twice"])
        supersede(store, claims["superseded"])
        assert store.claim_rerun("done", T0, "r3") is None
        assert store.claim_rerun("twice", T0, "r3") is None
        assert store.claim_rerun("superseded", T0, "r3") is None
        assert store.claim_rerun("never", T0, "r3") is None

    def test_many_are_claimed_in_one_statement_under_one_token(self, store):
        names = ["done", "twice", "a", "b", "c", "other-instant"]
        store.ensure(names)
        claims = {c.name: c for c in store.claim(names[:-1], T0, "r1")}
        store.claim(["other-instant"], T1, "r1")
        store.finish("done", claims["done"].token, ended=T0)
        cut_short_twice(store, claims["twice"])
        store.give_back_all(["a", "b", "c"], claims["a"].token)
        with lease_statements(store.engine) as seen:
            batch = store.claim_reruns(["c", "done", "twice", "a", "other-instant"], T0, "r2")
        assert len([s for s in seen if s.startswith("UPDATE")]) == 1
        assert (batch.names, batch.attempt, batch.superseded) == (("c", "a"), 2, {})
        assert [claim.attempt for claim in batch.claims()] == [2, 2]
        rows = store.read(["a", "b", "c"])
        assert {name: (row.attempt, row.state, row.holder) for name, row in rows.items()} == {
            "a": (2, lease.LeaseState.RUNNING, "r2"),
            "b": (1, lease.LeaseState.CUT, "r1"),
            "c": (2, lease.LeaseState.RUNNING, "r2"),
        }
        assert {rows["a"].token, rows["c"].token} == {batch.token}
        assert store.claim_reruns([], T0, "r2").names == ()

    def test_ends_not_on_record_add_no_history_row(self, store, manual_clock):
        """r1's lease expired and r2 took the second run: r1's ends write nothing, and so
        no history row either (finish_many, give_back with a record, a manual end)."""
        store.ensure(["a", "b"])
        first = {c.name: c for c in store.claim(["a", "b"], T0, "r1")}
        manual_clock.advance(15)
        batch = store.claim_reruns(["a", "b"], T0, "r2")
        assert batch.names == ("a", "b")
        ends = [
            lease.Ending(
                name=name,
                token=first[name].token,
                ended=T1,
                record=ended_round(name, "succeeded"),
            )
            for name in ("a", "b")
        ]
        assert store.finish_many(ends) == set()
        assert store.give_back("a", first["a"].token, record=ended_round("a", "cut short")) is False
        assert store.rounds("a", limit=5) == [] and store.rounds("b", limit=5) == []
        rows = store.read(["a", "b"])
        assert {name: (row.holder, row.attempt) for name, row in rows.items()} == {
            "a": ("r2", 2),
            "b": ("r2", 2),
        }

    def test_a_batch_partly_on_record_adds_the_history_rows_of_those_ends_only(
        self, store, manual_clock
    ):
        store.ensure(["a", "b", "c"])
        first = {c.name: c for c in store.claim(["a", "b", "c"], T0, "r1")}
        manual_clock.advance(15)
        store.claim_reruns(["b"], T0, "r2")  # b's second run: r1's token no longer holds it
        ends = [
            lease.Ending(
                name=name,
                token=first[name].token,
                ended=T1,
                succeeded=name != "c",
                error=None if name != "c" else "Boom: c",
                record=ended_round(name, "succeeded" if name != "c" else "failed", "Boom: c"),
            )
            for name in ("a", "b", "c")
        ]
        recorded = store.finish_many(ends)
        assert recorded == {("a", first["a"].token), ("c", first["c"].token)}
        assert [r.outcome for r in store.rounds("a", limit=5)] == ["succeeded"]
        assert store.rounds("b", limit=5) == []
        assert [r.outcome for r in store.rounds("c", limit=5)] == ["failed"]

    def test_a_holding_end_is_on_record_and_keeps_the_lease(self, store, manual_clock):
        """A round whose job outlived its timeout: its outcome, failure and history row
        are on record, its lease stays held, and it is never run a second time."""
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        expires_ms = store.read(["a"])["a"].expires_ms
        ending = lease.Ending(
            name="a",
            token=claim.token,
            ended=T0 + timedelta(seconds=15),
            succeeded=False,
            error="TimedOut: past 10 s",
            outcome="timed_out",
            record=ended_round("a", "timed_out", "TimedOut: past 10 s"),
            holding=True,
        )
        assert store.finish_many([ending]) == {("a", claim.token)}
        row = store.read(["a"])["a"]
        assert (row.state, row.holder, row.token, row.attempt) == (
            lease.LeaseState.RUNNING,
            "r1",
            claim.token,
            2,
        )
        assert row.expires_ms == expires_ms is not None
        assert (row.last_outcome, row.last_error, row.failures) == (
            "timed_out",
            "TimedOut: past 10 s",
            1,
        )
        assert [r.outcome for r in store.rounds("a", limit=5)] == ["timed_out"]
        assert store.claim(["a"], T1, "r2") == []  # held until it expires
        manual_clock.advance(15)
        assert store.claim_rerun("a", T0, "r2") is None  # never a second run
        assert [c.name for c in store.claim(["a"], T1, "r2")] == ["a"]


class TestGiveBackAll:
    def test_it_gives_back_the_running_rounds_of_the_token_in_one_statement(self, store):
        store.ensure(["a", "b", "c", "d"])
        first = {c.name: c for c in store.claim(["a", "b", "c"], T0, "r1")}
        (other,) = store.claim(["d"], T0, "r2")
        store.finish("c", first["c"].token, ended=T0)
        with lease_statements(store.engine) as seen:
            given = store.give_back_all(["a", "b", "c", "d"], first["a"].token)
        assert len([s for s in seen if s.startswith(("UPDATE", "WITH"))]) == 1
        assert given == 2  # c ended already; d is another claim's
        rows = store.read(["a", "b", "c", "d"])
        assert {name: row.state for name, row in rows.items()} == {
            "a": lease.LeaseState.CUT,
            "b": lease.LeaseState.CUT,
            "c": lease.LeaseState.DONE,
            "d": lease.LeaseState.RUNNING,
        }
        assert rows["a"].expires_ms is None and rows["d"].token == other.token
        assert store.give_back_all([], first["a"].token) == 0

    def test_a_second_run_handed_back_unrun_stays_owed(self, store, manual_clock):
        """A second run claimed, then handed back before it started (a drain, a claim
        that came back too late): cut short at attempt 1, not given up, so a sweep
        claims it again; a first run handed back the same way reads the same."""
        store.ensure(["a", "b"])
        store.claim(["a", "b"], T0, "r1")
        manual_clock.advance(15)  # r1 died: both leases expired
        rerun = store.claim_reruns(["a"], T0, "r2")
        assert store.give_back_all(["a"], rerun.token) == 1
        row = store.read(["a"])["a"]
        assert (row.state, row.attempt, row.last_outcome, row.failures) == (
            lease.LeaseState.CUT,
            1,
            "cut short",
            0,
        )
        found = store.survey(["a", "b"]).cut_short
        assert [(c.name, c.instant, c.given_back) for c in found] == [
            ("a", T0, True),
            ("b", T0, False),
        ]
        again = store.claim_reruns(["a", "b"], T0, "r3")
        assert (again.names, again.attempt) == (("a", "b"), 2)


class TestHolds:
    def test_it_tells_whether_the_token_still_holds_the_lease(self, store, manual_clock):
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        with store.engine.begin() as conn:
            assert store.holds(conn, "a", claim.token) is True
            assert store.holds(conn, "a", claim.token + 1) is False
        manual_clock.advance(15)  # now == expires_ms: no longer held
        with store.engine.begin() as conn:
            assert store.holds(conn, "a", claim.token) is False


class TestHolders:
    def test_it_names_each_holder_with_its_latest_claim_since_the_bound(self, store, manual_clock):
        store.ensure(["a", "b", "c", "d"])
        store.claim(["a"], T0, "r1")
        manual_clock.advance(60)
        store.claim(["b"], T1, "r1")
        store.claim(["c"], T1, "r2")
        store.claim(["d"], T0, "r3")
        assert store.holders(T1) == {"r1": T1, "r2": T1}  # at the bound: counted
        assert store.holders(T0) == {"r1": T1, "r2": T1, "r3": T0}
        assert store.holders(T2) == {}

    def test_a_holder_whose_rows_were_claimed_again_is_gone(self, store, manual_clock):
        store.ensure(["a"])
        [claim] = store.claim(["a"], T0, "r1")
        store.finish("a", claim.token, ended=T0)
        manual_clock.advance(60)
        store.claim(["a"], T1, "r2")
        assert store.holders(T0) == {"r2": T1}

    def test_rows_never_claimed_have_no_holder(self, store):
        store.ensure(["a"])
        assert store.holders(datetime(1970, 1, 1, tzinfo=UTC)) == {}


class TestRead:
    def test_it_logs_and_skips_malformed_rows(self, store, caplog):
        engine = store.engine
        insert_row(engine, name="bad-state", instant=60, state="garbage")
        insert_row(engine, name="bad-attempt", instant=60, state="running", attempt=7)
        insert_row(engine, name="bad-instant", instant=-5, state="running")
        insert_row(engine, name="never-but-running", state="running")
        insert_row(engine, name="bad-prev", instant=60, state="done", prev_state="garbage")
        insert_row(engine, name="bad-token", instant=60, state="done", token=-3)
        insert_row(engine, name="bad-deployed", deployed_ms=-1)
        insert_row(engine, name="edited ", instant=60, state="done")
        store.ensure(["fine"])
        names = [
            "bad-state",
            "bad-attempt",
            "bad-instant",
            "never-but-running",
            "bad-prev",
            "bad-token",
            "bad-deployed",
            "edited",
            "fine",
        ]
        with caplog.at_level(logging.WARNING, logger="lease"):
            rows = store.read(names)
        assert list(rows) == ["fine"]
        logged = caplog.text
        for name in names[:7]:
            assert f"lease row {name!r} is malformed" in logged
        assert "lease row 'bad-deployed' is malformed (deployed_ms -1)" in logged
        # The other operations carry on around them.
        assert [c.name for c in store.claim(["fine"], T0, "r1")] == ["fine"]
        assert store.find_cut_short(names) == []

    def test_it_skips_a_value_of_the_wrong_type(self, sqlite_url, manual_clock, caplog):
        """SQLite stores what it is given: text in an integer column must not crash."""
        engine = lease.create_engine(sqlite_url)
        lease.migrate(engine)
        store = lease.LeaseStore(engine, clock=manual_clock.now)
        insert_row(engine, name="text-token", instant=60, state="done", token="abc")
        with caplog.at_level(logging.WARNING, logger="lease"):
            assert store.read(["text-token"]) == {}
        assert "lease row 'text-token' is malformed (token 'abc')" in caplog.text
        insert_row(engine, name="text-deployed", deployed_ms="yesterday")
        with caplog.at_level(logging.WARNING, logger="lease"):
            assert store.read(["text-deployed"]) == {}
        assert "lease row 'text-deployed' is malformed (deployed_ms 'yesterday')" in caplog.text
        engine.dispose()


class TestDatabaseClock:
    def test_the_database_clock_agrees_with_the_wall_clock(self, migrated_engine):
        store = lease.LeaseStore(migrated_engine)
        before = ms(datetime.now(UTC))
        now = store.now_ms()
        after = ms(datetime.now(UTC))
        # The servers run on this machine: same clock, within the round trip.
        assert before - 1_000 <= now <= after + 1_000

    def test_leases_follow_the_database_clock(self, migrated_engine):
        store = lease.LeaseStore(migrated_engine, ttl=30)
        store.ensure(["a"])
        (claim,) = store.claim(["a"], T0, "r1")
        expires = store.read(["a"])["a"].expires_ms
        assert expires is not None
        assert 0 < expires - store.now_ms() <= 30_000
        assert store.claim(["a"], T1, "r2") == []
        assert store.renew([("a", claim.token)], "r1") == {"a"}
        assert store.find_cut_short(["a"]) == []
        assert store.give_back("a", claim.token)
        cut = lease.CutShort(name="a", instant=T0, given_back=True)
        assert store.find_cut_short(["a"]) == [cut]

    def test_a_store_refuses_a_ttl_that_is_not_positive(self, migrated_engine):
        with pytest.raises(ValueError, match=r"^ttl must be a positive number of seconds"):
            lease.LeaseStore(migrated_engine, ttl=0)


# -- races -------------------------------------------------------------------------

ROUNDS = 10


def _race(store: lease.LeaseStore, holder: str, wait: Any) -> list[tuple[int, int]]:
    """Claim ROUNDS instants of one name; return (round, token) for each one won."""
    won = []
    for i in range(ROUNDS):
        wait()
        for claim in store.claim(["raced"], T0 + timedelta(minutes=i), holder):
            won.append((i, claim.token))
            assert store.finish("raced", claim.token, ended=claim.instant)
    return won


def _race_in_process(url: str, now: datetime, holder: str, barrier: Any, results: Any) -> None:
    engine = lease.create_engine(url)
    try:
        store = lease.LeaseStore(engine, clock=lambda: now, claim_ahead=None)
        results.put((holder, _race(store, holder, barrier.wait)))
    except BaseException as exc:
        results.put((holder, repr(exc)))
        raise
    finally:
        engine.dispose()


def _assert_one_winner_per_round(won: list[tuple[int, int]]) -> None:
    assert sorted(i for i, _ in won) == list(range(ROUNDS))
    assert len({token for _, token in won}) == ROUNDS


class TestRaces:
    def test_threads_racing_one_claim_have_exactly_one_winner(self, store):
        store.ensure(["raced"])
        threads = 8
        barrier = threading.Barrier(threads)
        won: list[tuple[int, int]] = []
        errors: list[BaseException] = []

        def run(k: int) -> None:
            try:
                won.extend(_race(store, f"thread-{k}", barrier.wait))
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)
                barrier.abort()

        workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
        assert errors == []
        _assert_one_winner_per_round(won)

    def test_processes_racing_one_claim_have_exactly_one_winner(self, store, db_url):
        store.ensure(["raced"])
        processes = 4
        spawn = multiprocessing.get_context("spawn")
        barrier = spawn.Barrier(processes)
        results = spawn.Queue()
        workers = [
            spawn.Process(
                target=_race_in_process,
                args=(db_url, START, f"process-{k}", barrier, results),
            )
            for k in range(processes)
        ]
        for worker in workers:
            worker.start()
        outcomes = dict(results.get(timeout=120) for _ in workers)
        for worker in workers:
            worker.join(timeout=60)
        assert all(isinstance(won, list) for won in outcomes.values()), outcomes
        _assert_one_winner_per_round([w for won in outcomes.values() for w in won])


@pytest.fixture(params=[*DATABASES[1:], PGBOUNCER])
def server_url(request: pytest.FixtureRequest) -> str:
    """Each server database in turn, without the lease tables."""
    return database_url(request, request.param)


@contextmanager
def blocked(url: str, statement: str) -> Iterator[None]:
    """Hold a lock from another session (``statement``) until the block ends."""
    engine = lease.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.begin()
            conn.exec_driver_sql(statement)
            try:
                yield
            finally:
                if conn.dialect.name != "postgresql":
                    conn.exec_driver_sql("UNLOCK TABLES")
                conn.rollback()
    finally:
        engine.dispose()


def outcome_of(operation: Callable[[], object], *, within: float = 60) -> object:
    """Run ``operation`` in a thread and return what it returned or raised.

    If it is still running after ``within`` seconds (real time), return the string
    "still running": the caller then releases the lock and the thread ends.
    """
    result: list[object] = []

    def run() -> None:
        try:
            result.append(operation())
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=within)
    return result[0] if result else "still running"


#: How a statement that gave up reads, after its operation's name, by dialect.
GAVE_UP = {
    "postgresql": "QueryCanceled: canceling statement due to statement timeout",
    "mysql": "OperationalError: (1205, 'Lock wait timeout exceeded; try restarting transaction')",
}


class TestStatementBound:
    """A lease statement stuck behind a lock gives up after the store's bound, with the
    error the scheduler treats as an unavailable database, instead of holding the
    scheduler's control thread forever; a job's own statements are never bounded."""

    ROW_OPERATIONS: ClassVar[dict[str, tuple[str, str]]] = {
        # what the row is set up as, and what the operation's error message starts with
        "claim": ("cut", "claim leases"),
        "claim_rerun": ("cut", "claim a second run"),
        "claim_reruns": ("cut", "claim a second run"),
        "renew": ("running", "renew leases"),
        "give_back": ("running", "give back a lease"),
        "give_back_all": ("running", "give back leases"),
        "finish": ("running", "finish a lease"),
        "finish_many": ("running", "finish leases"),
    }

    @staticmethod
    def run(store: lease.LeaseStore, operation: str, token: int) -> object:
        now = datetime.now(UTC)
        return {
            "claim": lambda: store.claim(["a"], T1, "r1"),
            "claim_rerun": lambda: store.claim_rerun("a", T0, "r1"),
            "claim_reruns": lambda: store.claim_reruns(["a"], T0, "r1"),
            "renew": lambda: store.renew([("a", token)], "r1"),
            "give_back": lambda: store.give_back("a", token),
            "give_back_all": lambda: store.give_back_all(["a"], token),
            "finish": lambda: store.finish("a", token, ended=now),
            "finish_many": lambda: store.finish_many([("a", token, now)]),
            "ensure": lambda: store.ensure(["a"]),
            "read": lambda: store.read(["a"]),
            "find_cut_short": lambda: store.find_cut_short(["a"]),
        }[operation]()

    @pytest.mark.parametrize("operation", sorted(ROW_OPERATIONS))
    def test_a_statement_behind_a_row_lock_gives_up(self, server_url, operation):
        engine = lease.create_engine(server_url)
        try:
            lease.migrate(engine)
            store = lease.LeaseStore(engine, ttl=3600, statement_timeout=1.0)
            store.ensure(["a"])
            (claim,) = store.claim(["a"], T0, "r1")
            state, what = self.ROW_OPERATIONS[operation]
            if state == "cut":
                store.give_back("a", claim.token)
            lock = "SELECT * FROM cronjob_lease WHERE name = 'a' FOR UPDATE"
            with blocked(server_url, lock):
                outcome = outcome_of(lambda: self.run(store, operation, claim.token))
            assert isinstance(outcome, lease.DatabaseUnavailable), outcome
            assert str(outcome).startswith(f"{what}: {GAVE_UP[engine.dialect.name]}"), outcome
            # Nothing was written; once the lock is gone, the same operation succeeds.
            assert store.read(["a"])["a"].token == claim.token
            assert self.run(store, operation, claim.token)
        finally:
            engine.dispose()

    @pytest.mark.parametrize(
        ("operation", "what"),
        [
            ("ensure", "ensure leases"),
            ("read", "read leases"),
            ("find_cut_short", "find rounds cut short"),
        ],
    )
    def test_a_statement_behind_a_table_lock_gives_up(self, server_url, operation, what):
        engine = lease.create_engine(server_url)
        try:
            lease.migrate(engine)
            store = lease.LeaseStore(engine, statement_timeout=1.0)
            store.ensure(["a"])
            lock = (
                "LOCK TABLE cronjob_lease IN ACCESS EXCLUSIVE MODE"
                if engine.dialect.name == "postgresql"
                else "LOCK TABLES cronjob_lease WRITE"
            )
            with blocked(server_url, lock):
                outcome = outcome_of(lambda: self.run(store, operation, 0))
            assert isinstance(outcome, lease.DatabaseUnavailable), outcome
            assert str(outcome).startswith(f"{what}: {GAVE_UP[engine.dialect.name]}"), outcome
        finally:
            engine.dispose()

    def test_the_bound_never_outlives_the_store_s_own_transaction(self, server_url):
        """A job's transaction on the same pooled connection keeps the session's own
        settings, after store operations that succeeded, failed, or checked a lease."""
        engine = lease.create_engine(server_url, pool_size=1, max_overflow=0)
        if engine.dialect.name == "postgresql":
            settings = (
                "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
            )
        else:
            settings = (
                "SELECT @@SESSION.max_statement_time, @@SESSION.innodb_lock_wait_timeout,"
                " @@SESSION.lock_wait_timeout"
            )
        try:
            lease.migrate(engine)
            with engine.connect() as conn:
                before = tuple(conn.exec_driver_sql(settings).one())
            store = lease.LeaseStore(engine, ttl=3600, statement_timeout=1.0)
            store.ensure(["a"])
            (claim,) = store.claim(["a"], T0, "r1")
            store.renew([("a", claim.token)], "r1")
            store.read(["a"])
            with blocked(server_url, "SELECT * FROM cronjob_lease WHERE name = 'a' FOR UPDATE"):
                assert isinstance(
                    outcome_of(lambda: store.renew([("a", claim.token)], "r1")),
                    lease.DatabaseUnavailable,
                )
            with engine.begin() as conn:  # as ctx.transaction() does
                assert store.holds(conn, "a", claim.token)
                assert tuple(conn.exec_driver_sql(settings).one()) == before
            with engine.connect() as conn:
                assert tuple(conn.exec_driver_sql(settings).one()) == before
            # The one connection, handed back to the store, is bounded again.
            with blocked(server_url, "SELECT * FROM cronjob_lease WHERE name = 'a' FOR UPDATE"):
                assert isinstance(
                    outcome_of(lambda: store.renew([("a", claim.token)], "r1")),
                    lease.DatabaseUnavailable,
                )
            with engine.connect() as conn:
                assert tuple(conn.exec_driver_sql(settings).one()) == before
        finally:
            engine.dispose()

    def test_the_default_bound_and_its_refusals(self, migrated_engine):
        assert lease.DEFAULT_STATEMENT_TIMEOUT == 5.0
        assert lease.LeaseStore(migrated_engine).statement_timeout == 5.0
        assert lease.LeaseStore(migrated_engine, statement_timeout=0.25).statement_timeout == 0.25
        for bad in (0, -1.0, float("inf"), float("nan")):
            with pytest.raises(
                ValueError,
                match=rf"^statement_timeout must be a positive number of seconds, not {bad!r}$",
            ):
                lease.LeaseStore(migrated_engine, statement_timeout=bad)


class TestErrors:
    TABLE_OPERATIONS: ClassVar[dict[str, Callable[[lease.LeaseStore], object]]] = {
        "ensure": lambda s: s.ensure(["a"]),
        "read": lambda s: s.read(["a"]),
        "claim": lambda s: s.claim(["a"], T0, "r1"),
        "claim_rerun": lambda s: s.claim_rerun("a", T0, "r1"),
        "renew": lambda s: s.renew([("a", 1)], "r1"),
        "give_back": lambda s: s.give_back("a", 1),
        "finish": lambda s: s.finish("a", 1, ended=T0),
        "find_cut_short": lambda s: s.find_cut_short(["a"]),
    }
    OPERATIONS: ClassVar[dict[str, Callable[[lease.LeaseStore], object]]] = TABLE_OPERATIONS | {
        "now_ms": lambda s: s.now_ms()
    }

    @pytest.mark.blank_database
    @pytest.mark.parametrize("operation", sorted(TABLE_OPERATIONS))
    def test_no_sqlalchemy_error_escapes_a_missing_table(self, db_engine, operation):
        store = lease.LeaseStore(db_engine)
        with pytest.raises(lease.LeaseError) as caught:
            self.TABLE_OPERATIONS[operation](store)
        assert isinstance(caught.value.__cause__, sa.exc.SQLAlchemyError)

    @pytest.mark.parametrize("operation", sorted(OPERATIONS))
    def test_an_unreachable_database_raises_database_unavailable(self, operation):
        # Nothing listens on port 1 of the loopback: the connection is refused at once.
        engine = lease.create_engine("postgresql+psycopg://postgres:secret@127.0.0.1:1/test")
        store = lease.LeaseStore(engine)
        with pytest.raises(lease.DatabaseUnavailable) as caught:
            self.OPERATIONS[operation](store)
        assert isinstance(caught.value.__cause__, sa.exc.OperationalError)
        assert isinstance(caught.value, ConnectionError)
        assert "secret" not in str(caught.value)
        engine.dispose()

    @pytest.mark.blank_database
    def test_holds_translates_errors_too(self, db_engine):
        store = lease.LeaseStore(db_engine)
        with pytest.raises(lease.LeaseError), db_engine.connect() as conn:
            store.holds(conn, "a", 1)

    def test_an_unsupported_dialect_is_refused(self):
        from sqlalchemy.dialects.mssql.base import MSDialect

        message = (
            r"^the 'mssql' database cannot carry leases; "
            r"supported are PostgreSQL, MySQL/MariaDB and SQLite$"
        )
        with pytest.raises(lease.UnsupportedDatabase, match=message):
            lease.check_dialect(MSDialect())
        engine = sa.create_mock_engine("oracle://", executor=lambda *a, **k: None)
        with pytest.raises(lease.UnsupportedDatabase, match=r"^the 'oracle' database"):
            lease.LeaseStore(engine)  # type: ignore[arg-type]
        with pytest.raises(lease.UnsupportedDatabase):
            lease.migrate(engine)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "url", ["sqlite:///jobs.sqlite", "postgresql+psycopg://x@h/d", "mysql+pymysql://x@h/d"]
    )
    def test_supported_dialects_pass(self, url):
        lease.check_dialect(sa.create_engine(url))


class TestAddRounds:
    def test_it_adds_history_rows_without_touching_the_lease_row(self, store):
        """A round given up whose lease is no longer its own still goes on record."""
        at = datetime(2026, 3, 2, 9, 1, tzinfo=UTC)
        row = lease.RoundRow(
            name="job",
            instant=at,
            attempt=2,
            holder="a",
            why="retry",
            started=at,
            ended=at,
            outcome="given up",
            error="retry given up: x",
        )
        store.add_rounds([])
        store.add_rounds([row])
        assert store.rounds("job", limit=5) == [row]
        assert store.read(["job"]) == {}
