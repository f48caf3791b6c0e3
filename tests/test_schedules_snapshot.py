"""`cronjob.schedules` in a caller's transaction under REPEATABLE READ (MariaDB/MySQL's
default isolation, PostgreSQL's when asked) whose snapshot was taken before another
writer committed: each call writes on the latest commit, or is refused naming the id."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from cronjob import ScheduleError, schedules

DAILY = "0 0 9 * * *"
LATER = "0 0 10 * * *"
#: The servers: SQLite has no snapshot older than its write lock.
SERVERS = pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)


@pytest.fixture
def stale(migrated_engine: sa.Engine, db_url: str) -> Iterator[sa.Engine]:
    """An engine on the same database whose transactions run REPEATABLE READ."""
    engine = sa.create_engine(db_url, poolclass=NullPool, isolation_level="REPEATABLE READ")
    yield engine
    engine.dispose()


def replace(conn: sa.Connection) -> Any:
    return schedules.add(conn, "x", task="t", spec=LATER, args={"by": "stale"}, if_exists="replace")


def update(conn: sa.Connection) -> Any:
    return schedules.update(conn, "x", spec=LATER, args={"by": "stale"})


def remove(conn: sa.Connection) -> Any:
    return schedules.remove(conn, "x")


@SERVERS
@pytest.mark.parametrize("call", [replace, update, remove])
def test_a_write_after_another_added_the_id_since_the_snapshot(
    migrated_engine: sa.Engine, stale: sa.Engine, call: Callable[[sa.Connection], Any]
) -> None:
    """MariaDB/MySQL reads the rows it writes as last committed and writes; PostgreSQL
    refuses the stale snapshot, naming the id, and nothing of the call is written."""
    refused = migrated_engine.dialect.name == "postgresql"
    outcome = None
    try:
        with stale.connect() as conn, conn.begin():
            assert schedules.get(conn, "x") is None  # the snapshot is taken
            schedules.add(migrated_engine, "x", task="t", spec=DAILY, args={"by": "other"})
            outcome = call(conn)
    except ScheduleError as exc:
        assert refused
        assert str(exc).startswith("schedule 'x': another transaction changed schedules")
    else:
        assert not refused
        assert outcome is True
    record = schedules.get(migrated_engine, "x")
    if refused:
        assert record is not None and (record.spec, record.args) == (DAILY, {"by": "other"})
    elif call is remove:
        assert record is None
    else:
        assert record is not None and (record.spec, record.args) == (LATER, {"by": "stale"})
