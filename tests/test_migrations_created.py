"""A database never migrated is created at head from the metadata and stamped; the
revisions run one by one must give exactly that database, on every supported one.

`lease.migrate` creates a blank database's tables from ``lease.metadata`` (a dozen
statements) instead of running its eighteen revisions (about forty). Every later
upgrade still runs the revisions, so both must agree: the same tables, columns (types,
nullability, server defaults), keys, indexes (partial ones' conditions included),
table options on MariaDB, rows (the change counter's seed) and version.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import lease
from lease import _migrate
from lease._schema import VERSION_TABLE, metadata
from tests.conftest import mysql_database, postgres_schema

#: Migrations start from a database without the lease tables (tests/_pool.py).
pytestmark = pytest.mark.blank_database

TABLES = sorted([*metadata.tables, VERSION_TABLE])


def _upgraded_revision_by_revision(engine: sa.Engine) -> None:
    """The other way to head: every revision from the first (what an upgrade runs)."""
    with engine.connect() as conn:
        _migrate._upgrade(conn)
        conn.commit()


def _schema(engine: sa.Engine) -> dict[str, Any]:
    """Everything a database's lease tables are made of, and what they hold."""
    found: dict[str, Any] = {}
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        assert sorted(t for t in inspector.get_table_names() if t.startswith("cronjob_")) == TABLES
        for table in TABLES:
            columns = {
                c["name"]: (
                    str(c["type"]),
                    c["nullable"],
                    None if c.get("default") is None else str(c["default"]),
                )
                for c in inspector.get_columns(table)
            }
            indexes = {
                i["name"]: (
                    tuple(i["column_names"]),
                    bool(i["unique"]),
                    {k: str(v) for k, v in sorted(i.get("dialect_options", {}).items())},
                )
                for i in inspector.get_indexes(table)
            }
            pk = inspector.get_pk_constraint(table)
            uniques = inspector.get_unique_constraints(table)
            foreign = sorted(
                (
                    f["name"],
                    f["referred_table"],
                    *map(tuple, (f["constrained_columns"], f["referred_columns"])),
                )
                for f in inspector.get_foreign_keys(table)
            )
            rows = sorted(
                tuple(map(repr, row)) for row in conn.execute(sa.text(f"SELECT * FROM {table}"))
            )
            found[table] = {
                "columns": columns,
                "indexes": indexes,
                "primary key": (pk.get("name"), tuple(pk["constrained_columns"])),
                "unique": sorted((u["name"], tuple(u["column_names"])) for u in uniques),
                "foreign keys": foreign,
                "rows": rows,
                "definition": _definition(conn, table),
            }
    return found


def _definition(conn: sa.Connection, table: str) -> Any:
    """What the server itself says of a table, where reflection leaves things out: MariaDB's
    ``SHOW CREATE TABLE`` (engine, charsets, collations), column by column; PostgreSQL's
    index definitions; SQLite's index statements (the partial index's condition)."""
    dialect = conn.dialect.name
    if dialect in ("mysql", "mariadb"):
        text = conn.execute(sa.text(f"SHOW CREATE TABLE {table}")).one()[1]
        text = re.sub(r" AUTO_INCREMENT=\d+", "", text)
        # Columns added by a later revision come last in its table; order is not meaning.
        return sorted(line.strip().rstrip(",") for line in text.splitlines())
    if dialect == "postgresql":
        return sorted(
            conn.execute(
                sa.text(
                    "SELECT replace(indexdef, current_schema() || '.', '') FROM pg_indexes"
                    " WHERE tablename = :t AND schemaname = current_schema()"
                ),
                {"t": table},
            ).scalars()
        )
    return sorted(
        (sql or "")
        for sql in conn.execute(
            sa.text("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :t"),
            {"t": table},
        ).scalars()
    )


@pytest.fixture
def second_url(db_url: str, tmp_path: Path) -> Iterator[str]:
    """Another blank database on the server of ``db_url``."""
    dialect = sa.make_url(db_url).get_backend_name()
    if dialect == "sqlite":
        yield f"sqlite:///{tmp_path / 'second.sqlite'}"
        return
    with postgres_schema() if dialect == "postgresql" else mysql_database() as url:
        yield url


def test_a_blank_database_created_at_head_is_the_revisions_database(db_url, second_url):
    created, upgraded = lease.create_engine(db_url), lease.create_engine(second_url)
    try:
        lease.migrate(created)
        _upgraded_revision_by_revision(upgraded)
        assert lease.current_revision(created) == lease.current_revision(upgraded)
        assert lease.current_revision(created) == lease.head_revision()
        assert created.url != upgraded.url
        assert _schema(created) == _schema(upgraded)
    finally:
        created.dispose()
        upgraded.dispose()


def test_a_blank_database_is_created_not_upgraded_revision_by_revision(db_engine, monkeypatch):
    """The fast path is taken (the comparison above would pass on the slow one too)."""

    def refused(conn: sa.Connection) -> None:
        raise AssertionError("a blank database ran the revisions one by one")

    monkeypatch.setattr(_migrate, "_upgrade", refused)
    lease.migrate(db_engine)
    assert lease.current_revision(db_engine) == lease.head_revision()
    with db_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT id, rev FROM cronjob_schedule_rev")).all() == [(1, 0)]


def test_a_lease_table_without_a_version_on_record_is_an_error_and_left_as_it_is(db_engine):
    """A first migration that died after its first table (DDL commits on MariaDB): the
    next start says so instead of stamping a database it did not build."""
    with db_engine.begin() as conn:
        metadata.tables["cronjob_lease"].create(conn)
    with pytest.raises(lease.MigrationFailed, match="cronjob_lease exist but no revision"):
        lease.migrate(db_engine)
    assert lease.current_revision(db_engine) is None
    with db_engine.connect() as conn:
        assert VERSION_TABLE not in sa.inspect(conn).get_table_names()
        assert "cronjob_round" not in sa.inspect(conn).get_table_names()
