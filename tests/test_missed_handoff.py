"""Missed instants of a hand-off (a job that hands its instants to a task queue): an
instant is accounted for by its outbox row, by a round on record of it, a pause, a
catch-up's note or an acknowledgement, never by an overrun. An instant that fell while an
unfinished round held the lease, and that no replica recorded, is missed: counted, a
problem, and ``cronjob status`` exits non-zero. A job that hands nothing on keeps the
overrun rule.

A real scheduler on a fake clock, on every database; the publisher is an in-test class
that records what it publishes. Nothing sleeps in real time.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import Registry, Scheduler, admin
from cronjob.admin._cli import main
from cronjob.contrib import Occurrence, handoff
from cronjob.testing import FakeClock, crash

#: A Monday, on the hour (the conftest's clock starts here).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
EVERY_10S = "*/10 * * * * *"
MINUTELY = "0 * * * * *"
#: The instant the unfinished round holds the lease for (see `held_from`).
HELD = START + timedelta(seconds=40)
#: When status is read: the instants 09:00:50 to 09:04:00 are past the 60 s grace.
NOW = START + timedelta(minutes=5)
#: The instants that fell while the round of `HELD` held the lease, past the grace.
BLOCKED = [HELD + timedelta(seconds=10 * n) for n in range(1, 21)]


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


class Published:
    """A publisher that records the instants it published (the broker accepts all)."""

    target = "test"

    def __init__(self) -> None:
        self.instants: list[datetime] = []
        self._lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        return {"queue": "in-test"}

    def publish(self, occurrence: Occurrence) -> None:
        with self._lock:
            self.instants.append(occurrence.instant)


class Lasting:
    """A plain job whose rounds last ``seconds`` on the fake clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.instants: list[datetime] = []

    def __call__(self, ctx: cronjob.Round) -> None:
        self.instants.append(ctx.instant)
        if ctx.wait(self.seconds):
            ctx.check()


def report(url: str, clock: FakeClock, name: str = "beat") -> admin.JobStatus:
    return next(job for job in admin.status(url, now=clock.now()).jobs if job.name == name)


def _ms(instant: datetime) -> int:
    return round(instant.timestamp() * 1000)


def held_from(
    url: str, clock: FakeClock, replicas: Callable[..., Scheduler], published: Published
) -> None:
    """Replica ``a`` publishes ``beat`` every 10 s from 09:00:10 to 09:00:30 and dies;
    at 09:00:40 the lease row is left as a replica that died in its round leaves it: the
    instant claimed, its occurrence recorded, the round unfinished, its lease held (for
    ten minutes: a replica that hangs in its publication renews it, which the count
    cannot tell apart). Then the clock runs to `NOW`, with no outbox row for the instants
    after."""
    registry = Registry()
    registry.register(handoff(published), EVERY_10S, "beat")
    a = replicas(registry, "a")
    clock.advance(35)
    crash(a)
    assert published.instants == [at(10), at(20), at(30)]
    clock.advance_to(HELD)
    engine = lease.create_engine(url)
    try:
        store = lease.LeaseStore(engine, clock=clock.now, ttl=600)
        assert [claim.name for claim in store.claim(["beat"], HELD, "gone")] == ["beat"]
        with engine.begin() as conn:
            lease.record_publication(
                conn,
                id=cronjob.occurrence_id("beat", HELD),
                name="beat",
                instant=HELD,
                target="test",
                payload={"headers": {}},
                now_ms=_ms(HELD),
                hold_ms=60_000,
            )
    finally:
        engine.dispose()
    clock.advance_to(NOW)


def status_command(url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> int:
    """``cronjob status`` as of the fake clock's now (the command reads the database's)."""
    monkeypatch.setattr(admin, "status", functools.partial(admin.status, now=clock.now()))
    return main(["status", "--database-url", url])


class TestAHandOffHeldByAnUnfinishedRound:
    def test_its_later_instants_with_no_outbox_row_are_missed_and_status_exits_non_zero(
        self, db_url, replicas, clock, monkeypatch, capsys
    ):
        """Before, the round holding the lease accounted for them (an overrun): missed 0."""
        held_from(db_url, clock, replicas, Published())
        job = report(db_url, clock)
        assert job.running_on == "gone"
        assert job.missed == len(BLOCKED) == 20
        assert "missed: 20 instants of the last day did not run" in job.problems
        assert status_command(db_url, clock, monkeypatch) == 1
        assert "beat: missed: 20 instants of the last day did not run" in capsys.readouterr().err

    def test_the_same_instants_recorded_in_the_outbox_are_accounted_for(
        self, db_url, replicas, clock
    ):
        """Sent, unsent or resolved obsolete: each row is the occurrence on record (as the
        next claimant records them). While the round holds the lease, and once its lease
        ran out (before, nothing then accounted for the rows' instants: missed 62)."""
        held_from(db_url, clock, replicas, Published())
        expired = HELD + timedelta(minutes=10)
        later = expired + timedelta(seconds=80)  # 09:12: due up to 09:11:00
        recorded = [HELD + timedelta(seconds=10 * n) for n in range(1, 63)]
        engine = lease.create_engine(db_url)
        try:
            with engine.begin() as conn:
                for n, instant in enumerate(recorded):
                    oid = cronjob.occurrence_id("beat", instant)
                    lease.record_publication(
                        conn,
                        id=oid,
                        name="beat",
                        instant=instant,
                        target="test",
                        payload={"headers": {}},
                        now_ms=_ms(NOW),
                        hold_ms=0,
                    )
                    if n % 3 == 0:
                        lease.mark_published(conn, oid, now_ms=_ms(NOW))
                    elif n % 3 == 1:
                        lease.resolve_obsolete(
                            conn, oid, seen_next_try_ms=_ms(NOW), now_ms=_ms(NOW)
                        )
        finally:
            engine.dispose()
        job = report(db_url, clock)
        assert (job.running_on, job.missed) == ("gone", 0)
        assert not [problem for problem in job.problems if problem.startswith("missed")]
        clock.advance_to(later)
        job = report(db_url, clock)
        assert (job.running_on, job.missed) == (None, 0)

    def test_an_acknowledgement_accounts_for_them(self, db_url, replicas, clock):
        held_from(db_url, clock, replicas, Published())
        admin.acknowledge(db_url, "beat", until=BLOCKED[-1], reason="broker move", now=NOW)
        job = report(db_url, clock)
        assert (job.missed, job.missed_acknowledged) == (0, 20)


class TestAPlainJob:
    def test_its_overrun_instants_are_still_accounted_for_beside_a_hand_off(
        self, db_url, replicas, clock
    ):
        """Each round of ``report`` lasts 150 s: two instants of three come while one runs;
        ``beat``'s outbox rows make no job but ``beat`` a hand-off."""
        published = Published()
        lasting = Lasting(150)
        registry = Registry()
        registry.register(lasting, MINUTELY, "report")
        registry.register(handoff(published), MINUTELY, "beat")
        replicas(registry, "a")
        clock.advance(20 * 60 + 30)
        assert len(lasting.instants) < 10
        assert len(published.instants) == 20
        assert report(db_url, clock, "report").missed == 0
        assert report(db_url, clock, "beat").missed == 0


class TestCost:
    def test_the_outbox_is_read_in_one_statement_more_and_one_per_500_hand_offs_short(
        self, db_url, replicas, clock
    ):
        """Beside the unsent count: one statement counts every hand-off's instants, one
        reads the rows of the 60 that fall short (all replicas down for three minutes)."""
        registry = Registry()
        for n in range(60):
            registry.register(handoff(Published()), MINUTELY, f"beat-{n:02d}")
        a = replicas(registry, "a")
        clock.advance(3 * 60 + 30)
        a.stop()
        clock.advance(3 * 60)
        engine = sa.create_engine(db_url)
        sent: list[str] = []

        def count(conn: object, cursor: object, statement: str, *args: object) -> None:
            if "cronjob_outbox" in statement:
                sent.append(statement)

        sa.event.listen(engine, "before_cursor_execute", count)
        try:
            jobs = admin.status(engine, now=clock.now()).jobs
        finally:
            sa.event.remove(engine, "before_cursor_execute", count)
            engine.dispose()
        assert [job.missed for job in jobs] == [2] * 60  # 09:04, 09:05
        assert len(sent) == 3
