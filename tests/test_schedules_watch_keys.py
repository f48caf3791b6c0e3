"""On a fake clock the schedulers poll nothing: a committed change of schedules tells this
process's watchers of that database. Any spelling of the database's URL, and the async
forms, reach them: another host name for the same server, another path to the same
SQLite file, another driver of the same database.

Replicas on a fake clock (nothing sleeps), on each database at head.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import cronjob
from cronjob import schedules
from cronjob.testing import FakeClock
from tests.test_async_transaction import as_async

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = "0 * * * * *"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


class Seen:
    """The instants each schedule's rounds ran, by id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instants: dict[str, list[datetime]] = {}

    def __call__(self, ctx: cronjob.Round) -> None:
        with self.lock:
            self.instants.setdefault(ctx.name, []).append(ctx.instant)


def registry_with(seen: Seen) -> cronjob.Registry:
    registry = cronjob.Registry()
    registry.register_task(seen, "report")
    return registry


def other_spelling(db_url: str) -> str:
    """The same database by another URL: ``localhost`` for ``127.0.0.1``, or the SQLite
    file's path through ``.`` and its directory's own name."""
    url = sa.make_url(db_url)
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or "")
        return url.set(
            database=f"{path.parent}/./../{path.parent.name}/{path.name}"
        ).render_as_string(hide_password=False)
    assert url.host == "127.0.0.1"
    return url.set(host="localhost").render_as_string(hide_password=False)


def test_a_change_committed_through_another_spelling_of_the_url_is_seen(
    migrated_engine, db_url, replicas, clock
):
    seen = Seen()
    replicas(registry_with(seen), "a")
    other = other_spelling(db_url)
    schedules.add(other, "r", task="report", spec=MINUTELY)
    clock.advance(60)
    assert seen.instants.get("r") == [START + timedelta(minutes=1)]
    schedules.update(other, "r", spec="30 * * * * *")
    clock.advance(60)
    assert seen.instants["r"][1:] == [START + timedelta(minutes=1, seconds=30)]
    schedules.remove(other, "r")
    clock.advance(120)
    assert len(seen.instants["r"]) == 2


def test_a_change_committed_through_the_async_forms_is_seen(
    migrated_engine, db_url, replicas, clock
):
    seen = Seen()
    replicas(registry_with(seen), "a")

    async def add() -> None:
        engine = create_async_engine(as_async(db_url), poolclass=NullPool)
        try:
            await schedules.add_async(engine, "r", task="report", spec=MINUTELY)
            async with engine.begin() as conn:  # the caller's own transaction
                await schedules.add_async(conn, "s", task="report", spec=MINUTELY)
        finally:
            await engine.dispose()

    asyncio.run(add())
    clock.advance(60)
    assert seen.instants == {
        "r": [START + timedelta(minutes=1)],
        "s": [START + timedelta(minutes=1)],
    }
