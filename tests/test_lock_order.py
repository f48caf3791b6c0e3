"""Statements that write many lease rows at once never deadlock (issue #31).

Two transactions that lock overlapping rows in different orders can deadlock: each
holds a row the other waits for, and the server kills one (PostgreSQL's deadlock
detection, MariaDB's error 1213), which the store reports as ``DatabaseUnavailable``.
A replica's control thread renews every lease it holds in one statement while its
finisher thread writes a batch of ends, one UPDATE per (end second, outcome), in one
transaction: those are the writers that meet on the same rows. The process takes them
one at a time (one lock per database, ``_held_rows_transaction``); claims of several
replicas lock in one order.

Each test runs two threads on two connections, many times, with the rows given in
orders that differ, and asserts that no write failed and every write was applied. On
the servers only: SQLite has one writer at a time and nothing to order.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa
from conftest import START, ManualClock, database_url

import lease
from lease._mysql_due import is_deadlock
from lease._schema import lease_table

ROWS = 300
ROUNDS = 40
#: A small deployment's lease table: InnoDB reads it whole for a join, not by its key.
SMALL = 6


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def server_store(
    request: pytest.FixtureRequest, manual_clock: ManualClock
) -> Iterator[lease.LeaseStore]:
    """A store on a server database at head, its pool big enough for two threads."""
    url = database_url(request, request.param)
    engine = lease.create_engine(url, pool_size=4)
    lease.migrate(engine)
    try:
        yield lease.LeaseStore(engine, clock=manual_clock.now, claim_ahead=None)
    finally:
        engine.dispose()


def _together(first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
    """Run both at once, each on its own thread; their results, or the error each raised."""
    results: list[Any] = [None, None]
    start = threading.Barrier(2)

    def run(index: int, call: Callable[[], Any]) -> None:
        start.wait()
        try:
            results[index] = call()
        except lease.DatabaseUnavailable as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=pair) for pair in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results[0], results[1]


def _names() -> list[str]:
    return [f"job-{i:05d}" for i in range(ROWS)]


def _free_all(store: lease.LeaseStore) -> None:
    """Every lease free again, so that the next round claims every row whatever this
    one left (a failed write leaves its rows held)."""
    with store.engine.begin() as conn:
        conn.execute(sa.update(lease_table).values(expires_ms=None))


def test_renewals_and_a_batch_of_ends_in_two_groups_do_not_deadlock(server_store):
    """The finisher's batch has two UPDATEs whose names interleave (ends of one instant
    that fell on two seconds, the later second's ends listed first), while the control
    thread renews every lease of the replica."""
    _renewals_beside_ends(server_store, server_store)


def test_the_renewals_and_ends_of_two_stores_of_one_database_do_not_deadlock(server_store):
    """The process takes such writes one at a time per database, not per store: a store
    built on an engine of its own for the same URL waits for the other's too."""
    engine = lease.create_engine(server_store.engine.url, pool_size=2)
    try:
        other = lease.LeaseStore(engine, clock=server_store._clock, claim_ahead=None)
        _renewals_beside_ends(server_store, other)
    finally:
        engine.dispose()


def _renewals_beside_ends(store: lease.LeaseStore, finisher: lease.LeaseStore) -> None:
    """ROUNDS rounds of every row claimed by ``store``, then renewed by it while
    ``finisher`` writes their ends in two interleaved groups, both at once."""
    names = _names()
    store.ensure(names)
    failures: list[str] = []
    for round_ in range(ROUNDS):
        instant = START + timedelta(minutes=round_ + 1)
        batch = store.claim_batch(names, instant, "r1")
        assert len(batch.names) == ROWS
        held = [(name, batch.token) for name in names]
        odd, even = names[1::2], names[0::2]
        ends = [(name, batch.token, instant + timedelta(seconds=2)) for name in reversed(odd)]
        ends += [(name, batch.token, instant + timedelta(seconds=1)) for name in even]
        renewed, finished = _together(
            lambda: store.renew(held, "r1"),  # noqa: B023 - called before the next round
            lambda: finisher.finish_many(ends),  # noqa: B023
        )
        for outcome in (renewed, finished):
            if isinstance(outcome, Exception):
                failures.append(f"round {round_}: {outcome}")
        if isinstance(finished, set):
            assert finished == set(held), f"round {round_}: not every end was written"
        if isinstance(renewed, set):
            # One order: the renewal ran wholly before the ends, or wholly after them.
            assert renewed in (set(names), set()), f"round {round_}: renewed {len(renewed)}"
        if not isinstance(finished, Exception):
            rows = store.read(names)
            assert all(row.state is lease.LeaseState.DONE for row in rows.values())
        _free_all(store)
    assert failures == [], f"{len(failures)} of {ROUNDS} rounds failed: {failures[:3]}"


def test_renewals_of_one_set_in_opposite_orders_do_not_deadlock(server_store):
    """Two renewals of the same leases, the pairs listed in opposite and shuffled orders
    (the statement must not lock rows in the order the list gives them)."""
    store = server_store
    names = _names()
    store.ensure(names)
    batch = store.claim_batch(names, START + timedelta(minutes=1), "r1")
    held = [(name, batch.token) for name in names]
    shuffled = random.Random(31)
    failures: list[str] = []
    for round_ in range(ROUNDS):
        first, second = list(held), list(held)
        shuffled.shuffle(first)
        second = first[::-1]
        outcomes = _together(
            lambda: store.renew(first, "r1"),  # noqa: B023
            lambda: store.renew(second, "r1"),  # noqa: B023
        )
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                failures.append(f"round {round_}: {outcome}")
            else:
                assert outcome == set(names), f"round {round_}: renewed {len(outcome)}"
    assert failures == [], f"{len(failures)} of {ROUNDS} rounds failed: {failures[:3]}"


def test_claims_of_one_instant_by_two_replicas_do_not_deadlock(server_store):
    """Two replicas claim one instant at once: one its share (every other name), the
    other every name (a replica claiming the rest) in reverse order. Each row is won by
    exactly one of them."""
    store = server_store
    names = _names()
    store.ensure(names)
    failures: list[str] = []
    for round_ in range(ROUNDS):
        instant = START + timedelta(minutes=round_ + 1)
        share = names[0::2]
        won = _together(
            lambda: store.claim_batch(share, instant, "r1"),  # noqa: B023
            lambda: store.claim_batch(names[::-1], instant, "r2"),  # noqa: B023
        )
        claimed: list[str] = []
        for outcome in won:
            if isinstance(outcome, Exception):
                failures.append(f"round {round_}: {outcome}")
            else:
                claimed += outcome.names
        if not failures:
            assert sorted(claimed) == names, f"round {round_}: claimed {len(claimed)}"
        _free_all(store)
    assert failures == [], f"{len(failures)} of {ROUNDS} rounds failed: {failures[:3]}"


@pytest.mark.mysql
def test_on_mariadb_renewals_and_ends_read_the_rows_along_the_primary_key(mysql_url):
    """MariaDB/MySQL lock a row as the plan reads it, so what orders their locks is the
    access path, not the list: the renewals' and the ends' UPDATEs read the table along
    its primary key (a range over it, or a scan of it), for a few rows as for every row,
    in the order the claims of every replica lock too (a claim meets them on a row whose
    lease expired), and so does the lock of a batch's rows in several groups. An index
    added to the lease table that one of them would use instead fails here."""
    engine = lease.create_engine(mysql_url)
    lease.migrate(engine)
    store = lease.LeaseStore(engine, claim_ahead=None)
    names = _names()
    store.ensure(names)
    sent: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        text = statement.lstrip().upper()
        if text.startswith("UPDATE") or (text.startswith("SELECT") and "FOR UPDATE" in text):
            sent.append((statement, parameters))

    try:
        for round_, chosen in enumerate((names[:3], names)):
            instant = START + timedelta(minutes=round_ + 1)
            batch = store.claim_batch(chosen, instant, "r1")
            held = [(name, batch.token) for name in chosen]
            sa.event.listen(engine, "before_cursor_execute", keep)
            try:
                store.renew(held[::-1], "r1")
                # Two end seconds, the names of each spread over the batch.
                ends = [
                    (name, token, instant + timedelta(seconds=index % 2))
                    for index, (name, token) in enumerate(held)
                ]
                store.finish_many(ends[::-1])
            finally:
                sa.event.remove(engine, "before_cursor_execute", keep)
        # Each round: the renewal, the batch's lock, one UPDATE per end second.
        assert len(sent) == 8 and sum("FOR UPDATE" in text for text, _ in sent) == 2
        with engine.connect() as conn:
            for statement, parameters in sent:
                for row in conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings():
                    if row["table"] != "cronjob_lease":
                        continue
                    plan = (statement[:60], dict(row))
                    assert row["type"] == "ALL" or row["key"] == "PRIMARY", plan
    finally:
        engine.dispose()


@pytest.fixture
def mariadb_store(mysql_url: str) -> Iterator[lease.LeaseStore]:
    """A store on a MariaDB database at head, with the first `SMALL` rows of `_names`."""
    engine = lease.create_engine(mysql_url, pool_size=4)
    lease.migrate(engine)
    store = lease.LeaseStore(engine, claim_ahead=None)
    store.ensure(_names()[:SMALL])
    try:
        yield store
    finally:
        engine.dispose()


def _claim_running(engine: sa.Engine) -> bool:
    """Whether a session on this database runs a claim's UPDATE (the server's other
    databases left out: other tests may run on it)."""
    query = sa.text(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
        " AND STATE = 'Updating' AND INFO LIKE 'UPDATE cronjob_lease SET prev_instant%'"
    )
    with engine.connect() as conn:
        return bool(conn.execute(query).scalar_one())


@pytest.mark.mysql
def test_on_mariadb_a_claims_due_write_locks_no_row_it_did_not_claim(mariadb_store):
    """The claim's second statement, the due write, reads the rows it claimed by the
    primary key: it does not wait for a row that another transaction holds (another
    replica's claim of its own share, or a previous release's), which made two claims
    deadlock, each waiting in its due write for the other's rows."""
    store = mariadb_store
    instant = START + timedelta(minutes=1)
    names = _names()[:SMALL]
    share, others = names[0::2], names[1::2]
    due = {name: instant + timedelta(minutes=1) for name in share}
    with store.engine.connect() as other:
        other.begin()
        # Another replica's claim of its own share, in flight.
        other.execute(
            lease_table.update().where(lease_table.c.name.in_(others)).values(holder="r2")
        )
        batch = store.claim_batch(share, instant, "r1", due=due)
        other.rollback()
    assert batch.names == tuple(share)
    rows = store.read(names)
    assert {name: row.due for name, row in rows.items() if row.due is not None} == due


@pytest.mark.mysql
def test_on_mariadb_a_claim_rolled_back_by_a_deadlock_runs_again(mariadb_store, caplog):
    """A claim that InnoDB picks as a deadlock's victim (error 1213: the whole
    transaction rolled back) is run again, and wins its rows once the other ends: a
    replica of a previous release, whose due write waits for rows this claim holds, can
    no longer make this release lose an instant."""
    caplog.set_level(logging.DEBUG, logger="lease")
    store = mariadb_store
    instant = START + timedelta(minutes=1)
    first, second, *rest = _names()[:6]
    written = lease_table.update().values(due_s=1)
    with store.engine.connect() as other:
        other.begin()
        # The other transaction has written more rows than the claim will have: InnoDB
        # rolls back the transaction that wrote fewer, the claim.
        other.execute(written.where(lease_table.c.name.in_([second, *rest])))
        won: list[Any] = []
        claiming = threading.Thread(
            target=lambda: won.append(store.claim_batch([first, second], instant, "r1"))
        )
        claiming.start()
        deadline = time.monotonic() + 30
        while not _claim_running(store.engine):  # it holds the first, waits for the second
            assert time.monotonic() < deadline, f"the claim never waited: {won}"
            time.sleep(0.05)
        # Now the other waits for the first: a deadlock, and the claim is its victim.
        other.execute(written.where(lease_table.c.name == first))
        other.rollback()
        claiming.join(30)
    assert [batch.names for batch in won] == [(first, second)]
    assert "claim of 2 lease(s) deadlocked; running it again" in caplog.messages


def test_only_mariadbs_deadlock_counts_as_a_deadlock():
    deadlock = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    timeout = pymysql.err.OperationalError(1205, "Lock wait timeout exceeded")
    assert is_deadlock(sa.exc.OperationalError("UPDATE", {}, deadlock))
    assert not is_deadlock(sa.exc.OperationalError("UPDATE", {}, timeout))
    assert not is_deadlock(None)
    assert not is_deadlock(ValueError("1213"))


def test_a_pause_of_every_job_beside_a_batch_of_ends_in_two_groups_does_not_deadlock(
    server_store,
):
    """``pause --all`` from another process locks every row in name order. A batch of
    ends in two groups whose names interleave (c in the first, b in the second) must
    lock its rows in that order too, before its first UPDATE: held between the batch's
    first UPDATE and its second, the pause waits for c holding a and b, and a batch that
    went on to lock b would close the cycle."""
    store = server_store
    names = ["a", "b", "c", "d"]
    store.ensure(names)
    batch = store.claim_batch(names, START + timedelta(minutes=1), "r1")
    ended = START + timedelta(minutes=1)
    ends = [
        ("c", batch.token, ended + timedelta(seconds=1)),
        ("b", batch.token, ended + timedelta(seconds=2)),
    ]
    first_update, go_on = threading.Event(), threading.Event()

    def hold_after_the_first_update(conn, cursor, statement, *rest):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("UPDATE") and not first_update.is_set():
            first_update.set()
            go_on.wait(5)

    engine = store.engine
    admin_engine = lease.create_engine(engine.url, pool_size=1)
    admin = lease.LeaseStore(admin_engine, claim_ahead=None)
    outcomes: dict[str, Any] = {}

    def finish() -> None:
        try:
            outcomes["finish"] = store.finish_many(ends)
        except lease.DatabaseUnavailable as exc:
            outcomes["finish"] = exc

    def pause() -> None:
        try:
            outcomes["pause"] = admin.set_paused(None, paused=True, by="op")
        except lease.DatabaseUnavailable as exc:
            outcomes["pause"] = exc

    sa.event.listen(engine, "after_cursor_execute", hold_after_the_first_update)
    try:
        finisher = threading.Thread(target=finish)
        finisher.start()
        assert first_update.wait(5)
        pauser = threading.Thread(target=pause)
        pauser.start()
        time.sleep(0.5)  # the pause is waiting for a row lock by now
        go_on.set()
        finisher.join(30)
        pauser.join(30)
    finally:
        sa.event.remove(engine, "after_cursor_execute", hold_after_the_first_update)
        admin_engine.dispose()
    assert outcomes["finish"] == {("b", batch.token), ("c", batch.token)}
    assert sorted(outcomes["pause"]) == names
