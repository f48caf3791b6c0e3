"""The reads every replica repeats reach only the rows they are about, never the whole
lease table: the database's cost per instant must not grow with replicas times jobs.

- the sweep's survey (every 15 s) reads the rounds not run to their end, by an index;
- the peers' read of the holders reads the claims since a recent instant, by an index;
  after the first, it asks each replica it knows of for its latest claim: a probe each;
- the check of the lease rows reads every row once an hour (never at start: the start-up
  made them), and in between only the rows of the jobs a claim missed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import lease
from cronjob.engine._control import Control, Inbox
from cronjob.engine._rowcheck import CHECK_EVERY, CHECK_MAX, FULL_CHECK_EVERY, RowCheck
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
JOBS = 3000


@pytest.fixture
def store(migrated_engine: sa.Engine, clock: FakeClock) -> lease.LeaseStore:
    return lease.LeaseStore(migrated_engine, clock=clock.lease_clock())


def _statements(engine: sa.Engine, call: Any) -> list[tuple[str, Any]]:
    """The statements ``call()`` sent, with their parameters as the driver took them."""
    sent: list[tuple[str, Any]] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT") and "FROM cronjob_lease" in statement:
            sent.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    return sent


def _scans_whole_table(engine: sa.Engine, statement: str, parameters: Any) -> str | None:
    """The plan's line that reads every row of the lease table, or ``None``."""
    dialect = engine.dialect.name
    with engine.connect() as conn:
        if dialect == "postgresql":
            [[plan]] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)
            text = json.dumps(plan)
            return "Seq Scan on cronjob_lease" if '"Seq Scan"' in text else None
        if dialect == "sqlite":
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
            for row in rows:
                if row[-1].startswith("SCAN cronjob_lease") and "INDEX" not in row[-1]:
                    return str(row[-1])
            return None
        result = conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
        for row in result:
            if row["table"] == "cronjob_lease" and row["type"] == "ALL":
                return str(dict(row))
        return None


def _analyze(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "ANALYZE TABLE cronjob_lease"
            if engine.dialect.name in ("mysql", "mariadb")
            else "ANALYZE cronjob_lease"
        )


class TestPlans:
    """On a table of 3,000 jobs of which a few run: the plans the databases choose."""

    @pytest.fixture
    def busy(self, store: lease.LeaseStore, migrated_engine: sa.Engine, clock: FakeClock) -> None:
        names = [f"job-{i:05d}" for i in range(JOBS)]
        store.ensure(names)
        clock.advance_to(START)
        # Claimed by "old" five minutes ago, their rounds long done: written straight from
        # "new", as an index entry of a row that ran would linger on MariaDB until its
        # purge (every round's does, and the purge keeps up; a test would wait for it).
        epoch = int((START - timedelta(minutes=5)).timestamp())
        with migrated_engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE cronjob_lease SET state = 'done', holder = 'old', instant = :i"),
                {"i": epoch},
            )
        store.claim_batch(names[:5], START, "now")  # five rounds in flight
        _analyze(migrated_engine)

    def test_the_survey_for_rounds_cut_short_reads_by_the_index(
        self, busy: None, store: lease.LeaseStore, migrated_engine: sa.Engine
    ):
        names = [f"job-{i:05d}" for i in range(JOBS)]
        [(statement, parameters)] = _statements(migrated_engine, lambda: store.survey(names))
        assert _scans_whole_table(migrated_engine, statement, parameters) is None

    def test_the_holders_since_a_recent_instant_are_read_by_the_index(
        self, busy: None, store: lease.LeaseStore, migrated_engine: sa.Engine
    ):
        found: dict[str, datetime] = {}
        [(statement, parameters)] = _statements(
            migrated_engine, lambda: found.update(store.holders(START - timedelta(seconds=5)))
        )
        assert found == {"now": START}
        assert _scans_whole_table(migrated_engine, statement, parameters) is None

    def test_the_holders_asked_for_are_probed_one_step_of_the_index_each(
        self, busy: None, store: lease.LeaseStore, migrated_engine: sa.Engine
    ):
        """The read the peers make after their first: of each replica named, its latest
        claim since a recent instant. Whatever the number of rows claimed, the plan walks
        the index on (holder, instant) and stops at each holder's first row."""
        since = START - timedelta(seconds=5)
        found: dict[str, datetime] = {}
        [(statement, parameters)] = _statements(
            migrated_engine,
            lambda: found.update(store.holders(since, among=["now", "old", "never-seen"])),
        )
        # "old" claimed five minutes ago (before since); "never-seen" claimed nothing.
        assert found == {"now": START}
        assert _scans_whole_table(migrated_engine, statement, parameters) is None
        assert _uses_index(migrated_engine, statement, parameters, HOLDER_INDEX)
        assert store.holders(START - timedelta(minutes=6), among=["old", "now"]) == {
            "now": START,
            "old": START - timedelta(minutes=5),
        }
        assert store.holders(since, among=[]) == {}

    def test_more_holders_than_one_query_probes_are_all_read(
        self, store: lease.LeaseStore, clock: FakeClock
    ):
        names = [f"job-{i:03d}" for i in range(250)]
        store.ensure(names)
        clock.advance_to(START)
        for i, name in enumerate(names):
            store.claim_batch([name], START, f"replica-{i:03d}")
        holders = [f"replica-{i:03d}" for i in range(250)]
        found = store.holders(START, among=[*holders, "nobody"])
        assert found == dict.fromkeys(holders, START)


def _uses_index(engine: sa.Engine, statement: str, parameters: Any, index: str) -> bool:
    """Whether the plan of ``statement`` reads the lease table through ``index``."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            [[plan]] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)
            return index in json.dumps(plan)
        if engine.dialect.name == "sqlite":
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
            return any(index in str(row[-1]) for row in rows)
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
        return any(row["key"] == index for row in rows)


HOLDER_INDEX = "ix_cronjob_lease_holder_instant"


class TestRowCheck:
    @pytest.fixture
    def checked(
        self, store: lease.LeaseStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[list[list[str]]]:
        """The names each check asked the lease table about."""
        asked: list[list[str]] = []
        missing = lease.LeaseStore.missing

        def counted(self: lease.LeaseStore, names: Any) -> list[str]:
            names = list(names)
            asked.append(names)
            return missing(self, names)

        monkeypatch.setattr(lease.LeaseStore, "missing", counted)
        yield asked

    def test_every_row_hourly_and_in_between_only_the_rows_claims_missed(
        self, store: lease.LeaseStore, clock: FakeClock, checked: list[list[str]]
    ):
        names = dict.fromkeys(["a", "b", "c"])
        store.ensure(list(names))
        inbox = Inbox(clock)
        control = Control(clock, inbox)
        check = RowCheck(clock=clock, store=store, control=control, names=names, states={})

        def minute(seconds: float = CHECK_EVERY) -> None:
            clock.advance(seconds)
            check.tick(clock.monotonic())
            clock.advance(0)  # the check's statements settle
            inbox.run_pending()

        check.suspect(["b"])  # before the database is ready: nothing to remember
        check.begin()
        minute(0)
        assert checked == [], "the start-up's ensure has just made every row"
        with store.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM cronjob_lease WHERE name = 'b'"))
        minute()
        assert checked == [], "a minute with no missed claim reads no row"
        check.suspect(["b", "gone-since"])  # a claim missed them; one is no job of ours
        minute()
        assert checked == [["b"]]
        assert store.missing(["b"]) == [], "the missing row was recreated"
        checked.clear()
        for _ in range(int(FULL_CHECK_EVERY // CHECK_EVERY) - 3):  # up to 59 minutes on
            minute()
        assert checked == [], "within the hour, no missed claim, no read of the rows"
        minute()
        assert checked == [["a", "b", "c"]], "an hour after the last, every row is read"
        control.shutdown(wait=5)

    def test_of_many_names_missed_a_check_reads_a_few_and_finds_a_gone_row_in_minutes(
        self, store: lease.LeaseStore, clock: FakeClock, checked: list[list[str]]
    ):
        """Claims that lose thousands of jobs to other replicas (views that disagree, a
        loaded replica's share taken as the rest) name them all: a check reads at most
        CHECK_MAX of them, a new draw each minute, and a gone row, missed by every claim
        of its job, is among the names each minute and found within a few."""
        names = dict.fromkeys(f"job-{i:04d}" for i in range(4 * CHECK_MAX))
        store.ensure(list(names))
        inbox = Inbox(clock)
        control = Control(clock, inbox)
        check = RowCheck(clock=clock, store=store, control=control, names=names, states={})
        check.begin()
        clock.advance(0)
        check.tick(clock.monotonic())
        clock.advance(0)
        inbox.run_pending()
        with store.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM cronjob_lease WHERE name = 'job-0007'"))
        draws: list[list[str]] = []
        while "job-0007" not in [name for draw in draws for name in draw]:
            assert len(draws) < 10, "the gone row was not drawn within ten minutes"
            checked.clear()
            check.suspect(list(names))  # every claim of the minute lost them all
            clock.advance(CHECK_EVERY)
            check.tick(clock.monotonic())
            clock.advance(0)
            inbox.run_pending()
            [draw] = checked
            assert len(draw) == CHECK_MAX
            assert draw not in draws, "each minute draws anew"
            draws.append(draw)
        checked.clear()
        assert store.missing(["job-0007"]) == [], "the gone row was recreated"
        control.shutdown(wait=5)


class TestARoundsEnd:
    def test_the_end_of_rounds_finds_its_rows_by_name_not_by_the_unfinished_index(
        self, postgres_url: str, clock: FakeClock
    ):
        """The partial index covers the survey's whole condition, which a round's end (a
        state and a token by name) does not imply: PostgreSQL keeps to the primary key,
        instead of reading every running row for each batch of ends."""
        engine = lease.create_engine(postgres_url)
        try:
            lease.migrate(engine)
            store = lease.LeaseStore(engine, clock=clock.lease_clock())
            names = [f"job-{i:05d}" for i in range(JOBS)]
            store.ensure(names)
            clock.advance_to(START)
            batch = store.claim_batch(names[:100], START, "r")  # a hundred rounds run
            _analyze(engine)
            ends = [lease.Ending(name=name, token=batch.token, ended=START) for name in names[:40]]
            sent: list[tuple[str, Any]] = []

            def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
                if "UPDATE cronjob_lease" in statement:
                    sent.append((statement, parameters))

            sa.event.listen(engine, "before_cursor_execute", record)
            try:
                assert len(store.finish_many(ends)) == 40
            finally:
                sa.event.remove(engine, "before_cursor_execute", record)
            [(statement, parameters)] = sent
            with engine.begin() as conn:
                [[plan]] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)
                conn.rollback()
            text = json.dumps(plan)
            assert "ix_cronjob_lease_unfinished" not in text
        finally:
            engine.dispose()
