"""A schedule's own policies at run time: ``overlap``, ``catch_up`` (with its window),
``jitter`` and ``heartbeat`` set on a schedule made of data govern its rounds, while the
task's other schedules keep the task's; a change reaches running replicas.

Two or three replicas on one fake clock (conftest's, at 09:00 on a Monday) and one database
at head (``migrated_engine``), each of the three in turn.
Nothing sleeps in real time but the heartbeat's wait for its local HTTP endpoint.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

import cronjob
import lease
from cronjob import Registry, admin, schedules
from cronjob._jitter import jitter_delay
from cronjob.testing import FakeClock
from tests._helpers import run_then_stop

#: A Monday, on the hour (the ``clock`` fixture's start).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = "0 * * * * *"
HOURLY = "0 0 * * * *"


def at(hours: int = 0, minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes, seconds=seconds)


class Rounds:
    """A task's body that notes each round by schedule: (instant, replica, started,
    ended); ``first`` seconds of work for the first round of each schedule, 1 s after."""

    def __init__(self, clock: FakeClock, first: float = 1) -> None:
        self.clock = clock
        self.first = first
        self.lock = threading.Lock()
        self.seen: dict[str, list[list[object]]] = {}

    def __call__(self, ctx: cronjob.Round) -> None:
        with self.lock:
            mine = self.seen.setdefault(ctx.name, [])
            seconds = self.first if not mine else 1
            noted: list[object] = [ctx.instant, ctx.replica, self.clock.now(), None]
            mine.append(noted)
        try:
            if ctx.wait(seconds):
                ctx.check()
        finally:
            noted[3] = self.clock.now()

    def instants(self, id_: str) -> list[object]:
        return [seen[0] for seen in self.seen.get(id_, [])]

    def starts(self, id_: str) -> list[tuple[object, object]]:
        return [(seen[0], seen[2]) for seen in self.seen.get(id_, [])]

    def assert_never_overlapping(self, id_: str) -> None:
        mine = self.seen.get(id_, [])
        for before, after in itertools.pairwise(mine):
            assert before[3] is not None and before[3] <= after[2], (before, after)


def task(body: Callable[[cronjob.Round], object], **policy: object) -> Registry:
    registry = Registry()
    registry.register_task(body, "report", **policy)  # type: ignore[arg-type]
    return registry


def outcomes(url: str, id_: str) -> list[tuple[datetime, str, str]]:
    """The schedule's history, oldest first: (instant, why, outcome)."""
    return [(r.instant, str(r.why), str(r.outcome)) for r in reversed(admin.history(url, id_))]


class TestOverlap:
    def test_buffer_one_on_a_schedule_while_the_tasks_other_schedule_skips(
        self, migrated_engine, replicas, clock
    ):
        rounds = Rounds(clock, first=150)
        registry = task(rounds)
        replicas(registry, "a")
        replicas(registry, "b")
        schedules.add(migrated_engine, "own", task="report", spec=MINUTELY, overlap="buffer_one")
        schedules.add(migrated_engine, "plain", task="report", spec=MINUTELY)
        clock.advance(60 + 200)  # 09:01 runs to 09:03:30; 09:02 waits (own only); 09:04
        assert rounds.instants("own") == [at(minutes=1), at(minutes=2), at(minutes=4)]
        assert rounds.starts("own")[1] == (at(minutes=2), at(minutes=3, seconds=30))
        assert rounds.instants("plain") == [at(minutes=1), at(minutes=4)]
        rounds.assert_never_overlapping("own")

    def test_cancel_other_on_a_schedule_supersedes_its_round_only(
        self, db_url, migrated_engine, replicas, clock
    ):
        rounds = Rounds(clock, first=90)
        registry = task(rounds)
        replicas(registry, "a")
        replicas(registry, "b")
        schedules.add(migrated_engine, "own", task="report", spec=MINUTELY, overlap="cancel_other")
        schedules.add(migrated_engine, "plain", task="report", spec=MINUTELY)
        clock.advance(60 + 121)  # to 09:03:01
        assert [(i, o) for i, _why, o in outcomes(db_url, "own")] == [
            (at(minutes=1), "superseded"),
            (at(minutes=2), "succeeded"),
            (at(minutes=3), "succeeded"),
        ]
        assert [(i, o) for i, _why, o in outcomes(db_url, "plain")] == [
            (at(minutes=1), "succeeded"),
            (at(minutes=3), "succeeded"),
        ]
        rounds.assert_never_overlapping("own")

    def test_a_schedules_skip_overrides_its_tasks_buffer_one(
        self, migrated_engine, replicas, clock
    ):
        rounds = Rounds(clock, first=150)
        registry = task(rounds, overlap="buffer_one")
        replicas(registry, "a")
        replicas(registry, "b")
        schedules.add(migrated_engine, "own", task="report", spec=MINUTELY, overlap="skip")
        schedules.add(migrated_engine, "plain", task="report", spec=MINUTELY)
        clock.advance(60 + 200)
        assert rounds.instants("own") == [at(minutes=1), at(minutes=4)]
        assert rounds.instants("plain") == [at(minutes=1), at(minutes=2), at(minutes=4)]


class TestCatchUp:
    def test_none_all_within_a_window_and_the_tasks_latest_side_by_side(
        self, db_url, migrated_engine, replicas, clock
    ):
        rounds = Rounds(clock)
        registry = task(rounds)
        schedules.add(migrated_engine, "none", task="report", spec=HOURLY, catch_up="none")
        schedules.add(
            migrated_engine, "all", task="report", spec=HOURLY, catch_up="all", catch_up_window=7200
        )
        schedules.add(migrated_engine, "plain", task="report", spec=HOURLY)
        run_then_stop(replicas, registry, 3600 + 5)  # 10:00 runs
        clock.advance(4 * 3600 + 1800)  # down through 11:00 .. 14:00; now 14:30:05
        replicas(registry, "b")
        replicas(registry, "c")
        clock.advance(10)
        assert rounds.instants("none") == [at(hours=1)]
        # Within two hours of 14:30: 13:00 and 14:00, oldest first, one at a time.
        assert rounds.instants("all") == [at(hours=1), at(hours=4), at(hours=5)]
        rounds.assert_never_overlapping("all")
        assert rounds.instants("plain") == [at(hours=1), at(hours=5)]
        # 11:00 and 12:00, past the window, are on record as skipped by it.
        assert [(why, o) for _i, why, o in outcomes(db_url, "all")][:2] == [
            ("schedule", "succeeded"),
            ("skipped", "catch_up_window"),
        ]
        assert [why for _i, why, _o in outcomes(db_url, "all")][2:] == ["catch-up", "catch-up"]
        assert [(i, o) for i, why, o in outcomes(db_url, "none") if why == "skipped"] == [
            (at(hours=5), "catch_up=none")
        ]
        clock.advance(3600)  # 15:00 on time, for each
        for id_ in ("none", "all", "plain"):
            assert rounds.instants(id_)[-1] == at(hours=6), id_

    def test_oldest_runs_the_oldest_missed_then_the_next_to_come_the_rest_on_record(
        self, db_url, migrated_engine, replicas, clock
    ):
        rounds = Rounds(clock)
        registry = task(rounds)
        schedules.add(
            migrated_engine,
            "oldest",
            task="report",
            spec=HOURLY,
            catch_up="oldest",
            catch_up_window=4 * 3600,
        )
        run_then_stop(replicas, registry, 3600 + 5)  # 10:00 runs
        clock.advance(4 * 3600 + 1800)  # down through 11:00 .. 14:00; now 14:30:05
        replicas(registry, "b")
        replicas(registry, "c")
        clock.advance(10)
        # Within 4 hours of 14:30: 11:00 .. 14:00 owed; the oldest, 11:00, runs once.
        assert rounds.instants("oldest") == [at(hours=1), at(hours=2)]
        assert set(outcomes(db_url, "oldest")[1:]) == {
            (at(hours=2), "catch-up", "succeeded"),
            (at(hours=5), "skipped", "catch_up=oldest"),  # 12:00 through 14:00
        }
        [job] = [j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "oldest"]
        assert job.missed == 0  # the instants passed over are no alarm
        clock.advance(3600)  # 15:00 on time: no chain of the instants passed over
        assert rounds.instants("oldest") == [at(hours=1), at(hours=2), at(hours=6)]


class TestJitter:
    def test_a_schedules_jitter_delays_its_rounds_by_its_ids_draw_on_every_replica(
        self, db_url, migrated_engine, replicas, clock
    ):
        rounds = Rounds(clock)
        registry = task(rounds, jitter=50)
        replicas(registry, "a")
        replicas(registry, "b")
        schedules.add(migrated_engine, "own", task="report", spec=MINUTELY, jitter=20)
        schedules.add(migrated_engine, "plain", task="report", spec=MINUTELY)
        first = at(minutes=1) + jitter_delay(
            "own", at(minutes=1), timedelta(seconds=20), at(minutes=2)
        )
        theirs = at(minutes=1) + jitter_delay(
            "plain", at(minutes=1), timedelta(seconds=50), at(minutes=2)
        )
        assert first != theirs
        clock.advance_to(at(minutes=1, seconds=59))
        assert rounds.starts("own") == [(at(minutes=1), first)]
        assert first - at(minutes=1) < timedelta(seconds=20)
        assert rounds.starts("plain") == [(at(minutes=1), theirs)]
        [record] = admin.history(db_url, "own")
        assert (record.instant, record.started) == (at(minutes=1), first)

    def test_a_jitter_given_later_reaches_the_running_replicas(
        self, migrated_engine, replicas, clock
    ):
        rounds = Rounds(clock)
        registry = task(rounds)
        replicas(registry, "a")
        replicas(registry, "b")
        schedules.add(migrated_engine, "own", task="report", spec=MINUTELY)
        clock.advance_to(at(minutes=1, seconds=10))
        assert rounds.starts("own") == [(at(minutes=1), at(minutes=1))]
        schedules.update(migrated_engine, "own", jitter=40)
        clock.advance_to(at(minutes=2, seconds=59))
        delay = jitter_delay("own", at(minutes=2), timedelta(seconds=40), at(minutes=3))
        assert delay > timedelta(0)
        assert rounds.starts("own")[1:] == [(at(minutes=2), at(minutes=2) + delay)]
        schedules.update(migrated_engine, "own", jitter=None)  # the task's again: none
        clock.advance_to(at(minutes=3, seconds=59))
        assert rounds.starts("own")[2:] == [(at(minutes=3), at(minutes=3))]


class TestHeartbeat:
    def test_a_schedule_pings_its_own_url_where_its_task_has_none(
        self, migrated_engine, replicas, clock, endpoint
    ):
        def body(ctx: cronjob.Round) -> None:
            if ctx.args.get("fail"):
                raise RuntimeError("down")

        registry = task(body)
        replicas(registry, "a")
        replicas(registry, "b")
        schedules.add(
            migrated_engine, "ok", task="report", spec=MINUTELY, heartbeat=f"{endpoint.base}/ok"
        )
        schedules.add(migrated_engine, "plain", task="report", spec=MINUTELY)
        clock.advance(60 + 5)
        assert endpoint.wait_for(2) == ["/ok/start", "/ok"]
        schedules.add(
            migrated_engine,
            "bad",
            task="report",
            spec=MINUTELY,
            args={"fail": True},
            heartbeat=f"{endpoint.base}/bad",
        )
        clock.advance(60)
        pings = endpoint.wait_for(6)[2:]
        assert sorted(pings) == ["/bad/fail", "/bad/start", "/ok", "/ok/start"]

    def test_a_schedules_url_overrides_its_tasks_and_one_given_later_is_pinged(
        self, migrated_engine, replicas, clock, endpoint
    ):
        registry = task(lambda ctx: None, heartbeat=f"{endpoint.base}/task")
        replicas(registry, "a")
        schedules.add(
            migrated_engine, "own", task="report", spec=MINUTELY, heartbeat=f"{endpoint.base}/own"
        )
        clock.advance(60 + 5)
        assert endpoint.wait_for(2) == ["/own/start", "/own"]
        schedules.update(migrated_engine, "own", heartbeat=None)  # the task's again
        clock.advance(60)
        assert endpoint.wait_for(4)[2:] == ["/task/start", "/task"]

    def test_a_heartbeat_set_on_a_running_schedule_of_a_task_without_starts_pinging(
        self, migrated_engine, replicas, clock, endpoint
    ):
        """The replica was told of no heartbeat at start: the schedule's own makes it
        hear of successes too, from the change on."""
        registry = task(lambda ctx: None)
        replicas(registry, "a")
        schedules.add(migrated_engine, "own", task="report", spec=MINUTELY)
        clock.advance(60 + 5)
        assert endpoint.requests == []
        schedules.update(migrated_engine, "own", heartbeat=f"{endpoint.base}/own")
        clock.advance(60)
        assert endpoint.wait_for(2) == ["/own/start", "/own"]
        schedules.remove(migrated_engine, "own")
        clock.advance(120)
        assert endpoint.requests == ["/own/start", "/own"]


class TestPreviousFormat:
    def test_a_release_that_runs_format_1_leaves_a_policied_schedule_and_runs_the_rest(
        self, migrated_engine, replicas, clock, caplog, monkeypatch
    ):
        """What a replica of release 0010 does with the rows of this one (its
        ``SCHEDULE_FORMAT`` is 1): the real previous release is run beside this one in
        test_previous_release.py."""
        monkeypatch.setattr(lease, "SCHEDULE_FORMAT", 1)
        rounds = Rounds(clock)
        replicas(task(rounds), "old")
        schedules.add(migrated_engine, "own", task="report", spec=MINUTELY, jitter=5)
        schedules.add(migrated_engine, "plain", task="report", spec=MINUTELY)
        clock.advance(60 + 10)
        assert rounds.instants("own") == []
        assert rounds.instants("plain") == [at(minutes=1)]
        assert (
            "schedule 'own' is written in format 2, and this release runs format 1 at most"
            in caplog.text
        )
        schedules.update(migrated_engine, "own", jitter=None)  # format 1 again: run by it
        clock.advance(60)
        assert rounds.instants("own") == [at(minutes=2)]


class TestMalformed:
    def test_a_row_whose_policies_are_malformed_is_not_run_and_the_others_go_on(
        self, migrated_engine, replicas, clock, caplog
    ):
        rounds = Rounds(clock)
        replicas(task(rounds), "a")
        with migrated_engine.begin() as conn:
            schedules.add(conn, "edited", task="report", spec=MINUTELY, jitter=5)
            conn.execute(
                sa.text("UPDATE cronjob_schedule SET policies = :p WHERE id = 'edited'"),
                {"p": '{"jitter": "soon"}'},
            )
        schedules.add(migrated_engine, "plain", task="report", spec=MINUTELY)
        clock.advance(60 + 10)
        assert rounds.instants("edited") == []
        assert rounds.instants("plain") == [at(minutes=1)]
        assert "schedule 'edited' is not run here: schedule 'edited': its policies" in caplog.text
