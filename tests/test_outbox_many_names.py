"""The outbox sweep's read of the due rows, by the names a replica can send: one bound
parameter per name failed on PostgreSQL past 65,535 names (and SQLite's limit is lower),
so no unsent occurrence was ever sent again; on every database."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

import lease

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
#: Past PostgreSQL's 65,535 bound parameters (and SQLite's 32,766).
MANY = 70_000


def _record(engine: sa.Engine, id_: str, name: str, *, next_try_ms: int) -> None:
    with engine.begin() as conn:
        lease.record_publication(
            conn,
            id=id_,
            name=name,
            instant=START,
            target="test",
            payload={"headers": {}},
            now_ms=0,
            hold_ms=next_try_ms,
        )


class TestDuePublicationsByName:
    def test_it_reads_the_due_rows_among_more_names_than_a_statement_can_bind(
        self, migrated_engine
    ):
        names = [f"job-{i:05d}" for i in range(MANY)]
        _record(migrated_engine, "first", names[0], next_try_ms=3)
        _record(migrated_engine, "last", names[-1], next_try_ms=1)
        _record(migrated_engine, "middle", names[MANY // 2], next_try_ms=2)
        _record(migrated_engine, "other", "not-among-them", next_try_ms=0)
        _record(migrated_engine, "later", names[1], next_try_ms=10_000)
        with migrated_engine.connect() as conn:
            due = lease.due_publications(conn, now_ms=100, limit=10, names=names)
            assert [row.id for row in due] == ["last", "middle", "first"]
            # The longest due first, at most `limit`, across the whole list of names.
            two = lease.due_publications(conn, now_ms=100, limit=2, names=names[::-1])
            assert [row.id for row in two] == ["last", "middle"]
