"""The ``overlap`` and ``catch_up`` policies at run time, across replicas.

Replicas on one fake clock and one database (each of the three in turn), as in
``test_policies.py``; each round notes its instant, its replica and when it started and
ended, so that no two rounds of a job are seen to run at once; what each ended as is read
back from the history. Nothing sleeps in real time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from conftest import lease_row

import cronjob
import lease
from cronjob import Registry, admin, schedules, web
from cronjob._policy import Overlap, policy_text
from cronjob.admin._cli import main
from cronjob.testing import FakeClock
from tests._helpers import run_then_stop, wsgi_call

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = "0 * * * * *"
HOURLY = "0 0 * * * *"


def at(hours: int = 0, minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(hours=hours, minutes=minutes, seconds=seconds)


@dataclass
class Seen:
    instant: datetime
    replica: str
    started: datetime
    ended: datetime | None = None


class Rounds:
    """Job bodies that note each round: ``durations`` says how long the n-th round works
    (the rest: 1 s); ``stubborn`` rounds ignore their cancellation."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.seen: list[Seen] = []

    def job(
        self, *durations: float, stubborn: bool = False, default: float = 1
    ) -> Callable[[cronjob.Round], None]:
        def body(ctx: cronjob.Round) -> None:
            with self.lock:
                index = len(self.seen)
                seen = Seen(ctx.instant, ctx.replica, self.clock.now())
                self.seen.append(seen)
            seconds = durations[index] if index < len(durations) else default
            try:
                if stubborn:
                    self.clock.sleep(seconds)
                elif ctx.wait(seconds):
                    ctx.check()
            finally:
                seen.ended = self.clock.now()

        return body

    def instants(self) -> list[datetime]:
        return [s.instant for s in self.seen]

    def assert_never_overlapping(self) -> None:
        """No round started before the one before it had ended, on any replica."""
        for before, after in zip(self.seen, self.seen[1:], strict=False):
            assert before.ended is not None and before.ended <= after.started, (before, after)


@pytest.fixture
def rounds(clock: FakeClock) -> Rounds:
    return Rounds(clock)


def ended(url: str, name: str) -> list[tuple[datetime, int, str, str]]:
    """The job's history, oldest first: (instant, attempt, why, outcome)."""
    return [
        (r.instant, r.attempt, str(r.why), str(r.outcome))
        for r in reversed(admin.history(url, name))
    ]


class TestSkip:
    def test_instants_falling_while_a_round_runs_are_skipped_by_default(
        self, url, replicas, clock, rounds
    ):
        registry = Registry()
        registry.register(rounds.job(150), MINUTELY, "job")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(60 + 240)  # 09:01 runs to 09:03:30; 09:02 and 09:03 skipped
        assert rounds.instants() == [at(minutes=1), at(minutes=4), at(minutes=5)]
        rounds.assert_never_overlapping()
        assert lease_row(url, "job").skipped_through is not None


class TestBufferOne:
    def test_an_instant_falling_while_a_round_runs_starts_as_it_ends(
        self, url, replicas, clock, rounds
    ):
        registry = Registry()
        registry.register(rounds.job(90), MINUTELY, "job", overlap="buffer_one")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(60 + 90)  # 09:01 runs to 09:02:30; 09:02 waits for its end
        assert rounds.instants() == [at(minutes=1), at(minutes=2)]
        assert rounds.seen[1].started == at(minutes=2, seconds=30)
        clock.advance(31)  # 09:03 on time (for 1 s)
        assert rounds.instants() == [at(minutes=1), at(minutes=2), at(minutes=3)]
        assert rounds.seen[2].started == at(minutes=3)
        rounds.assert_never_overlapping()
        assert [(i, why, out) for i, _a, why, out in ended(url, "job")] == [
            (at(minutes=1), "schedule", "succeeded"),
            (at(minutes=2), "schedule", "succeeded"),
            (at(minutes=3), "schedule", "succeeded"),
        ]

    def test_when_the_next_instant_also_comes_still_only_one_waits(
        self, url, replicas, clock, rounds
    ):
        registry = Registry()
        registry.register(rounds.job(150), MINUTELY, "job", overlap="buffer_one")
        replicas(registry, "a")
        replicas(registry, "b")
        replicas(registry, "c")
        # 09:01 runs to 09:03:30; 09:02 and 09:03 fall meanwhile: 09:02 waits, 09:03 is
        # skipped; 09:02 runs from 09:03:30 to 09:03:31; 09:04 on time.
        clock.advance(60 + 200)
        assert rounds.instants() == [at(minutes=1), at(minutes=2), at(minutes=4)]
        assert rounds.seen[1].started == at(minutes=3, seconds=30)
        rounds.assert_never_overlapping()
        assert [i for i, *_ in ended(url, "job")] == [at(minutes=1), at(minutes=2), at(minutes=4)]

    def test_the_buffered_instant_runs_after_the_second_run_when_the_runner_dies(
        self, url, replicas, clock, rounds
    ):
        """The replica running 09:01 dies at 09:01:50: 09:02 falls while the lease it
        left holds (refused to the other replica), so it is buffered. The survivor's
        sweep runs 09:01 a second time once the lease expires; as that round ends, the
        survivor claims 09:02, which the dead replica alone knew was waiting."""
        registry = Registry()
        registry.register(rounds.job(3600), MINUTELY, "job", overlap="buffer_one")
        started = {"a": replicas(registry, "a"), "b": replicas(registry, "b")}
        clock.advance(60 + 50)  # 09:01:50
        [first] = rounds.seen
        cronjob.testing.crash(started[first.replica])  # no lease given back, no end
        clock.advance(55)  # 09:02:45: the lease expired, 09:01 ran again, then 09:02
        survivor = "b" if first.replica == "a" else "a"
        assert [(s.instant, s.replica) for s in rounds.seen[1:]] == [
            (at(minutes=1), survivor),
            (at(minutes=2), survivor),
        ]
        clock.advance(30)  # 09:03 on time
        assert rounds.instants()[1:] == [at(minutes=1), at(minutes=2), at(minutes=3)]
        assert rounds.seen[3].started == at(minutes=3)
        assert [(i, a, why) for i, a, why, _out in ended(url, "job")] == [
            (at(minutes=1), 2, "re-run"),
            (at(minutes=2), 1, "schedule"),
            (at(minutes=3), 1, "schedule"),
        ]

    def test_a_per_instance_job_buffers_one_instant_on_its_replica(self, replicas, clock, rounds):
        registry = Registry()
        registry.register_per_instance(rounds.job(150), MINUTELY, "local", overlap="buffer_one")
        replicas(registry, "a")
        clock.advance(60 + 200)
        assert rounds.instants() == [at(minutes=1), at(minutes=2), at(minutes=4)]
        rounds.assert_never_overlapping()


class TestCancelOther:
    def test_the_running_round_is_superseded_and_the_new_instant_starts_once_it_ended(
        self, url, replicas, clock, rounds
    ):
        causes: list[BaseException | None] = []

        registry = Registry()
        body = rounds.job(90)

        def job(ctx: cronjob.Round) -> None:
            try:
                body(ctx)
            finally:
                causes.append(ctx.cause)

        registry.register(job, MINUTELY, "job", overlap="cancel_other")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(60 + 61)  # cancelled at 09:02: it ends at once, 09:02 starts
        assert rounds.instants() == [at(minutes=1), at(minutes=2)]
        assert isinstance(causes[0], cronjob.Superseded)
        assert isinstance(causes[0], cronjob.Cancelled)
        assert rounds.seen[0].ended == at(minutes=2) == rounds.seen[1].started
        rounds.assert_never_overlapping()
        assert [(i, a, out) for i, a, _why, out in ended(url, "job")] == [
            (at(minutes=1), 1, "superseded"),
            (at(minutes=2), 1, "succeeded"),
        ]
        row = lease_row(url, "job")
        assert row.failures == 0  # superseded is not a failure
        clock.advance(60)  # never run again: 09:03 next, on time
        assert rounds.seen[2].started == at(minutes=3)
        assert rounds.instants() == [at(minutes=1), at(minutes=2), at(minutes=3)]

    def test_a_round_ignoring_its_cancellation_is_waited_for_never_run_beside(
        self, url, replicas, clock, rounds
    ):
        registry = Registry()
        registry.register(rounds.job(150, stubborn=True), MINUTELY, "job", overlap="cancel_other")
        replicas(registry, "a")
        replicas(registry, "b")
        # 09:01 ignores its cancellation at 09:02 and runs to 09:03:30: the latest instant
        # that fell meanwhile (09:03) starts then; 09:02 never runs.
        clock.advance(60 + 150)
        assert rounds.instants() == [at(minutes=1), at(minutes=3)]
        assert rounds.seen[1].started == at(minutes=3, seconds=30)
        clock.advance(60)
        assert rounds.instants() == [at(minutes=1), at(minutes=3), at(minutes=4)]
        rounds.assert_never_overlapping()
        # It returned after its cancellation: it did its work.
        assert ended(url, "job")[0] == (at(minutes=1), 1, "schedule", "succeeded")


class TestTaskSchedules:
    def test_a_tasks_overlap_governs_each_of_its_schedules(self, db_url, replicas, clock, rounds):
        registry = Registry()
        registry.register_task(rounds.job(150), "report", overlap="buffer_one")
        replicas(registry, "a")
        replicas(registry, "b")
        engine = lease.create_engine(db_url)
        try:
            lease.migrate(engine)
            schedules.add(engine, "report:1", task="report", spec=MINUTELY)
        finally:
            engine.dispose()
        clock.advance(60 + 200)  # 09:01 to 09:03:30, then 09:02 (buffered), then 09:04
        assert rounds.instants() == [at(minutes=1), at(minutes=2), at(minutes=4)]
        rounds.assert_never_overlapping()


class TestCancelOtherAsync:
    def test_an_async_round_is_superseded_its_task_cancelled(self, url, replicas, clock):
        started: list[datetime] = []

        async def job(ctx: cronjob.Round) -> None:
            started.append(ctx.instant)
            if ctx.instant == at(minutes=1):
                await ctx.wait_async(90)

        registry = Registry()
        registry.register(job, MINUTELY, "job", overlap="cancel_other")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(60 + 61)
        assert started == [at(minutes=1), at(minutes=2)]
        assert [(i, out) for i, _a, _why, out in ended(url, "job")] == [
            (at(minutes=1), "superseded"),
            (at(minutes=2), "succeeded"),
        ]


class TestCatchUp:
    def test_latest_runs_only_the_most_recent_missed_instant(self, url, replicas, clock, rounds):
        registry = Registry()
        registry.register(rounds.job(), HOURLY, "hourly")
        run_then_stop(replicas, registry, 3600 + 5)  # 10:00 runs
        clock.advance(3 * 3600)  # down through 11:00, 12:00, 13:00
        replicas(registry, "b")
        clock.advance(5)
        assert rounds.instants() == [at(hours=1), at(hours=4)]

    def test_none_runs_no_missed_instant(self, url, replicas, clock, rounds):
        registry = Registry()
        registry.register(rounds.job(), HOURLY, "hourly", catch_up="none")
        run_then_stop(replicas, registry, 3600 + 5)  # 10:00 runs
        clock.advance(3 * 3600)  # down through 11:00, 12:00, 13:00; now 13:00:05
        replicas(registry, "b")
        clock.advance(5)
        assert rounds.instants() == [at(hours=1)]
        clock.advance(3600)  # 14:00 on time
        assert rounds.instants() == [at(hours=1), at(hours=5)]

    def test_all_runs_every_missed_instant_oldest_first_one_at_a_time_on_record(
        self, url, replicas, clock, rounds
    ):
        registry = Registry()
        registry.register(rounds.job(default=600), HOURLY, "hourly", catch_up="all")
        run_then_stop(replicas, registry, 3600 + 601)  # 10:00 runs
        clock.advance(3 * 3600 + 1800)  # down through 11:00, 12:00, 13:00, 14:00; 14:40
        replicas(registry, "b")
        replicas(registry, "c")
        clock.advance(4 * 600 + 1)  # four rounds of 10 min, one after the other
        assert rounds.instants() == [at(hours=h) for h in (1, 2, 3, 4, 5)]
        rounds.assert_never_overlapping()
        history = ended(url, "hourly")
        assert [(i, why) for i, _a, why, _o in history] == [
            (at(hours=1), "schedule"),
            *((at(hours=h), "catch-up") for h in (2, 3, 4, 5)),
        ]
        clock.advance(3600)  # 15:00 on time
        assert rounds.instants()[-1] == at(hours=6)
        assert rounds.seen[-1].started == at(hours=6)

    def test_all_stays_within_its_window(self, url, replicas, clock, rounds):
        registry = Registry()
        registry.register(
            rounds.job(), HOURLY, "hourly", catch_up="all", catch_up_window=timedelta(hours=2)
        )
        run_then_stop(replicas, registry, 3600 + 5)  # 10:00 runs
        clock.advance(4 * 3600 + 1800)  # down through 14:00; now 14:30:05
        replicas(registry, "b")
        clock.advance(10)
        assert rounds.instants() == [at(hours=1), at(hours=4), at(hours=5)]

    def test_all_cut_short_by_a_drain_is_finished_by_another_replica_nothing_twice(
        self, url, replicas, clock, rounds
    ):
        registry = Registry()
        registry.register(rounds.job(default=600), HOURLY, "hourly", catch_up="all")
        run_then_stop(replicas, registry, 3600 + 601)  # 10:00 runs
        clock.advance(3 * 3600)  # down through 11:00, 12:00, 13:00; now 13:10:01
        b = replicas(registry, "b")
        clock.advance(300)  # 11:00 caught up on b, halfway
        assert rounds.instants() == [at(hours=1), at(hours=2)]
        c = replicas(registry, "c")
        b.stop()  # the drain cuts 11:00 short
        clock.advance(3 * 600 + 60)  # c runs 11:00 again (its second run), 12:00, 13:00
        assert rounds.instants() == [at(hours=h) for h in (1, 2, 2, 3, 4)]
        assert {s.replica for s in rounds.seen[2:]} == {"c"}
        rounds.assert_never_overlapping()
        history = ended(url, "hourly")
        assert [(i, a, why, out) for i, a, why, out in history][1:] == [
            (at(hours=2), 1, "catch-up", "cut short"),
            (at(hours=2), 2, "re-run", "succeeded"),
            (at(hours=3), 1, "catch-up", "succeeded"),
            (at(hours=4), 1, "catch-up", "succeeded"),
        ]
        c.stop()

    def test_all_cut_short_by_a_drain_goes_on_at_the_next_start_nothing_twice(
        self, url, replicas, clock, rounds
    ):
        registry = Registry()
        registry.register(rounds.job(default=600), HOURLY, "hourly", catch_up="all")
        run_then_stop(replicas, registry, 3600 + 601)  # 10:00 runs
        clock.advance(3 * 3600)  # down through 11:00, 12:00, 13:00; now 13:10:01
        b = replicas(registry, "b")
        clock.advance(600 + 1)  # 11:00 caught up; 12:00 follows at its end
        assert rounds.instants() == [at(hours=1), at(hours=2), at(hours=3)]
        b.stop()  # the drain cuts 12:00 short
        clock.advance(60)
        replicas(registry, "c")  # the next start: 12:00's second run, then 13:00
        clock.advance(2 * 600 + 60)
        assert rounds.instants() == [at(hours=h) for h in (1, 2, 3, 3, 4)]
        rounds.assert_never_overlapping()
        assert [(i, a, out) for i, a, _why, out in ended(url, "hourly")][1:] == [
            (at(hours=2), 1, "succeeded"),
            (at(hours=3), 1, "cut short"),
            (at(hours=3), 2, "succeeded"),
            (at(hours=4), 1, "succeeded"),
        ]


class TestRegistration:
    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (
                {"overlap": "queue"},
                "job 'j': overlap must be one of 'skip', 'buffer_one', 'cancel_other', got 'queue'",
            ),
            (
                {"catch_up": True},
                "job 'j': catch_up must be one of 'latest', 'none', 'all', 'oldest', got True",
            ),
            ({"catch_up_window": 0}, "job 'j': catch_up_window must be positive, got 0"),
        ],
    )
    def test_bad_values_fail_at_registration_naming_the_job(self, options, message):
        with pytest.raises(cronjob.RegistrationError, match=rf"^{message}$"):
            Registry().register(lambda ctx: None, MINUTELY, "j", **options)

    def test_catch_up_is_refused_for_a_per_instance_job(self):
        with pytest.raises(cronjob.RegistrationError, match=r"^job 'j': catch_up and catch_up"):
            Registry().register_per_instance(lambda ctx: None, MINUTELY, "j", catch_up="all")

    def test_the_policies_are_described_and_shown(self):
        registry = Registry()
        registry.register(
            lambda ctx: None,
            MINUTELY,
            "j",
            overlap=Overlap.BUFFER_ONE,
            catch_up="all",
            catch_up_window=7200,
        )
        (job,) = registry.jobs
        described = job.policy.describe()
        assert described == {"overlap": "buffer_one", "catch_up": "all", "catch_up_window": 7200.0}
        assert policy_text(described) == "overlap buffer_one, catch-up all within 2h"

    def test_the_default_values_given_are_the_default_policy(self):
        registry = Registry()
        registry.register(lambda ctx: None, MINUTELY, "j", overlap="skip", catch_up="latest")
        (job,) = registry.jobs
        assert job.policy == cronjob.Policy() and job.policy.describe() == {}


class TestShown:
    @pytest.fixture
    def clock(self) -> FakeClock:
        """About now: ``cronjob status`` reads the database's clock to tell live replicas."""
        return FakeClock(datetime.now(UTC).replace(microsecond=0))

    def test_status_and_the_page_show_them_from_the_replicas_record(
        self, db_url, replicas, clock, capsys
    ):
        registry = Registry()
        registry.register(
            lambda ctx: None, MINUTELY, "sync", overlap="cancel_other", catch_up="none"
        )
        replicas(registry, "a")
        clock.advance(0)
        [job] = [j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "sync"]
        assert job.policies == {"overlap": "cancel_other", "catch_up": "none"}
        assert main(["status", "--database-url", db_url]) == 0
        [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("sync ")]
        assert line.endswith("overlap cancel_other, catch-up none")
        status, _, page = wsgi_call(web.wsgi_app(db_url, clock=clock), "/job", "name=sync")
        assert status.startswith("200") and "overlap cancel_other, catch-up none" in page

    def test_cronjob_next_shows_them(self, tmp_path, monkeypatch, capsys):
        (tmp_path / "overlapjobs.py").write_text(
            "import cronjob\n"
            "@cronjob.job('0 */5 * * * *', name='sync', overlap='buffer_one',\n"
            "             catch_up='all', catch_up_window=3600)\n"
            "def sync(ctx):\n"
            "    pass\n"
        )
        monkeypatch.chdir(tmp_path)
        fresh = Registry()
        monkeypatch.setattr(cronjob._registry, "default_registry", fresh)
        monkeypatch.setattr(cronjob, "default_registry", fresh)
        monkeypatch.setattr(cronjob.admin._cli, "default_registry", fresh)
        monkeypatch.syspath_prepend(str(tmp_path))
        args = [
            "next",
            "--module",
            "overlapjobs",
            "sync",
            "-n",
            "1",
            "--after",
            "2026-01-01T00:00Z",
        ]
        assert main(args) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.splitlines()[1] == (
            "policies: overlap buffer_one, catch-up all within 1h"
        )
