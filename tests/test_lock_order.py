"""Statements that write many lease rows at once lock them in one order (issue #31).

Two transactions that lock overlapping rows in different orders can deadlock: each
holds a row the other waits for, and the server kills one (PostgreSQL's deadlock
detection, MariaDB's error 1213), which the store reports as ``DatabaseUnavailable``.
A replica's control thread renews every lease it holds in one statement while its
finisher thread writes a batch of ends, one UPDATE per (end second, outcome), in one
transaction: those are the writers that meet on the same rows.

Each test runs two threads on two connections, many times, with the rows given in
orders that differ, and asserts that no write failed and every write was applied. On
the servers only: SQLite has one writer at a time and nothing to order.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import START, ManualClock

import lease
from lease._schema import lease_table

ROWS = 300
ROUNDS = 40


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
    url: str = request.getfixturevalue(f"{request.param}_url")
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
    store = server_store
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
            lambda: store.finish_many(ends),  # noqa: B023
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
    access path, not the list: the renewals' and the ends' UPDATEs, and the lock of a
    batch's rows, must read the table along its primary key (a range over it, or a scan
    of it), for a few rows as for every row. An index added to the lease table that one
    of them would use instead fails here."""
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
