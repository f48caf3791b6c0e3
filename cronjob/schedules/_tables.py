"""The lease tables a schedule call needs, checked before its first statement.

A schedule written before any replica started (a data migration, a web worker deployed
first) would otherwise fail on its first statement with the driver's words for a missing
table (``relation "cronjob_schedule_rev" does not exist``), translated as an outage. The
call says what to run instead. It does not create the tables: that is DDL, and a schedule
call runs in the application's own transaction, which DDL would commit on MariaDB.
"""

from __future__ import annotations

import threading
from typing import Final

import sqlalchemy as sa
from sqlalchemy import Connection

import lease

__all__ = ["require_tables"]

#: The tables every write and read of a schedule touches, created with the others.
_TABLES: Final = ("cronjob_schedule", "cronjob_schedule_rev")

# The databases (by URL, password hidden) where the tables were found: checked once per
# process, since tables do not disappear under a running application.
_found: set[str] = set()
_lock = threading.Lock()


def require_tables(conn: Connection) -> None:
    """Raise unless the schedule tables exist on ``conn``'s database.

    A catalogue read on ``conn`` (it never fails the caller's transaction), once per
    database and process.

    Raises:
        lease.MigrationRequired: The tables are missing: no replica has started on this
            database, nor has ``lease.migrate`` run. Nothing was written.
    """
    where = conn.engine.url.render_as_string(hide_password=True)
    with _lock:
        if where in _found:
            return
    inspector = sa.inspect(conn)
    missing = [table for table in _TABLES if not inspector.has_table(table)]
    if missing:
        raise lease.MigrationRequired(
            f"no cronjob tables in {lease.redact(where)} (no {missing[0]}): "
            "start a replica first (it creates them as it starts), or run "
            "lease.migrate(engine) as a deploy step; nothing was written"
        )
    if conn.engine.url.database not in (None, "", ":memory:"):  # each in-memory one is new
        with _lock:
            _found.add(where)
