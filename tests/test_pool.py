"""The suite's databases at head (tests/_pool.py): a database taken back for the next test
is as `lease.migrate` leaves a new one, a changed one is never taken back, and a
connection the last test left open cannot write into it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import lease
from tests._pool import AtHead
from tests.conftest import MYSQL_URL, POSTGRES_URL, _execute, _reachable

SERVERS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


@pytest.fixture
def at_head() -> Iterator[AtHead]:
    _reachable(POSTGRES_URL, "PostgreSQL")
    _reachable(MYSQL_URL, "MariaDB/MySQL")
    pool = AtHead(postgres=POSTGRES_URL, mysql=MYSQL_URL)
    yield pool
    pool.close()


def rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table.name: [tuple(row) for row in conn.execute(sa.select(table))]
                for table in lease.metadata.sorted_tables
            }
    finally:
        engine.dispose()


def write_rows(url: str) -> None:
    """A lease row, a round in the history (an identity taken), the change counter moved."""
    engine = lease.create_engine(url)
    try:
        lease.LeaseStore(engine).ensure(["tick"])
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE cronjob_schedule_rev SET rev = 7"))
            conn.execute(
                lease.metadata.tables["cronjob_round"].insert(),
                {
                    "name": "tick",
                    "instant": 1,
                    "attempt": 1,
                    "holder": "h",
                    "why": "schedule",
                    "started_ms": 1,
                    "ended_ms": 2,
                    "outcome": "succeeded",
                },
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", [pytest.param("sqlite"), *SERVERS])
def test_each_test_gets_the_tables_at_head_empty_but_for_the_seed_row(at_head, kind, tmp_path):
    with at_head.database(kind, tmp_path) as url:
        engine = lease.create_engine(url)
        try:
            assert lease.current_revision(engine) == lease.head_revision()
        finally:
            engine.dispose()
        fresh = rows(url)
        assert fresh["cronjob_schedule_rev"] == [(1, 0)]
        assert {name for name, found in fresh.items() if found} == {"cronjob_schedule_rev"}


@pytest.mark.parametrize("kind", SERVERS)
def test_a_database_taken_back_is_empty_again_its_identities_at_one(at_head, kind, tmp_path):
    with at_head.database(kind, tmp_path) as first:
        fresh = rows(first)
        write_rows(first)
        assert rows(first) != fresh
    with at_head.database(kind, tmp_path) as second:
        assert second != first, "a database taken back is handed out under a new name"
        assert rows(second) == fresh
        write_rows(second)
        engine = lease.create_engine(second)
        try:
            with engine.connect() as conn:
                ids = conn.execute(sa.text("SELECT id FROM cronjob_round")).scalars().all()
        finally:
            engine.dispose()
    with at_head.database(kind, tmp_path) as third:
        assert rows(third) == fresh
    assert ids == [1], "the round's identity starts at 1, as in a new database"


@pytest.mark.parametrize("kind", SERVERS)
def test_a_changed_database_is_dropped_not_taken_back(at_head, kind, tmp_path):
    with at_head.database(kind, tmp_path) as url:
        _execute(url, "CREATE TABLE app_own (id INTEGER PRIMARY KEY)")
    with at_head.database(kind, tmp_path) as url:
        engine = sa.create_engine(url)
        try:
            assert "app_own" not in sa.inspect(engine).get_table_names()
        finally:
            engine.dispose()
        dropped = "DROP INDEX ix_cronjob_round_name_id"
        _execute(url, f"{dropped} ON cronjob_round" if kind == "mysql" else dropped)
    with at_head.database(kind, tmp_path) as url:
        engine = sa.create_engine(url)
        try:
            indexes = {i["name"] for i in sa.inspect(engine).get_indexes("cronjob_round")}
        finally:
            engine.dispose()
        assert "ix_cronjob_round_name_id" in indexes


@pytest.mark.parametrize("kind", SERVERS)
def test_a_connection_left_open_cannot_write_into_the_next_tests_database(
    at_head, kind, tmp_path: Path
):
    with at_head.database(kind, tmp_path) as first:
        left = sa.create_engine(first)
        conn = left.connect()
    try:
        with at_head.database(kind, tmp_path) as second:
            with pytest.raises(sa.exc.DatabaseError), conn.begin():
                conn.execute(sa.text("UPDATE cronjob_schedule_rev SET rev = 9"))
            assert rows(second)["cronjob_schedule_rev"] == [(1, 0)]
    finally:
        conn.close()
        left.dispose()
