"""Revision 0018 adds ``prev_start_ms`` to the lease table, live: a round in flight under
release 0017 ends on record, no row is rewritten, and the first claim after the upgrade
copies when the round before it took the lease."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

import lease
from tests import test_migrations as migrations

#: Migrations start from a database without the lease tables (tests/_pool.py).
pytestmark = pytest.mark.blank_database


def prev_start(engine: sa.Engine, name: str) -> int | None:
    with engine.connect() as conn:
        table = lease.metadata.tables["cronjob_lease"]
        return conn.execute(sa.select(table.c.prev_start_ms).where(table.c.name == name)).scalar()


class TestUpgradeTo0018:
    def test_a_round_in_flight_ends_on_record_and_the_next_claim_copies_its_start(
        self, db_engine, manual_clock
    ):
        t0 = manual_clock.now()
        migrations._upgraded_under_a_round(db_engine, "0017", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == migrations.HEAD
        assert prev_start(db_engine, "old-job") is None  # no row rewritten
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        # The old release's round set no start: the claim after it copies none.
        later = t0.replace(microsecond=0) + timedelta(minutes=1)
        manual_clock.advance(60)
        assert store.claim(["old-job"], later, "new-replica")
        assert prev_start(db_engine, "old-job") is None
        # This release's claim set one: the claim after it copies it.
        assert store.finish("old-job", store.read(["old-job"])["old-job"].token, ended=later)
        taken = store.read(["old-job"])["old-job"].last_start
        manual_clock.advance(60)
        assert store.claim(["old-job"], later + timedelta(minutes=1), "new-replica")
        assert taken is not None
        assert prev_start(db_engine, "old-job") == int(taken.timestamp() * 1000)
