"""Nothing silently dropped: a job must not stop running everywhere without a word.

A lease row that disappeared (deleted by hand, a database restored from an older backup)
is recreated and the job runs again; a replica whose clock runs far ahead says so, and
its claims of instants the others have not reached are refused.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Instants:
    def __init__(self) -> None:
        self.seen: list[datetime] = []
        self._lock = threading.Lock()

    def job(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.seen.append(ctx.instant)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = lease.create_engine(db_url)
    yield engine
    engine.dispose()


class TestMissingLeaseRow:
    def test_a_deleted_lease_row_is_recreated_and_the_job_runs_again(
        self, db_url, engine, clock, caplog
    ):
        instants = Instants()
        registry = cronjob.Registry()
        registry.register(instants.job, "@every 10s", "ten")
        with cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="a"):
            clock.advance(11)
            assert instants.seen == [START + timedelta(seconds=10)]
            with engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM cronjob_lease WHERE name = 'ten'"))
            with caplog.at_level(logging.WARNING, logger="cronjob"):
                clock.advance(90)
        after = [i for i in instants.seen if i > START + timedelta(seconds=10)]
        assert after, "the job never ran again after its row was deleted"
        assert after[-1] == START + timedelta(seconds=100)
        assert "the lease row of 1 job(s) was missing, recreated" in caplog.text
        assert "'ten'" in caplog.text


class TestClockFarAhead:
    def test_a_replica_an_hour_ahead_says_so_and_claims_nothing(self, db_url, clock, caplog):
        instants = Instants()
        registry = cronjob.Registry()
        registry.register(instants.job, "@every 10s", "ten")
        clock.step_wall(+3600)  # this replica's wall clock; the database's is not moved
        with (
            caplog.at_level(logging.ERROR, logger="cronjob"),
            cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="fast"),
        ):
            clock.advance(30)
        assert instants.seen == []  # its instants lie an hour past the database's now
        assert "this replica's clock is 3600.0 s ahead of the database's" in caplog.text


class TestRowsFromALaterRun:
    def test_rows_claimed_later_than_the_clock_are_named_at_start(self, db_url, caplog):
        """An earlier test's fake clock ran later: this one would silently run nothing."""
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        later = FakeClock(START + timedelta(days=1))
        with cronjob.Scheduler(db_url, registry=registry, clock=later, replica_id="a"):
            later.advance(3600)
        clock = FakeClock(START)
        with (
            caplog.at_level(logging.WARNING, logger="cronjob"),
            cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="a"),
        ):
            clock.advance(0)
        assert (
            "job 'hourly': its lease row records instant 2026-03-03T10:00:00+00:00 as claimed, "
            "later than this replica's clock (2026-03-02T09:00:00+00:00)" in caplog.text
        )
