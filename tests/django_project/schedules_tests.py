"""Run by Django's test runner (SQLite or PostgreSQL), from tests/test_django_schedules.py:
`cronjob.contrib.django.schedules` on Django's own connection, in its atomic blocks.

What a call wrote is read back on a connection of SQLAlchemy's own (not Django's), so a
row counts only once it is committed."""

import threading
from datetime import UTC, datetime

import sqlalchemy as sa
from django.db import connection, transaction
from django.test import TransactionTestCase
from ledger.models import Entry
from sqlalchemy.pool import NullPool

import lease
from cronjob import RegistrationError, ScheduleError
from cronjob.contrib.django import database_url, schedules

DAILY = "0 0 9 * * *"


def outside():
    """An engine of its own on Django's test database (sees committed rows only)."""
    return sa.create_engine(database_url(), poolclass=NullPool)


def committed():
    """Committed schedule rows (id -> removed), lease rows and the change counter."""
    engine = outside()
    try:
        with engine.connect() as conn:
            rows = dict(conn.execute(sa.text("SELECT id, removed FROM cronjob_schedule")).all())
            names = conn.execute(sa.text("SELECT name FROM cronjob_lease")).scalars().all()
            rev = lease.read_schedule_rev(conn)
        return {k: bool(v) for k, v in rows.items()}, sorted(names), rev
    finally:
        engine.dispose()


NOTHING = ({}, [], 0)


class Boom(Exception):
    pass


class TestSchedulesOnDjangosConnection(TransactionTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        engine = lease.create_engine(database_url())
        try:
            lease.migrate(engine)
        finally:
            engine.dispose()

    def setUp(self):
        # The lease tables are not Django's: its flush leaves them; each test starts clean.
        engine = outside()
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM cronjob_schedule"))
                conn.execute(sa.text("DELETE FROM cronjob_lease"))
                conn.execute(sa.text("UPDATE cronjob_schedule_rev SET rev = 0"))
        finally:
            engine.dispose()

    def entry(self, job):
        Entry.objects.create(job=job, instant="2027-01-04T09:00:00Z")

    def test_an_atomic_block_that_raises_after_adding_leaves_nothing(self):
        with self.assertRaises(Boom), transaction.atomic():
            self.entry("before")
            assert schedules.add("report:1", task="report", spec=DAILY, args={"t": 1})
            assert schedules.get("report:1") is not None  # seen inside the block
            self.entry("after")
            raise Boom
        assert Entry.objects.count() == 0
        assert committed() == NOTHING

    def test_an_atomic_block_that_commits_leaves_the_rows_and_nothing_before(self):
        with transaction.atomic():
            self.entry("before")  # a rollback by SQLAlchemy would lose this one
            schedules.add("report:1", task="report", spec=DAILY, args={"t": 1})
            assert connection.in_atomic_block
            assert committed() == NOTHING  # a COMMIT by SQLAlchemy would show it here
            schedules.add_many(
                [schedules.New(f"r:{i}", task="report", at=None, spec=DAILY) for i in range(3)]
            )
            self.entry("after")
            assert committed() == NOTHING
        assert sorted(Entry.objects.values_list("job", flat=True)) == ["after", "before"]
        assert committed() == (
            {"report:1": False, "r:0": False, "r:1": False, "r:2": False},
            ["r:0", "r:1", "r:2", "report:1"],
            2,
        )

    def test_postgresql_stays_in_djangos_transaction_after_a_call(self):
        if connection.vendor != "postgresql":
            self.skipTest("psycopg's transaction status is PostgreSQL's")
        from psycopg.pq import TransactionStatus

        with transaction.atomic():
            self.entry("before")
            schedules.add("report:1", task="report", spec=DAILY)
            assert connection.connection.info.transaction_status == TransactionStatus.INTRANS
            transaction.set_rollback(True)
        assert Entry.objects.count() == 0
        assert committed() == NOTHING

    def test_sqlite_sees_no_commit_or_rollback_but_djangos_own(self):
        if connection.vendor != "sqlite":
            self.skipTest("sqlite3's trace callback is SQLite's")
        statements = []
        with transaction.atomic():
            self.entry("before")
            connection.connection.set_trace_callback(statements.append)
            try:
                schedules.add("report:1", task="report", spec=DAILY)
                schedules.update("report:1", args={"t": 2})
                schedules.get("report:1")
            finally:
                connection.connection.set_trace_callback(None)
        ends = [s for s in statements if s.split()[0].upper() in ("COMMIT", "ROLLBACK", "BEGIN")]
        assert ends == [], ends  # the calls' savepoints are Django's (SAVEPOINT, RELEASE)
        assert any(s.startswith("SAVEPOINT") for s in statements), statements
        assert committed()[0] == {"report:1": False}

    def test_outside_an_atomic_block_each_call_commits_its_own_transaction(self):
        assert not connection.in_atomic_block
        schedules.add("report:1", task="report", spec=DAILY, using="default")
        assert committed() == ({"report:1": False}, ["report:1"], 1)
        assert schedules.update("report:1", args={"t": 2})
        assert schedules.remove("report:1")
        assert committed() == ({"report:1": True}, ["report:1"], 3)

    def test_a_refused_call_writes_nothing_and_leaves_the_block_usable(self):
        schedules.add("report:1", task="report", spec=DAILY)
        with transaction.atomic():
            self.entry("before")
            with self.assertRaisesRegex(RegistrationError, "'report:1' already exists"):
                schedules.add("report:1", task="report", spec=DAILY)
            with self.assertRaisesRegex(ScheduleError, "'report:2'.*never fires"):
                schedules.add("report:2", task="report", spec="0 0 0 30 2 *")
            self.entry("after")  # on PostgreSQL, only if the failed call left no error
        assert Entry.objects.count() == 2
        assert committed() == ({"report:1": False}, ["report:1"], 1)

    def test_get_list_update_remove(self):
        schedules.add("a:1", task="t1", spec=DAILY, args={"n": 1})
        schedules.add("a:2", task="t2", spec=DAILY)
        schedules.add("b:1", task="t1", spec=DAILY)
        record = schedules.get("a:1")
        assert record is not None and record.args == {"n": 1}
        assert isinstance(record, schedules.ScheduleRecord)
        assert [r.id for r in schedules.list(task="t1")] == ["a:1", "b:1"]
        assert [r.id for r in schedules.list(prefix="a:")] == ["a:1", "a:2"]
        assert schedules.update("a:1", spec="0 30 9 * * *")
        assert schedules.get("a:1").spec == "0 30 9 * * *"
        assert schedules.update("missing", spec=DAILY) is False
        assert schedules.remove("a:2") is True
        assert schedules.remove("a:2") is False
        assert schedules.get("a:2") is None
        assert schedules.add_many([schedules.New("c:1", task="t1", spec=DAILY)]) == 1

    def test_now_stamps_each_write_and_the_commit_a_timing_change_moves(self):
        added, changed, removed = (datetime(2026, 3, 2, h, 30, tzinfo=UTC) for h in (9, 10, 11))
        schedules.add("n:1", task="t1", spec=DAILY, now=added)
        assert schedules.add_many([schedules.New("n:2", task="t1", spec=DAILY)], now=added) == 1
        assert schedules.update("n:1", spec="0 30 9 * * *", now=changed)
        record = schedules.get("n:1")
        assert (record.created, record.updated) == (added, changed)
        engine = outside()
        try:
            store = lease.LeaseStore(engine)
            rows = store.read(["n:1", "n:2"])
        finally:
            engine.dispose()
        assert (rows["n:1"].committed, rows["n:2"].committed) == (changed, added)
        assert schedules.remove("n:2", now=removed) is True

    def test_a_schedules_own_policies_are_added_updated_and_refused(self):
        schedules.add("p:1", task="t1", spec=DAILY, jitter=5, heartbeat="https://hc.io/k")
        record = schedules.get("p:1")
        assert (record.jitter.total_seconds(), record.heartbeat) == (5.0, "https://hc.io/k")
        assert schedules.update("p:1", overlap="buffer_one", jitter=None)
        record = schedules.get("p:1")
        assert (record.overlap, record.jitter) == ("buffer_one", None)
        with self.assertRaisesRegex(RegistrationError, r"^schedule 'p:2': catch_up must be"):
            schedules.add("p:2", task="t1", spec=DAILY, catch_up="never")
        assert schedules.get("p:2") is None

    def test_another_thread_uses_its_own_django_connection(self):
        errors = []

        def work():
            try:
                schedules.add("from-thread", task="t", spec=DAILY)
            except Exception as exc:  # reported below
                errors.append(exc)
            finally:
                connection.close()

        with transaction.atomic():
            self.entry("main")
            if connection.vendor == "sqlite":
                transaction.set_rollback(True)
            else:  # SQLite: the thread would wait for this block's write lock
                thread = threading.Thread(target=work)
                thread.start()
                thread.join(30)
                assert errors == [], errors
                assert committed()[0] == {"from-thread": False}  # its own commit
                transaction.set_rollback(True)
        assert Entry.objects.count() == 0
