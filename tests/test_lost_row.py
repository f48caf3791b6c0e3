"""A lease row deleted behind the library's back while its round runs costs the job
nothing more than that round: the round is cut short (its lease is lost) and runs a
second time, as any round cut short does, and every later instant runs on time — on a
replica of one job as on one of thousands, whose row check could not find the row by
its draw in time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.testing import FakeClock

#: An hour's start: the job's instants fall every 5 minutes from it.
NOON = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


class Rounds:
    """The rounds of job ``five``: (instant, attempt), and how each ended."""

    def __init__(self) -> None:
        self.started: list[tuple[datetime, int]] = []
        self.cut: list[tuple[datetime, int]] = []
        self._lock = threading.Lock()

    def job(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.started.append((ctx.instant, ctx.attempt))
        # The round of 12:00 runs a minute, unless cancelled.
        if (ctx.instant, ctx.attempt) == (NOON, 1) and ctx.wait(60):
            with self._lock:
                self.cut.append((ctx.instant, ctx.attempt))
            ctx.check()


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = lease.create_engine(db_url)
    yield engine
    engine.dispose()


def _delete_row(engine: sa.Engine, name: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM cronjob_lease WHERE name = :n"), {"n": name})


class TestALeaseRowDeletedUnderItsRound:
    @pytest.mark.parametrize("others", [0, 2000], ids=["alone", "among-2000"])
    def test_the_next_instants_run_on_time(
        self, db_url: str, engine: sa.Engine, others: int, caplog: pytest.LogCaptureFixture
    ) -> None:
        clock = FakeClock(NOON - timedelta(seconds=30))
        rounds = Rounds()
        registry = cronjob.Registry()
        registry.register(rounds.job, "@every 5m", "five")
        for i in range(others):
            registry.register(lambda ctx: None, "@every 5m", f"other-{i:04d}")
        with (
            caplog.at_level(logging.WARNING, logger="cronjob"),
            cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="a"),
        ):
            clock.advance(32)  # 12:00:02: the round of 12:00 runs
            assert rounds.started == [(NOON, 1)]
            _delete_row(engine, "five")
            clock.advance(4 * 60)  # 12:04:02
            clock.advance(2 * 60)  # 12:06:02
            assert (NOON + timedelta(minutes=5), 1) in rounds.started, (
                "the instant after the deleted row's did not run"
            )
            for _ in range(5):
                clock.advance(5 * 60)  # up to 12:31:02
        assert rounds.cut == [(NOON, 1)], "the round whose row was deleted lost its lease"
        firsts = [at for at, attempt in rounds.started if attempt == 1]
        assert firsts == [NOON + timedelta(minutes=5 * k) for k in range(7)]
        # The seed's rule for a round cut short: it runs a second time (no later instant
        # was claimed before the sweep found it).
        assert (NOON, 2) in rounds.started
        assert "'five'" in caplog.text
