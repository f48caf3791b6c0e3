"""Revision 0016 adds the acknowledgement of missed instants to the lease table, live: a
round in flight under release 0015 ends on record, no row is rewritten (nothing is
acknowledged), and an acknowledgement then goes on the row with a note in the history."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

import lease
from tests import test_migrations as migrations

#: Migrations start from a database without the lease tables (tests/_pool.py).
pytestmark = pytest.mark.blank_database


class TestUpgradeTo0016:
    def test_a_round_in_flight_ends_on_record_and_an_acknowledgement_is_kept(
        self, db_engine, manual_clock
    ):
        t0 = manual_clock.now()
        migrations._upgraded_under_a_round(db_engine, "0015", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == migrations.HEAD
        columns = {c["name"] for c in sa.inspect(db_engine).get_columns("cronjob_lease")}
        assert {"acked_s", "acked_ms", "acked_by", "ack_reason"} <= columns
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        row = store.read(["old-job"])["old-job"]
        assert (row.acked_through, row.acked_by, row.ack_reason) == (None, None, None)
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        through = t0.replace(microsecond=0) + timedelta(seconds=3)
        assert store.acknowledge("old-job", through=through, by="ops", reason="planned") == through
        row = store.read(["old-job"])["old-job"]
        assert row.state is lease.LeaseState.DONE
        assert (row.acked_through, row.acked_by, row.ack_reason) == (through, "ops", "planned")
        assert row.acked is not None and abs(row.acked - manual_clock.now()) < timedelta(seconds=1)
        notes = [r for r in store.rounds("old-job", limit=10) if r.why == lease.ACK_NOTE]
        assert [(n.holder, n.instant, n.outcome) for n in notes] == [
            ("ops", through, "acknowledged")
        ]

    def test_an_acknowledgement_never_lowers_the_one_before(self, db_engine, manual_clock):
        lease.migrate(db_engine)
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        store.ensure(["job"], specs={"job": "0 * * * * *"})
        later = manual_clock.now().replace(microsecond=0)
        store.acknowledge("job", through=later, by="ops")
        earlier = later - timedelta(hours=1)
        assert store.acknowledge("job", through=earlier, by="dev", reason="x") == later
        row = store.read(["job"])["job"]
        assert (row.acked_through, row.acked_by, row.ack_reason) == (later, "dev", "x")
        assert store.acknowledge("nosuch", through=later, by="ops") is None
