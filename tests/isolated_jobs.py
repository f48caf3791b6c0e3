"""Jobs for the tests of ``isolation="process"``: module-level functions, so a child
process can import them by name. Each notes what it saw in the table ``iso_marks`` of the
test's database, through the round's fenced ``ctx.transaction()`` (the child's own
connection), which the test reads back (a child shares no memory with the test)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sqlite3
import time
from typing import Any

import sqlalchemy as sa

import cronjob

#: The table the jobs note their rounds in (created by the test, see `create_marks`).
MARKS = "iso_marks"


def create_marks(url: str) -> None:
    """Create the marks table on the test's database."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"CREATE TABLE {MARKS} (name VARCHAR(200), note VARCHAR(200), "
                    "pid INTEGER, body TEXT)"
                )
            )
    finally:
        engine.dispose()


def marks(url: str, name: str | None = None) -> list[dict[str, Any]]:
    """The marks on record (each its note, pid and what it saw), oldest first."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT name, note, pid, body FROM {MARKS}")).all()
    finally:
        engine.dispose()
    return [
        {"name": r.name, "note": r.note, "pid": r.pid, **json.loads(r.body)}
        for r in rows
        if name is None or r.name == name
    ]


def mark(ctx: cronjob.Round, note: str) -> None:
    """Note ``ctx``'s round in the marks table, in its fenced transaction."""
    body = {
        "instant": ctx.instant.isoformat(),
        "attempt": ctx.attempt,
        "replica": ctx.replica,
        "trace_id": ctx.trace_id,
        "occurrence_id": ctx.occurrence_id,
        "task": ctx.task,
        "args": ctx.args,
    }
    with ctx.transaction() as conn:
        conn.execute(
            sa.text(f"INSERT INTO {MARKS} (name, note, pid, body) VALUES (:n, :note, :p, :b)"),
            {"n": ctx.name, "note": note, "p": os.getpid(), "b": json.dumps(body)},
        )


def works(ctx: cronjob.Round) -> None:
    """Notes its round and logs a line."""
    logging.getLogger("app.isolated").warning("working in pid %d", os.getpid())
    mark(ctx, "ran")


async def works_async(ctx: cronjob.Round) -> None:
    """An async job: notes its round after an await."""
    await asyncio.sleep(0)
    mark(ctx, "ran async")


class Unpicklable(Exception):
    """An exception whose class cannot be rebuilt from its pickle (two arguments)."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a} {b}")


def fails(ctx: cronjob.Round) -> None:
    raise ValueError(f"no report for {ctx.instant.isoformat()}")


def fails_unpicklably(ctx: cronjob.Round) -> None:
    raise Unpicklable("odd", "failure")


def dies(ctx: cronjob.Round) -> None:
    """The child ends without a word, exit status 3."""
    os._exit(3)


def retries(ctx: cronjob.Round) -> None:
    mark(ctx, "attempt")
    if ctx.attempt == 1:
        ctx.retry_in(1)


def waits(ctx: cronjob.Round) -> None:
    """Notes its round, then waits an hour; when cancelled, notes the cause (its fenced
    transaction allowing: a drain does, a timeout does not) and stops."""
    mark(ctx, "started")
    if ctx.wait(3600):
        mark(ctx, f"cancelled: {type(ctx.cause).__name__}")
        ctx.check()


def hangs(ctx: cronjob.Round) -> None:
    """Ignores SIGTERM and its cancellation, and never returns (only SIGKILL ends it); a
    second run of its instant (attempt 2) notes it and returns."""
    if ctx.attempt > 1:
        mark(ctx, "again")
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mark(ctx, "started")
    while True:
        time.sleep(0.2)


class MarkedConnection(sqlite3.Connection):
    """A SQLite connection of a test's engine (``connect_args={"factory": ...}``): a
    child's transaction can tell it made one too."""


def settings(conn: sa.Connection) -> dict[str, Any]:
    """What ``conn`` says of the settings the tests give an engine: SQLite's busy
    timeout and its connection's class (``factory``); PostgreSQL's application name and
    MariaDB's session wait timeout (set by connect arguments), and the isolation level,
    on the servers."""
    if conn.dialect.name == "sqlite":
        made = type(conn.connection.dbapi_connection).__name__
        return {"busy_timeout": conn.exec_driver_sql("PRAGMA busy_timeout").scalar(), "made": made}
    if conn.dialect.name == "postgresql":
        name = conn.exec_driver_sql("SELECT current_setting('application_name')").scalar()
        return {"application_name": name, "isolation": conn.get_isolation_level()}
    wait = conn.exec_driver_sql("SELECT @@session.wait_timeout").scalar()
    return {"wait_timeout": int(wait), "isolation": conn.get_isolation_level()}


def observes(ctx: cronjob.Round) -> None:
    """Notes what its fenced transaction's connection says (see `settings`)."""
    with ctx.transaction() as conn:
        seen = settings(conn)
    mark(ctx, json.dumps(seen, sort_keys=True))
