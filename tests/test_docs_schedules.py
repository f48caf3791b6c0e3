"""What the pages promise of schedules made of data (docs/concepts/data-schedules.md,
docs/how-to/tenant-schedules.md, docs/guarantees.md), on a fake clock with two replicas
sharing one SQLite file, as the pages' examples run them.

These run the scheduler's half of schedules made of data: replicas that read the rows
and run them. (The stored half, `cronjob.schedules`, is what the pages' first examples
run, in test_docs_examples.py.)
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import admin, schedules
from cronjob.testing import FakeClock

#: A Monday, 30 s past nine: every schedule below fires on whole minutes.
START = datetime(2026, 3, 2, 9, 0, 30, tzinfo=UTC)


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return START.replace(hour=hour, minute=minute, second=second)


class Rounds:
    """What the task saw, one entry per round started, from any replica's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: list[tuple[str, datetime, str, dict[str, object]]] = []

    def add(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.seen.append((ctx.name, ctx.instant, ctx.task, ctx.args))

    def instants(self, name: str) -> list[datetime]:
        return sorted(instant for seen, instant, _, _ in self.seen if seen == name)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def rounds() -> Rounds:
    return Rounds()


@pytest.fixture
def registry(rounds: Rounds, clock: FakeClock) -> cronjob.Registry:
    registry = cronjob.Registry()

    def report(ctx: cronjob.Round) -> None:
        rounds.add(ctx)

    def slow(ctx: cronjob.Round) -> None:
        rounds.add(ctx)
        ctx.wait(120)  # two minutes, unless the round is cancelled

    registry.register_task(report, "report")
    registry.register_task(slow, "slow")
    return registry


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[sa.Engine]:
    """The application's engine on the replicas' database, the lease tables at head."""
    engine = sa.create_engine(sqlite_url)
    lease.migrate(engine)
    yield engine
    engine.dispose()


@contextlib.contextmanager
def two_replicas(url: str, registry: cronjob.Registry, clock: FakeClock) -> Iterator[None]:
    with (
        cronjob.Scheduler(url, registry=registry, clock=clock, replica_id="web-1"),
        cronjob.Scheduler(url, registry=registry, clock=clock, replica_id="web-2"),
    ):
        yield


class TestOncePerInstant:
    def test_each_instant_of_each_schedule_runs_once_across_two_replicas(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        with two_replicas(sqlite_url, registry, clock):
            with engine.begin() as conn:
                for n in range(3):
                    schedules.add(
                        conn, f"report:{n}", task="report", spec="0 * * * * *", args={"n": n}
                    )
            clock.advance(10 * 60)
        runs = Counter((name, instant) for name, instant, _, _ in rounds.seen)
        assert runs and max(runs.values()) == 1
        for n in range(3):
            assert rounds.instants(f"report:{n}") == [at(9, m) for m in range(1, 11)]
        assert {(name, task, args["n"]) for name, _, task, args in rounds.seen} == {
            (f"report:{n}", "report", n) for n in range(3)
        }

    def test_a_one_off_runs_once_at_its_instant(self, sqlite_url, engine, registry, clock, rounds):
        with two_replicas(sqlite_url, registry, clock):
            schedules.add(engine, "remind:1", task="report", at=at(9, 3))
            clock.advance(10 * 60)
        assert rounds.instants("remind:1") == [at(9, 3)]


class TestTransactions:
    def test_a_rolled_back_add_runs_nothing_and_leaves_no_row(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        with two_replicas(sqlite_url, registry, clock):
            with pytest.raises(RuntimeError), engine.begin() as conn:
                schedules.add(conn, "report:gone", task="report", spec="0 * * * * *")
                raise RuntimeError("the signup failed")
            clock.advance(5 * 60)
        assert rounds.seen == []
        assert schedules.get(engine, "report:gone") is None
        with engine.connect() as conn:
            assert lease.leased_names(conn, ["report:gone"]) == set()

    def test_a_committed_add_reaches_the_running_replicas_without_a_restart(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        with two_replicas(sqlite_url, registry, clock):
            schedules.add(engine, "report:a", task="report", spec="0 * * * * *")
            clock.advance(60)  # 09:01:30: report:a has run once
            with engine.begin() as conn:
                schedules.add(conn, "report:b", task="report", spec="0 * * * * *")
            clock.advance(2 * 60)
        assert rounds.instants("report:a") == [at(9, 1), at(9, 2), at(9, 3)]
        assert rounds.instants("report:b") == [at(9, 2), at(9, 3)]


class TestChanges:
    def test_a_changed_spec_governs_from_the_next_instant(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        with two_replicas(sqlite_url, registry, clock):
            schedules.add(engine, "report:t", task="report", spec="0 0 * * * *")
            clock.advance_to(at(10, 0, 30))  # 10:00 ran
            assert schedules.update(engine, "report:t", spec="0 30 * * * *")
            clock.advance_to(at(12, 0, 30))
        assert rounds.instants("report:t") == [at(10, 0), at(10, 30), at(11, 30)]

    def test_the_old_specs_missed_instant_is_not_caught_up_after_a_change(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        schedules.add(engine, "report:t", task="report", spec="0 0 * * * *")
        with two_replicas(sqlite_url, registry, clock):
            clock.advance_to(at(10, 0, 30))  # 10:00 ran: the schedule has run before
        clock.advance_to(at(11, 10))  # every replica down across 11:00
        schedules.update(engine, "report:t", spec="0 30 * * * *")
        with two_replicas(sqlite_url, registry, clock):
            clock.advance_to(at(11, 40))
        # 11:00 was the old spec's, 10:30 the new spec's before the change: neither runs.
        assert rounds.instants("report:t") == [at(10, 0), at(11, 30)]

    def test_changed_args_reach_the_next_round(self, sqlite_url, engine, registry, clock, rounds):
        with two_replicas(sqlite_url, registry, clock):
            schedules.add(engine, "report:t", task="report", spec="0 * * * * *", args={"v": 1})
            clock.advance(60)
            schedules.update(engine, "report:t", args={"v": 2})
            clock.advance(60)
        assert [args for _, _, _, args in sorted(rounds.seen, key=lambda r: r[1])] == [
            {"v": 1},
            {"v": 2},
        ]

    def test_a_removed_schedule_starts_nothing_after_and_its_round_in_flight_ends(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        with two_replicas(sqlite_url, registry, clock):
            schedules.add(engine, "slow:t", task="slow", spec="0 */5 * * * *")
            clock.advance_to(at(9, 6))  # the 09:05 round waits until 09:07
            assert schedules.remove(engine, "slow:t")
            clock.advance_to(at(9, 20))
        assert rounds.instants("slow:t") == [at(9, 5)]
        [record] = admin.history(sqlite_url, "slow:t")
        assert (record.instant, str(record.outcome)) == (at(9, 5), "succeeded")
        assert schedules.get(engine, "slow:t") is None

    def test_a_schedule_added_paused_runs_once_resumed(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        with two_replicas(sqlite_url, registry, clock):
            schedules.add(engine, "report:p", task="report", spec="0 * * * * *", paused=True)
            clock.advance(3 * 60)
            assert rounds.seen == []
            admin.resume(sqlite_url, "report:p", by="ops", now=clock.now())
            clock.advance(2 * 60)
        assert rounds.instants("report:p") == [at(9, 4), at(9, 5)]


class TestCatchUp:
    def test_one_that_ran_or_was_committed_meanwhile_catches_up_its_latest_instant_once(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        schedules.add(engine, "report:ran", task="report", spec="0 0 * * * *")
        with two_replicas(sqlite_url, registry, clock):
            clock.advance_to(at(10, 0, 30))  # report:ran runs 10:00
        schedules.add(engine, "report:new", task="report", spec="0 0 * * * *", now=clock.now())
        clock.advance_to(at(13, 30))  # every replica down through 11:00, 12:00, 13:00
        with two_replicas(sqlite_url, registry, clock):
            clock.advance(0)
        assert rounds.instants("report:ran") == [at(10, 0), at(13, 0)]
        # Never ran, committed at 10:00:30: owed its latest instant since the commit.
        assert rounds.instants("report:new") == [at(13, 0)]

    def test_a_one_off_whose_instant_passed_unclaimed_within_the_day_runs_once(
        self, sqlite_url, engine, registry, clock, rounds
    ):
        schedules.add(engine, "remind:late", task="report", at=at(9, 3))
        schedules.add(engine, "remind:old", task="report", at=START - timedelta(days=2))
        clock.advance_to(at(11, 0))  # no replica up at 09:03
        with two_replicas(sqlite_url, registry, clock):
            clock.advance(60 * 60)
        assert rounds.instants("remind:late") == [at(9, 3)]
        assert rounds.instants("remind:old") == []  # more than a day ago


class TestArgs:
    def test_the_args_are_decoded_anew_at_each_read(self, sqlite_url, engine, clock):
        seen: list[dict[str, object]] = []
        registry = cronjob.Registry()

        def task(ctx: cronjob.Round) -> None:
            ctx.args["tenant"] = "changed"
            seen.append(ctx.args)

        registry.register_task(task, "task")
        with two_replicas(sqlite_url, registry, clock):
            schedules.add(engine, "t:1", task="task", spec="0 * * * * *", args={"tenant": 1})
            clock.advance(60)
        assert seen == [{"tenant": 1}]
