"""``forget`` of a job whose round holds its lease (a removed schedule's round in flight)
is refused, nothing deleted, so the round runs to its end with its end on record; once
the round has ended the record can be forgotten."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

import cronjob
from cronjob import Registry, admin, schedules
from cronjob.admin import Outcome
from cronjob.admin._cli import main
from cronjob.testing import FakeClock
from tests._helpers import SweepingClock

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return SweepingClock(START)


class Report:
    """Task ``report``: each round runs 30 s, unless cancelled (then it is cut short)."""

    def __init__(self) -> None:
        self.cancelled: list[BaseException] = []
        self._lock = threading.Lock()

    def job(self, ctx: cronjob.Round) -> None:
        if ctx.wait(30):
            with self._lock:
                self.cancelled.append(ctx.cause or RuntimeError("cancelled"))
            ctx.check()


def _removed_in_flight(db_url: str, replicas, clock: FakeClock) -> Report:  # type: ignore[no-untyped-def]
    """Schedule ``report:1`` of task ``report``, every minute, removed while its round of
    09:01 runs (09:01:05)."""
    report = Report()
    registry = Registry()
    registry.register_task(report.job, "report")
    registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
    replicas(registry, "a")
    schedules.add(db_url, "report:1", task="report", spec="0 * * * * *")
    clock.advance(65)
    assert schedules.remove(db_url, "report:1")
    clock.advance(0)
    return report


class TestForgetWhileARoundHoldsTheLease:
    def test_it_is_refused_and_the_round_ends_on_record(self, db_url, replicas, clock):
        report = _removed_in_flight(db_url, replicas, clock)
        with pytest.raises(admin.ForgetRefused) as refused:
            admin.forget(db_url, "report:1", now=clock.now())
        assert str(refused.value) == (
            "the round of 2026-03-02T09:01:00+00:00 of 'report:1' holds its lease on a: "
            "forget it once the round has ended; nothing was deleted"
        )
        assert (refused.value.job, refused.value.held_by) == ("report:1", "a")
        clock.advance(30)  # 09:01:35: the round ran to its end
        assert report.cancelled == [], "the round was cut short under forget"
        [ended] = admin.history(db_url, "report:1")
        assert (ended.instant, ended.outcome) == (START + timedelta(minutes=1), Outcome.SUCCEEDED)
        done = admin.forget(db_url, "report:1", now=clock.now())
        assert done == admin.Forgotten(job="report:1", lease_row=True, rounds=1, requests=0)

    def test_the_command_says_so_in_one_line_and_exits_2(self, db_url, capsys):
        """The command reads the database's clock: the fake clock runs about now."""
        now = datetime.now(UTC).replace(microsecond=0)
        start = now - timedelta(seconds=now.second % 10 + 10)  # on a multiple of 10 s
        clock = SweepingClock(start - timedelta(seconds=10))
        report = Report()
        registry = Registry()
        registry.register_task(report.job, "report")
        with cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="a"):
            schedules.add(db_url, "report:1", task="report", spec="*/10 * * * * *")
            clock.advance(15)  # the replica saw the schedule; its round of `start` runs
            assert schedules.remove(db_url, "report:1")
            clock.advance(10)  # renewed at start + 15 s: held until start + 30 s, past now
            status = main(["forget", "report:1", "--database-url", db_url])
            out, err = capsys.readouterr()
            assert (status, out) == (2, "")
            assert err == (
                f"cronjob: error: refused: the round of {start.isoformat()} of 'report:1' "
                "holds its lease on a: forget it once the round has ended; nothing was "
                "deleted\n"
            )
            clock.advance(30)
        assert report.cancelled == []
        [ended] = admin.history(db_url, "report:1")
        assert (ended.instant, ended.outcome) == (start, Outcome.SUCCEEDED)
