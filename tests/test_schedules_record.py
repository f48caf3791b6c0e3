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


@pytest.mark.blank_database
class TestBeforeAnyReplica:
    """No replica has started and ``lease.migrate`` has not run: the call says what to run."""

    def expected(self, engine: sa.Engine) -> str:
        where = lease.redact(engine.url.render_as_string(hide_password=True))
        return (
            f"no cronjob tables in {where} (no cronjob_schedule): start a replica first (it "
            "creates them as it starts), or run lease.migrate(engine) as a deploy step; "
            "nothing was written"
        )

    def test_add_is_refused_naming_what_to_run_and_writes_nothing(self, db_engine):
        with pytest.raises(lease.MigrationRequired) as raised:
            schedules.add(db_engine, "a", task="t", spec=DAILY)
        assert str(raised.value) == self.expected(db_engine)
        assert not sa.inspect(db_engine).has_table("cronjob_schedule")

    def test_the_callers_transaction_stays_usable(self, db_engine):
        """The check reads the catalogue: a failed statement would abort PostgreSQL's."""
        with db_engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE tenants (id INTEGER PRIMARY KEY)"))
        with db_engine.begin() as conn:
            with pytest.raises(lease.MigrationRequired):
                schedules.add(conn, "a", task="t", spec=DAILY)
            conn.execute(sa.text("INSERT INTO tenants (id) VALUES (42)"))
        with db_engine.connect() as conn:
            assert conn.execute(sa.text("SELECT id FROM tenants")).scalars().all() == [42]

    def test_reads_say_so_too(self, db_engine):
        for call in [lambda: schedules.get(db_engine, "a"), lambda: schedules.list(db_engine)]:
            with pytest.raises(lease.MigrationRequired, match=r"^no cronjob tables in "):
                call()

    def test_once_migrated_the_same_call_goes_through(self, db_engine):
        with pytest.raises(lease.MigrationRequired):
            schedules.add(db_engine, "a", task="t", spec=DAILY)
        lease.migrate(db_engine)
        assert schedules.add(db_engine, "a", task="t", spec=DAILY)
        assert schedules.get(db_engine, "a").task == "t"

    def test_by_url_and_async_alike(self, db_engine, db_url):
        with pytest.raises(lease.MigrationRequired, match=r"^no cronjob tables in "):
            schedules.add(db_url, "a", task="t", spec=DAILY)
        async_engine = create_async_engine(as_async(db_url))

        async def add() -> None:
            try:
                await schedules.add_async(async_engine, "a", task="t", spec=DAILY)
            finally:
                await async_engine.dispose()

        with pytest.raises(lease.MigrationRequired, match=r"^no cronjob tables in "):
            asyncio.run(add())
