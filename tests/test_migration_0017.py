"""Revision 0017 adds ``committed_ms`` to the lease table, live: a round in flight under
release 0016 ends on record, no row is rewritten (none has a commit: each is owed
nothing from before its first deployment, as before), and a schedule written after the
upgrade carries the moment it was committed."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import lease
from cronjob import schedules
from tests import test_migrations as migrations

#: Migrations start from a database without the lease tables (tests/_pool.py).
pytestmark = pytest.mark.blank_database


class TestUpgradeTo0017:
    def test_a_round_in_flight_ends_on_record_and_no_row_is_given_a_commit(
        self, db_engine, manual_clock
    ):
        t0 = manual_clock.now()
        migrations._upgraded_under_a_round(db_engine, "0016", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == migrations.HEAD
        columns = {c["name"] for c in sa.inspect(db_engine).get_columns("cronjob_lease")}
        assert "committed_ms" in columns
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        rows = store.read(["old-job", "new-job"])
        assert (rows["old-job"].committed, rows["new-job"].committed) == (None, None)
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        row = store.read(["old-job"])["old-job"]
        assert (row.state, row.committed) == (lease.LeaseState.DONE, None)

    def test_a_schedule_written_after_the_upgrade_carries_its_commit(self, db_engine, manual_clock):
        t0 = manual_clock.now()
        migrations._upgraded_under_a_round(db_engine, "0016", t0, holder="old-replica")
        committed = t0.replace(microsecond=0)
        schedules.add(db_engine, "report:42", task="report", spec="0 0 * * * *", now=committed)
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        row = store.read(["report:42"])["report:42"]
        assert (row.committed, row.deployed) == (committed, None)
