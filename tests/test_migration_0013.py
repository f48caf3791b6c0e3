"""Revision 0013 adds ``task`` and ``obsolete_ms`` to the outbox, live: the unsent rows on
record learn their schedule's task, a round in flight ends on record, and release 0012's
own statements on the outbox (its columns only) keep working beside this release's."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import lease
from tests import test_migrations as migrations

#: Migrations start from a database without the lease tables (tests/_pool.py).
pytestmark = pytest.mark.blank_database

#: How release 0012 records, reads, claims and counts a publication: its columns only.
INSERT_0012 = (
    "INSERT INTO cronjob_outbox (id, name, instant_ms, target, payload, created_ms, "
    "next_try_ms, sent_ms, tries, error) VALUES "
    "(:id, :name, 0, 'rq', '{}', 0, :next_try_ms, :sent_ms, 0, NULL)"
)
DUE_0012 = (
    "SELECT id FROM cronjob_outbox WHERE sent_ms IS NULL AND next_try_ms <= :now "
    "ORDER BY next_try_ms, id"
)
CLAIM_0012 = (
    "UPDATE cronjob_outbox SET next_try_ms = :later WHERE id = :id AND sent_ms IS NULL "
    "AND next_try_ms = :seen"
)
SCHEDULE_0012 = (
    "INSERT INTO cronjob_schedule (id, task, spec, at_s, args, start_s, end_s, rev, "
    "removed, format, created_ms, updated_ms, policies) VALUES "
    "(:id, :task, '0 * * * * *', NULL, '{}', NULL, NULL, 1, :removed, 1, 0, 0, NULL)"
)


class TestUpgradeTo0013:
    def test_rows_in_flight_learn_their_task_and_release_0012_works_beside(
        self, db_engine, manual_clock
    ):
        t0 = manual_clock.now()
        migrations.TestUpgradeTo0002.upgrade_to(db_engine, "0012")
        with db_engine.begin() as conn:
            conn.execute(sa.text(SCHEDULE_0012), {"id": "tenant-1", "task": "export", "removed": 0})
            conn.execute(sa.text(SCHEDULE_0012), {"id": "tenant-2", "task": "export", "removed": 1})
            for id_, name, sent in (
                ("unsent-live", "tenant-1", None),
                ("unsent-removed", "tenant-2", None),
                ("unsent-job", "nightly", None),
                ("sent", "tenant-1", 5),
            ):
                conn.execute(
                    sa.text(INSERT_0012),
                    {"id": id_, "name": name, "next_try_ms": 10, "sent_ms": sent},
                )
        migrations._upgraded_under_a_round(db_engine, "0012", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == migrations.HEAD
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        with db_engine.connect() as conn:
            tasks = dict(conn.execute(sa.text("SELECT id, task FROM cronjob_outbox")).all())
        # A removed schedule's tombstone still names its task; a job's row has none.
        assert tasks == {
            "unsent-live": "export",
            "unsent-removed": "export",
            "unsent-job": None,
            "sent": None,
        }
        with db_engine.begin() as conn:
            # The task's publisher finds the removed schedule's row.
            due = lease.due_publications(conn, now_ms=100, limit=10, names=[], tasks=["export"])
            assert [row.id for row in due] == ["unsent-live", "unsent-removed"]
            assert lease.resolve_obsolete(conn, "unsent-removed", seen_next_try_ms=10, now_ms=50)
            assert lease.outbox_summary(conn).unsent == 2
            # Release 0012 beside: it records, reads and claims with its own columns.
            conn.execute(
                sa.text(INSERT_0012),
                {"id": "old-release", "name": "nightly", "next_try_ms": 20, "sent_ms": None},
            )
            seen = list(conn.execute(sa.text(DUE_0012), {"now": 100}).scalars())
            # (It still reads the obsolete row as unsent: it knows no obsolete_ms.)
            assert seen == ["unsent-job", "unsent-live", "unsent-removed", "old-release"]
            claimed = conn.execute(
                sa.text(CLAIM_0012), {"later": 90, "id": "old-release", "seen": 20}
            )
            assert claimed.rowcount == 1
            [row] = [
                r
                for r in lease.due_publications(conn, now_ms=100, limit=10)
                if r.id == "old-release"
            ]
            assert row.task is None and row.next_try_ms == 90
