"""`cronjob.schedules`: what a record tells (its pause), on the three databases.

A schedule's pause lives on its lease row, as a registered job's does; `ScheduleRecord.paused`
reads it in the call's own transaction, as ``cronjob schedules --json`` shows it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import lease
from cronjob import admin, schedules
from cronjob.admin._cli import main
from tests.test_async_transaction import as_async

DAILY = "0 0 9 * * *"


@pytest.fixture
def engine(db_engine: sa.Engine) -> sa.Engine:
    lease.migrate(db_engine)
    return db_engine


class TestPaused:
    def test_a_schedule_added_paused_reads_paused_and_one_added_running_does_not(self, engine):
        schedules.add(engine, "a", task="t", spec=DAILY, paused=True)
        schedules.add(engine, "b", task="t", spec=DAILY)
        assert schedules.get(engine, "a").paused is True
        assert schedules.get(engine, "b").paused is False
        assert [(r.id, r.paused) for r in schedules.list(engine)] == [("a", True), ("b", False)]

    def test_the_operators_pause_and_resume_are_read_back(self, engine, db_url):
        schedules.add(engine, "a", task="t", spec=DAILY)
        admin.pause(engine, "a", reason="maintenance")
        assert schedules.get(engine, "a").paused is True
        admin.resume(engine, "a")
        assert schedules.get(engine, "a").paused is False

    def test_it_is_what_the_schedules_command_shows(self, engine, db_url, capsys):
        schedules.add(engine, "a", task="t", spec=DAILY, paused=True)
        schedules.add(engine, "b", task="t", spec=DAILY)
        assert main(["schedules", "--json", "--database-url", db_url]) == 0
        shown = {entry["id"]: entry["paused"] for entry in json.loads(capsys.readouterr().out)}
        assert shown == {r.id: r.paused for r in schedules.list(engine)} == {"a": True, "b": False}

    def test_a_registered_jobs_pause_never_marks_a_schedule(self, engine):
        """Only the schedule's own lease row counts: a paused row of another name does not."""
        lease.LeaseStore(engine).ensure(["job"])
        admin.pause(engine, "job")
        schedules.add(engine, "a", task="t", spec=DAILY)
        assert schedules.get(engine, "a").paused is False

    def test_the_async_calls_read_it_too(self, engine, db_url):
        schedules.add(engine, "a", task="t", spec=DAILY, paused=True)
        async_engine = create_async_engine(as_async(db_url))

        async def read() -> tuple[bool, list[bool]]:
            try:
                record = await schedules.get_async(async_engine, "a")
                listed = await schedules.list_async(async_engine)
                return record.paused, [r.paused for r in listed]
            finally:
                await async_engine.dispose()

        assert asyncio.run(read()) == (True, [True])
