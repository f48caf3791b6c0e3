"""The replicas' record (``cronjob_replica``) at scale (issue #31): its ``jobs`` column
holds every job's spec (~50 bytes a job), so it is written whole once per replica start
and then only its ``seen`` is refreshed (``lease/_history.py``, ``engine/_sweep.py``),
and the peers read a record's jobs once per replica start (``engine/_peers.py``).

Statements are counted on real databases, with a ``before_cursor_execute`` listener.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import MONDAY, ManualClock

import cronjob
import lease
import lease._records as lease_records
from cronjob import Registry, admin
from cronjob.testing import FakeClock
from tests._helpers import SweepingClock, replica_row

JOBS = 40


@pytest.fixture
def clock() -> FakeClock:
    return SweepingClock(MONDAY)


def quiet(ctx: cronjob.Round) -> None:
    """A job that does nothing."""


def registry(prefix: str, count: int = JOBS) -> Registry:
    """``count`` jobs named ``prefix-NN``, at minute 30 of the hour: none falls due in a
    test's few minutes from :data:`MONDAY` (9:00), so no lease is claimed."""
    jobs = Registry()
    for i in range(count):
        jobs.register(quiet, "0 30 * * * *", f"{prefix}-{i:02d}")
    return jobs


class Sent:
    """The statements sent on an engine while watched, with their parameters."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, list[Any]]] = []
        self._lock = threading.Lock()

    def before(self, conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("SET", "BEGIN")) or "set_config" in statement:
            return  # a transaction's or a session's set-up, not the store's statement
        values = list(parameters.values() if isinstance(parameters, dict) else parameters or ())
        with self._lock:
            self.statements.append((statement, values))

    def writes_of_the_record(self) -> list[tuple[str, list[Any]]]:
        return [
            (s, p)
            for s, p in self.statements
            if "cronjob_replica" in s and ("INSERT" in s or "UPDATE" in s)
        ]

    def reads_of_jobs(self) -> list[tuple[str, list[Any]]]:
        """The reads of records' jobs (the peers' fetch; the status's read)."""
        return [
            (s, p)
            for s, p in self.statements
            if s.lstrip().startswith("SELECT") and "cronjob_replica.jobs" in s
        ]

    def reads_of_starts(self) -> list[str]:
        return [s for s, _ in self.statements if "cronjob_replica.started_ms" in s.split("FROM")[0]]


@contextmanager
def watching(engine: sa.Engine) -> Iterator[Sent]:
    sent = Sent()
    sa.event.listen(engine, "before_cursor_execute", sent.before)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", sent.before)


def replica_status(url: str, clock: FakeClock, replica: str) -> admin.ReplicaStatus:
    [found] = [r for r in admin.status(url, now=clock.now()).replicas if r.id == replica]
    return found


def delete_records(url: str) -> None:
    engine = lease.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM cronjob_replica"))
    finally:
        engine.dispose()


class TestTheStore:
    @staticmethod
    def replica(now: Any, jobs: int = 300) -> lease.ReplicaRow:
        return replica_row(now, jobs, "0 30 * * * *")

    def test_a_refresh_writes_only_seen_in_as_many_statements_and_a_gone_record_whole(
        self, migrated_engine, manual_clock: ManualClock
    ):
        store = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        store.ensure(["job-00000"])
        replica = self.replica(manual_clock.now())
        with watching(migrated_engine) as whole:
            store.survey(["job-00000"], replica=replica)
        manual_clock.advance(15)
        with watching(migrated_engine) as refreshed:
            store.survey(["job-00000"], replica=replica, refresh=True)
        [row] = store.replicas(seen_since_ms=0)
        assert (row.started, row.seen) == (replica.started, manual_clock.now())
        assert row.jobs == replica.jobs
        # As many statements as the whole upsert (PostgreSQL: 1, in the survey's), none
        # carrying the jobs (the survey names job-00000 only).
        assert len(refreshed.statements) == len(whole.statements)
        assert [s for s in whole.statements if "job-00299" in repr(s)]  # it can see them
        assert not [s for s in refreshed.statements if "job-00299" in repr(s) or "spec" in repr(s)]
        if migrated_engine.dialect.name == "postgresql":
            [(statement, _)] = refreshed.statements
            assert "UPDATE cronjob_replica" in statement and "cronjob_lease" in statement

        delete_records(migrated_engine.url.render_as_string(hide_password=False))
        manual_clock.advance(15)
        with watching(migrated_engine) as rewritten:
            store.survey(["job-00000"], replica=replica, refresh=True)
        [row] = store.replicas(seen_since_ms=0)
        assert (row.started, row.seen, row.jobs) == (
            replica.started,
            manual_clock.now(),
            replica.jobs,
        )
        assert len(rewritten.statements) == len(whole.statements) + 1

    def test_a_refresh_without_names_refreshes_and_rewrites_alike(
        self, migrated_engine, manual_clock: ManualClock
    ):
        store = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        replica = self.replica(manual_clock.now(), jobs=3)
        store.survey([], replica=replica, refresh=True)  # none on record: written whole
        manual_clock.advance(15)
        with watching(migrated_engine) as refreshed:
            store.survey([], replica=replica, refresh=True)
        [row] = store.replicas(seen_since_ms=0)
        assert (row.seen, row.jobs) == (manual_clock.now(), replica.jobs)
        assert len(refreshed.statements) == 1
        assert "job-" not in repr(refreshed.statements)

    def test_the_starts_read_no_jobs_and_a_read_of_some_holders_reads_only_theirs(
        self, migrated_engine, manual_clock: ManualClock
    ):
        store = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        now = manual_clock.now()
        for holder in ("a", "b", "c"):
            store.record_replica(
                lease.ReplicaRow(
                    holder=holder,
                    host="h",
                    pid=1,
                    version="v",
                    started=now + timedelta(seconds=ord(holder)),
                    seen=now,
                    jobs={f"{holder}-job": ("0 30 * * * *", True)},
                )
            )
        since = int(now.timestamp() * 1000)
        with watching(migrated_engine) as sent:
            starts = store.replica_starts(seen_since_ms=since)
        assert starts == {h: now + timedelta(seconds=ord(h)) for h in ("a", "b", "c")}
        assert not sent.reads_of_jobs()
        assert [r.holder for r in store.replicas(seen_since_ms=since, holders=["c", "a"])] == [
            "a",
            "c",
        ]
        assert store.replica_starts(seen_since_ms=since + 1) == {}


class TestLeasing:
    """``LeaseStore.leasing``: which replicas that started run a job of the reader's,
    the peers' one question about a record (``lease/_records.py`` ``lists_one_of``)."""

    def test_it_tells_each_holder_whether_it_leases_one_of_the_jobs(
        self, migrated_engine, manual_clock: ManualClock
    ):
        store = lease.LeaseStore(migrated_engine, clock=manual_clock.now)
        now = manual_clock.now()
        mine = {f"job-{i:05}": "0 * * * * *" for i in range(300)}
        records = {
            "same": {name: (spec, True) for name, spec in mine.items()},
            "other-spec": {"job-00123": ("5 * * * * *", True), "x": ("0 * * * * *", True)},
            "per-instance": {"job-00123": ("0 * * * * *", False)},
            "others": {"x": ("0 * * * * *", True)},
        }
        for holder in ("stale", *records):  # "stale": seen 1 s before the others
            jobs = records.get(holder, records["same"])
            row = lease.ReplicaRow(
                holder=holder, host="h", pid=1, version="v", started=now, seen=now, jobs=jobs
            )
            store.record_replica(row)
            if holder == "stale":
                manual_clock.advance(1)
        since = int(manual_clock.now().timestamp() * 1000)
        with watching(migrated_engine) as sent:
            found = store.leasing(["stale", *records], mine, seen_since_ms=since)
        assert len(sent.statements) == 1
        assert found == {
            "same": (now, True),
            "other-spec": (now, True),  # parsed: the same job on another spec
            "per-instance": (now, False),
            "others": (now, False),
        }
        assert store.leasing([], mine, seen_since_ms=since) == {}

    def test_a_record_of_the_same_deployment_is_answered_from_its_text(self):
        mine = {f"job-{i:05}": "0 * * * * *" for i in range(300)}
        policies = {"job-00000": {"timeout": 5.0}}
        text = lease_records.jobs_json({n: (spec, True) for n, spec in mine.items()}, policies)
        needles = lease_records.job_needles(mine)
        assert 1 < len(needles) <= 16
        assert all(needle[1:] in text for needle in needles)
        assert any(needle in text for needle in needles)
        assert lease_records.lists_one_of(text, mine, needles)
        # A needle within a string value (its quotes escaped there) is not an entry.
        hidden = lease_records.jobs_json({"x": (needles[0], True)})
        assert not lease_records.lists_one_of(hidden, mine, needles)
        # Nor the end of another key: job 'x"job-00000' is not job-00000.
        tail = lease_records.jobs_json({f'x"{name}': (spec, True) for name, spec in mine.items()})
        assert not lease_records.lists_one_of(tail, mine, needles)
        assert lease_records.lists_one_of(text.encode(), mine, needles)
        assert not lease_records.lists_one_of(None, mine, needles)
        assert not lease_records.lists_one_of("not json", mine, needles)


class TestTheSweep:
    def test_later_sweeps_refresh_only_seen_and_send_no_job(self, db_url, replicas, clock):
        with watching(engine := lease.create_engine(db_url)) as sent:
            replicas(registry("job"), "a", database=engine)
            clock.advance(46)  # the sweeps at 0, 15, 30, 45 s
        engine.dispose()
        writes = sent.writes_of_the_record()
        assert len(writes) == 4, writes
        first, *later = writes
        assert '"spec":"0 30 * * * *"' in repr(first)  # the first sweep writes it whole
        for statement, parameters in later:
            assert '"spec"' not in repr(parameters) and "INSERT" not in statement
            assert "UPDATE cronjob_replica SET seen_ms" in statement
            if db_url.startswith("postgresql"):  # still in the survey's statement
                assert "cronjob_lease" in statement
        status = replica_status(db_url, clock, "a")
        assert status.last_seen == clock.now() - timedelta(seconds=1)
        assert status.started == MONDAY
        assert len(status.jobs) == JOBS

    def test_a_record_deleted_by_hand_is_written_back_whole_at_the_next_sweep(
        self, db_url, replicas, clock
    ):
        replicas(registry("job"), "a")
        clock.advance(16)  # two sweeps: the record written whole, then refreshed
        delete_records(db_url)
        assert admin.status(db_url, now=clock.now()).replicas == ()
        clock.advance(15)
        status = replica_status(db_url, clock, "a")
        assert status.jobs == tuple(f"job-{i:02d}" for i in range(JOBS))
        assert (status.started, status.last_seen) == (MONDAY, clock.now() - timedelta(seconds=1))
        clock.advance(15)  # refreshed again
        assert replica_status(db_url, clock, "a").last_seen == clock.now() - timedelta(seconds=1)

    def test_the_status_shows_each_replicas_jobs_while_their_records_are_refreshed(
        self, db_url, replicas, clock
    ):
        replicas(registry("x", 5), "a")
        replicas(registry("y", 7), "b")
        clock.advance(61)  # more than a minute: only the refreshes keep them live
        status = admin.status(db_url, now=clock.now())
        assert {r.id: r.jobs for r in status.replicas} == {
            "a": tuple(f"x-{i:02d}" for i in range(5)),
            "b": tuple(f"y-{i:02d}" for i in range(7)),
        }
        assert {r.last_seen for r in status.replicas} == {clock.now() - timedelta(seconds=1)}


class TestThePeers:
    def test_repeated_reads_fetch_each_replicas_jobs_once(self, db_url, replicas, clock):
        jobs = registry("job")
        with watching(engine := lease.create_engine(db_url)) as sent:
            replicas(jobs, "a", database=engine)
            replicas(jobs, "b")
            replicas(jobs, "c")
            clock.advance(20)  # reads while the views settle
        engine.dispose()
        assert len(sent.reads_of_starts()) >= 3
        fetched = [v for _, values in sent.reads_of_jobs() for v in values if v in ("a", "b", "c")]
        assert sorted(fetched) == ["b", "c"]  # each once; its own never

    def test_a_replica_started_again_with_other_jobs_is_seen_with_them(
        self, db_url, replicas, clock
    ):
        b = replicas(registry("y"), "b")
        clock.advance(0)  # b is on record, with jobs that are not a's
        a = replicas(registry("x"), "a")
        clock.advance(0.5)
        peers = a._dispatcher.peers
        assert peers.view == ("a",)
        b.stop()
        clock.advance(0.5)
        replicas(registry("x"), "b")  # the same id, a's jobs: on record at 9:00:01
        clock.advance(2)  # a reads again (2.1 s after its first read): b is read anew
        assert peers.view == ("a", "b")
