"""``LeaseStore.ensure`` reads first and writes only the rows it changes (issue #31: R
replicas starting together wrote every row R times), on every database.

The names written are those of the upsert's parameter sets, seen with a ``before_execute``
listener; the statements with ``before_cursor_execute`` (the helper of tests/_helpers.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import START, ManualClock
from sqlalchemy import event

import lease
import lease._store as lease_store
from lease._core import _IN_LIST_LIMIT
from tests._helpers import statements

T0 = START
T1 = START + timedelta(minutes=1)
T2 = START + timedelta(minutes=2)
EVERY = "0 * * * * *"
HOURLY = "0 0 * * * *"
_t = lease.metadata.tables["cronjob_lease"]


@pytest.fixture
def store(migrated_engine: sa.Engine, manual_clock: ManualClock) -> lease.LeaseStore:
    return lease.LeaseStore(migrated_engine, clock=manual_clock.now, claim_ahead=None)


@contextmanager
def written(engine: sa.Engine) -> Iterator[list[str]]:
    """The names of the rows the lease table's INSERTs (ensure's upsert) were sent for,
    in the order sent, while the block runs."""
    names: list[str] = []

    def before(conn: Any, clause: Any, multiparams: Any, params: Any, options: Any) -> None:
        if isinstance(clause, sa.Insert) and clause.table is _t:
            sets = multiparams or [params]
            names.extend(row["name"] for row in sets)

    event.listen(engine, "before_execute", before)
    try:
        yield names
    finally:
        event.remove(engine, "before_execute", before)


def lease_statements(engine: sa.Engine) -> Any:
    return statements(engine, keep=lambda statement: "cronjob_lease" in statement)


def set_column(engine: sa.Engine, name: str, **values: Any) -> None:
    with engine.begin() as conn:
        conn.execute(sa.update(_t).where(_t.c.name == name).values(**values))


def column(engine: sa.Engine, name: str, col: str) -> Any:
    with engine.begin() as conn:
        return conn.execute(sa.select(_t.c[col]).where(_t.c.name == name)).scalar_one()


class TestNothingChanged:
    def test_a_second_ensure_with_nothing_changed_only_reads(self, store):
        names = ["a", "b", "c"]
        specs = {"a": EVERY, "b": HOURLY, "c": EVERY}
        due = {"a": T1, "b": T2, "c": None}
        store.ensure(names, specs=specs, due=due)
        with lease_statements(store.engine) as sent, written(store.engine) as names_written:
            store.ensure(names, specs=specs, due=due)
            store.ensure(names)  # no specs, no due: every row on record, deployed
            store.ensure(names, due={"a": T2})  # later than on record: never raised
        assert names_written == []
        assert [statement.split()[0] for statement in sent] == ["SELECT"] * 3, sent

    def test_beyond_the_in_list_limit_it_reads_the_table_and_writes_nothing(self, store):
        names = [f"job-{i}" for i in range(_IN_LIST_LIMIT + 100)]
        store.take_turn("chore", T0, "r")  # rows not asked for, read and left alone
        store.ensure(["other"])
        store.ensure(names, specs=dict.fromkeys(names, EVERY), due=dict.fromkeys(names, T1))
        with lease_statements(store.engine) as sent, written(store.engine) as names_written:
            store.ensure(names, specs=dict.fromkeys(names, EVERY), due=dict.fromkeys(names, T1))
        assert names_written == []
        assert len(sent) == 1 and " IN " not in sent[0], sent


class TestOnlyWhatChanges:
    def test_a_changed_spec_a_lowered_due_a_missing_row_and_no_deployment_are_written(
        self, store, manual_clock
    ):
        names = ["spec", "sooner", "missing", "undeployed", "later", "same"]
        specs = dict.fromkeys(names, EVERY)
        store.ensure(names, specs=specs, due=dict.fromkeys(names, T1))
        with store.engine.begin() as conn:
            conn.execute(sa.delete(_t).where(_t.c.name == "missing"))
        set_column(store.engine, "undeployed", deployed_ms=None)
        manual_clock.advance(60)
        specs["spec"] = HOURLY
        due = dict.fromkeys(names, T1) | {"sooner": T0, "later": T2}
        with written(store.engine) as names_written:
            store.ensure(names, specs=specs, due=due)
        assert sorted(names_written) == ["missing", "sooner", "spec", "undeployed"]
        rows = store.read(names)
        assert rows["spec"].spec == HOURLY
        assert [rows[name].due for name in names] == [T1, T0, T1, T1, T1, T1]
        deployed = [rows[name].deployed for name in names]
        assert deployed == [T0, T0, T1, T1, T0, T0]

    def test_without_specs_or_due_only_missing_and_undeployed_rows_are_written(self, store):
        store.ensure(["a", "b", "c"], specs={"a": EVERY, "b": EVERY, "c": EVERY})
        set_column(store.engine, "b", deployed_ms=None)
        with written(store.engine) as names_written:
            store.ensure(["a", "b", "c", "d"])
        assert sorted(names_written) == ["b", "d"]
        assert store.read(["a"])["a"].spec == EVERY  # no specs given: the spec stays

    def test_a_name_the_specs_leave_out_has_its_spec_cleared_as_before(self, store):
        """The latest caller's specs win, a name they leave out included (NULL)."""
        store.ensure(["a", "b"], specs={"a": EVERY, "b": EVERY})
        with written(store.engine) as names_written:
            store.ensure(["a", "b"], specs={"a": EVERY})
        assert names_written == ["b"]
        assert store.read(["b"])["b"].spec is None

    def test_a_due_on_record_that_is_not_a_number_is_written_over(self, sqlite_url):
        """A hand edit (SQLite alone keeps a text in an integer column): the read cannot
        compare it, so the upsert's own conditions decide."""
        engine = lease.create_engine(sqlite_url)
        lease.migrate(engine)
        store = lease.LeaseStore(engine, claim_ahead=None)
        store.ensure(["a"], due={"a": T1})
        set_column(store.engine, "a", due_s="soon")
        with written(store.engine) as names_written:
            store.ensure(["a"], due={"a": T1})
        assert names_written == ["a"]
        engine.dispose()


class TestBatches:
    def test_many_names_are_written_in_name_order_one_transaction_per_batch(self, store):
        """Replicas that start together on a new table take the rows' locks in one order
        and each holds them for one batch: no deadlock, no wait past the bound."""
        names = [f"job-{i:05d}" for i in range(2 * lease_store.ENSURE_BATCH + 500)][::-1]
        batches: list[list[str]] = []
        begins: list[object] = []

        def before(conn: Any, clause: Any, multiparams: Any, params: Any, options: Any) -> None:
            if isinstance(clause, sa.Insert) and clause.table is _t:
                batches.append([row["name"] for row in multiparams or [params]])

        def begin(conn: Any) -> None:
            begins.append(conn)

        event.listen(store.engine, "before_execute", before)
        event.listen(store.engine, "begin", begin)
        try:
            store.ensure(names)
        finally:
            event.remove(store.engine, "before_execute", before)
            event.remove(store.engine, "begin", begin)
        assert [len(batch) for batch in batches] == [1000, 1000, 500]
        assert [name for batch in batches for name in batch] == sorted(names)
        assert len(begins) == 1 + 3  # the read, then a transaction per batch
        assert len(store.read(names)) == len(names)


class TestStaleDue:
    def test_a_due_a_minute_or_more_past_is_moved_on_and_one_just_past_is_kept(
        self, store, manual_clock
    ):
        """A due left in the past (the instant went by unclaimed: every replica down) is
        moved on at the next start; one just past may be an instant being claimed now."""
        store.ensure(["stale", "recent"], due={"stale": T0, "recent": T0})
        set_column(store.engine, "recent", due_s=int((T0 + timedelta(seconds=60)).timestamp()))
        manual_clock.set(T0 + timedelta(seconds=90))
        with written(store.engine) as names_written:
            store.ensure(["stale", "recent"], due={"stale": T2, "recent": T2})
        assert names_written == ["stale"]
        rows = store.read(["stale", "recent"])
        assert (rows["stale"].due, rows["recent"].due) == (T2, T0 + timedelta(seconds=60))
        assert store.unclaimed(T1) == ["recent"]  # the stale row is no longer in the query

    def test_the_write_moves_a_stale_due_even_after_a_read_that_found_it_fresh(
        self, store, manual_clock
    ):
        """The upsert decides on its own: a due that went stale is moved on by it."""
        store.ensure(["a"], due={"a": T0})
        manual_clock.set(T0 + timedelta(minutes=5))
        store._upsert(["a"], None, {"a": int(T2.timestamp()) + 600})
        assert store.read(["a"])["a"].due == T2 + timedelta(seconds=600)


def other_store_writes_after_the_read(
    first: lease.LeaseStore, second: lease.LeaseStore, monkeypatch: Any
) -> None:
    """Make ``first``'s next ensure read, then let ``second`` lower ``a``'s due to T0 and
    set its spec HOURLY, then write what its read chose."""
    read = first._to_write

    def read_then_other(*args: Any) -> list[str]:
        names = read(*args)
        second.ensure(["a"], specs={"a": HOURLY}, due={"a": T0})
        return names

    monkeypatch.setattr(first, "_to_write", read_then_other)


class TestStaleRead:
    def test_a_due_lowered_after_the_read_is_not_raised_by_the_write(
        self, migrated_engine, manual_clock, monkeypatch
    ):
        """Two replicas: the first reads a due to lower (T2 → T1); before it writes, the
        second lowers it further (T0). The first's write keeps T0: the upsert lowers,
        never raises, whatever its read said."""
        first = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        second = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        first.ensure(["a", "b"], specs={"a": EVERY, "b": EVERY}, due={"a": T2, "b": T2})
        other_store_writes_after_the_read(first, second, monkeypatch)
        with written(migrated_engine) as names_written:
            first.ensure(["a", "b"], specs={"a": EVERY, "b": EVERY}, due={"a": T1, "b": T1})
        assert names_written == ["a", "a", "b"]  # the second's, then the first's
        rows = first.read(["a", "b"])
        assert (rows["a"].due, rows["b"].due) == (T0, T1)
        assert rows["a"].spec == EVERY  # the latest caller's spec: the first's write

    def test_a_spec_changed_after_a_read_that_found_nothing_to_do_is_kept(
        self, migrated_engine, manual_clock, monkeypatch
    ):
        """The first's read finds nothing to change; the second changes the spec before
        the first would have written: the outcome is the first's ensure, then the
        second's (the first writes nothing)."""
        first = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        second = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        first.ensure(["a"], specs={"a": EVERY}, due={"a": T1})
        other_store_writes_after_the_read(first, second, monkeypatch)
        first.ensure(["a"], specs={"a": EVERY}, due={"a": T1})
        row = first.read(["a"])["a"]
        assert (row.spec, row.due) == (HOURLY, T0)
        assert column(migrated_engine, "a", "due_s") == int(T0.timestamp())
