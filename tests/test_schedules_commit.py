"""A schedule made of data is owed its instants from its commit (issue 49), also while no
replica runs: added at 09:30, every replica back at 11:30, an hourly schedule runs its
11:00 instant (``catch_up="latest"``), 10:00 then 11:00 (``"all"``), 10:00 alone
(``"oldest"``) or nothing (``"none"``) before 12:00 — where before revision 0017 nothing
ran before 12:00. One whose spec changed is owed from the change, one removed and added
again from the re-add, one added while replicas run nothing from before its commit; a
lease row an older release wrote (no commit on record, or one behind a later change)
owes nothing from before its first deployment, as before.

Replicas on a fake clock, every write given the clock's ``now``, on each database at head.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import cronjob
import lease
from cronjob import ScheduleError, schedules
from cronjob.testing import FakeClock, crash
from tests.conftest import lease_row
from tests.test_async_transaction import as_async

#: Monday 2026-03-02 09:00 UTC.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOURLY = "0 0 * * * *"
#: Every hour at a quarter past.
QUARTER_PAST = "0 15 * * * *"


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return START.replace(hour=hour, minute=minute, second=second)


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = lease.create_engine(db_url)
    lease.migrate(engine)
    yield engine
    engine.dispose()


class Seen:
    """The instants the task's rounds ran, by schedule id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instants: dict[str, list[datetime]] = {}

    def __call__(self, ctx: cronjob.Round) -> None:
        with self.lock:
            self.instants.setdefault(ctx.name, []).append(ctx.instant)

    def of(self, id_: str) -> list[datetime]:
        with self.lock:
            return list(self.instants.get(id_, []))


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def registry(seen: Seen) -> cronjob.Registry:
    registry = cronjob.Registry()
    registry.register_task(seen, "report")
    return registry


#: The 09:30/11:30 example, by catch-up policy: what runs as the replicas come back.
OWED = [
    ("latest", [at(11)]),
    ("all", [at(10), at(11)]),
    ("oldest", [at(10)]),
    ("none", []),
]


class TestCommittedWhileNoReplicaRuns:
    @pytest.mark.parametrize(("catch_up", "owed"), OWED, ids=[c for c, _ in OWED])
    def test_it_is_owed_its_instants_from_the_commit_by_its_catch_up_policy(
        self, engine, replicas, registry, clock, seen, catch_up, owed
    ):
        clock.advance_to(at(9, 30))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up=catch_up, now=clock.now()
        )
        clock.advance_to(at(11, 30))  # no replica ran at 10:00 nor at 11:00
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(1)  # with "all", 10:00 and then 11:00, one at a time
        assert seen.of("report:42") == owed
        clock.advance_to(at(12, 0, 30))
        assert seen.of("report:42") == [*owed, at(12)]  # then on time

    def test_the_tasks_policy_decides_when_the_schedule_sets_none(
        self, engine, replicas, clock, seen
    ):
        registry = cronjob.Registry()
        registry.register_task(seen, "report", catch_up="all")
        clock.advance_to(at(9, 30))
        schedules.add(engine, "report:42", task="report", spec=HOURLY, now=clock.now())
        clock.advance_to(at(11, 30))
        replicas(registry, "a")
        clock.advance(1)
        assert seen.of("report:42") == [at(10), at(11)]

    def test_its_catch_up_window_bounds_what_the_commit_owes(
        self, engine, replicas, registry, clock, seen
    ):
        clock.advance_to(at(9, 30))
        schedules.add(
            engine,
            "report:42",
            task="report",
            spec=HOURLY,
            catch_up="all",
            catch_up_window=3600,
            now=clock.now(),
        )
        clock.advance_to(at(11, 30))  # 10:00 lies more than an hour back
        replicas(registry, "a")
        clock.advance(1)
        assert seen.of("report:42") == [at(11)]

    def test_an_instant_at_the_very_moment_of_the_commit_is_not_owed(
        self, engine, replicas, registry, clock, seen
    ):
        clock.advance_to(at(10))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        clock.advance_to(at(10, 30))
        replicas(registry, "a")
        clock.advance(1)
        assert seen.of("report:42") == []


class TestAddedWhileReplicasRun:
    def test_nothing_from_before_its_commit_is_owed_then_nor_at_a_restart(
        self, engine, replicas, registry, clock, seen
    ):
        first = replicas(registry, "a")
        clock.advance_to(at(9, 30))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        clock.advance_to(at(9, 40))
        assert seen.of("report:42") == []  # 09:00 came before the commit
        crash(first)
        clock.advance_to(at(9, 50))
        replicas(registry, "b")
        clock.advance(1)
        assert seen.of("report:42") == []  # nor is it owed at a restart
        clock.advance_to(at(10, 0, 30))
        assert seen.of("report:42") == [at(10)]


class TestReplaced:
    @pytest.mark.parametrize("how", ["update", "replace"])
    def test_a_changed_spec_is_owed_from_the_change_not_from_its_first_commit(
        self, engine, replicas, registry, clock, seen, how
    ):
        clock.advance_to(at(9, 5))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        clock.advance_to(at(10, 30))  # 10:00 of the old spec passes with no replica
        if how == "update":
            assert schedules.update(engine, "report:42", spec=QUARTER_PAST, now=clock.now())
        else:
            schedules.add(
                engine,
                "report:42",
                task="report",
                spec=QUARTER_PAST,
                catch_up="all",
                if_exists="replace",
                now=clock.now(),
            )
        clock.advance_to(at(11, 40))
        replicas(registry, "a")
        clock.advance(1)
        # Not 09:15 nor 10:15 (after its first commit, before the change), nor 10:00 or
        # 11:00 (the old spec's): 11:15 alone.
        assert seen.of("report:42") == [at(11, 15)]

    def test_a_schedule_that_ran_is_owed_its_new_specs_instants_from_the_change(
        self, engine, replicas, registry, clock, seen
    ):
        first = replicas(registry, "a")
        clock.advance_to(at(9, 5))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        clock.advance_to(at(10, 10))
        first.stop()
        clock.advance_to(at(10, 30))
        assert schedules.update(engine, "report:42", spec=QUARTER_PAST, now=clock.now())
        clock.advance_to(at(12, 40))
        replicas(registry, "b")
        clock.advance(1)
        assert seen.of("report:42") == [at(10), at(11, 15), at(12, 15)]

    def test_a_replace_with_the_same_timing_keeps_its_first_commit(
        self, engine, replicas, registry, clock, seen
    ):
        clock.advance_to(at(9, 30))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        clock.advance_to(at(10, 30))  # an upsert at each start: the same spec, new args
        schedules.add(
            engine,
            "report:42",
            task="report",
            spec=HOURLY,
            catch_up="all",
            args={"v": 2},
            if_exists="replace",
            now=clock.now(),
        )
        clock.advance_to(at(11, 30))
        replicas(registry, "a")
        clock.advance(1)
        assert seen.of("report:42") == [at(10), at(11)]


class TestRemovedAndAddedAgain:
    def test_it_is_owed_from_the_re_add_never_from_its_former_life(
        self, engine, replicas, registry, clock, seen
    ):
        first = replicas(registry, "a")
        clock.advance_to(at(9, 5))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        clock.advance_to(at(10, 10))
        first.stop()
        clock.advance_to(at(10, 20))
        assert schedules.remove(engine, "report:42", now=clock.now())
        clock.advance_to(at(11, 30))  # 11:00 passes while it is removed
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        clock.advance_to(at(13, 40))
        replicas(registry, "b")
        clock.advance(1)
        assert seen.of("report:42") == [at(10), at(12), at(13)]


class TestOlderRelease:
    def test_a_row_with_no_commit_on_record_owes_nothing_from_before_its_deployment(
        self, engine, replicas, registry, clock, seen, db_url
    ):
        clock.advance_to(at(9, 30))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        with engine.begin() as conn:  # as a release before 0017 writes it: no commit
            conn.execute(sa.text("UPDATE cronjob_lease SET committed_ms = NULL"))
        assert lease_row(db_url, "report:42").committed is None
        clock.advance_to(at(11, 30))
        replicas(registry, "a")
        clock.advance(1)
        assert seen.of("report:42") == []
        clock.advance_to(at(12, 0, 30))
        assert seen.of("report:42") == [at(12)]

    def test_a_commit_behind_a_later_change_of_its_timing_is_not_used(
        self, engine, replicas, registry, clock, seen, db_url
    ):
        clock.advance_to(at(9, 30))
        schedules.add(
            engine, "report:42", task="report", spec=HOURLY, catch_up="all", now=clock.now()
        )
        clock.advance_to(at(10, 30))
        assert schedules.update(engine, "report:42", spec=QUARTER_PAST, now=clock.now())
        with engine.begin() as conn:
            # As a release before 0017 changes the spec: retimed (spec_ms), its
            # deployment cleared, and the commit of the timing before left as it was.
            conn.execute(
                sa.text("UPDATE cronjob_lease SET committed_ms = :c"), {"c": ms(at(9, 30))}
            )
        row = lease_row(db_url, "report:42")
        assert (row.committed, row.spec_changed, row.deployed) == (at(9, 30), at(10, 30), None)
        clock.advance_to(at(11, 40))
        replicas(registry, "a")
        clock.advance(1)
        assert seen.of("report:42") == []  # not 10:15 nor 11:15: owed from 11:40
        clock.advance_to(at(12, 15, 30))
        assert seen.of("report:42") == [at(12, 15)]


class TestTheWriteStampsItsNow:
    def test_now_stamps_the_row_and_the_commit_a_timing_change_moves(self, engine, clock, db_url):
        clock.advance_to(at(9, 30))
        schedules.add(engine, "report:42", task="report", spec=HOURLY, now=clock.now())
        record = schedules.get(engine, "report:42")
        assert record is not None and (record.created, record.updated) == (at(9, 30), at(9, 30))
        row = lease_row(db_url, "report:42")
        assert (row.committed, row.deployed, row.spec_changed) == (at(9, 30), None, None)
        clock.advance_to(at(10))
        assert schedules.update(engine, "report:42", args={"v": 2}, now=clock.now())
        record = schedules.get(engine, "report:42")
        assert record is not None and (record.created, record.updated) == (at(9, 30), at(10))
        assert lease_row(db_url, "report:42").committed == at(9, 30)  # no timing changed
        clock.advance_to(at(10, 15))
        assert schedules.update(engine, "report:42", end=at(23), now=clock.now())
        row = lease_row(db_url, "report:42")
        assert (row.committed, row.spec_changed) == (at(10, 15), at(10, 15))  # its window
        clock.advance_to(at(10, 30))
        assert schedules.update(engine, "report:42", spec=QUARTER_PAST, now=clock.now())
        row = lease_row(db_url, "report:42")
        assert (row.committed, row.spec_changed) == (at(10, 30), at(10, 30))
        clock.advance_to(at(11))
        assert schedules.remove(engine, "report:42", now=clock.now())
        with engine.connect() as conn:
            [tombstone] = lease.read_schedules(conn, ids=["report:42"], removed=True)
        assert (tombstone.removed, tombstone.updated) == (True, at(11))
        clock.advance_to(at(11, 30))
        schedules.add(engine, "report:42", task="report", spec=HOURLY, now=clock.now())
        record = schedules.get(engine, "report:42")
        assert record is not None and record.created == at(11, 30)  # a new life
        assert lease_row(db_url, "report:42").committed == at(11, 30)

    def test_add_many_and_add_async_stamp_their_now_too(self, engine, clock, db_url):
        clock.advance_to(at(9, 30))
        schedules.add_many(
            engine, [schedules.New("many", task="report", spec=HOURLY)], now=clock.now()
        )

        async def add_async() -> None:
            aengine = create_async_engine(as_async(db_url), poolclass=NullPool)
            try:
                await schedules.add_async(
                    aengine, "async", task="report", spec=HOURLY, now=at(9, 45)
                )
            finally:
                await aengine.dispose()

        asyncio.run(add_async())
        assert lease_row(db_url, "many").committed == at(9, 30)
        assert lease_row(db_url, "async").committed == at(9, 45)

    def test_a_naive_now_is_refused_and_nothing_is_written(self, engine):
        naive = datetime(2026, 3, 2, 9, 30)
        with pytest.raises(
            ScheduleError,
            match=r"^now 2026-03-02T09:30:00 is naive; give it a zone \(datetime\(\.\.\., "
            r"tzinfo=UTC\)\)$",
        ):
            schedules.add(engine, "report:42", task="report", spec=HOURLY, now=naive)
        with pytest.raises(TypeError, match=r"^now must be a datetime, not str$"):
            schedules.add(engine, "report:42", task="report", spec=HOURLY, now="09:30")  # type: ignore[arg-type]
        assert schedules.get(engine, "report:42") is None
