"""Occurrence ids: one per (name, instant), the same on every replica and in every run of
the instant (issue #38's identity, ahead of the task-queue hand-off)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

import cronjob
from cronjob.testing import FakeClock, crash

INSTANT = datetime(2027, 1, 5, 3, 0, tzinfo=UTC)


def test_it_is_the_documented_uuid5_of_name_and_instant():
    expected = uuid.uuid5(
        uuid.UUID("a35ed7d8-cdc6-4241-b16b-24fbb283ec04"),
        "nightly-export@2027-01-05T03:00:00.000000Z",
    )
    assert cronjob.occurrence_id("nightly-export", INSTANT) == str(expected)
    # Pinned: another namespace or text form would give every instant a new id, and a
    # worker's deduplication would run each instant twice across the upgrade.
    assert cronjob.occurrence_id("nightly-export", INSTANT) == (
        "d0bb3065-23f1-5e24-a9dc-5aa32171934a"
    )


def test_the_same_instant_in_any_zone_has_the_same_id():
    berlin = INSTANT.astimezone(ZoneInfo("Europe/Berlin"))
    offset = INSTANT.astimezone(timezone(timedelta(hours=-5)))
    ids = {cronjob.occurrence_id("job", when) for when in (INSTANT, berlin, offset)}
    assert len(ids) == 1


def test_another_name_or_instant_has_another_id():
    ids = {
        cronjob.occurrence_id("job", INSTANT),
        cronjob.occurrence_id("job2", INSTANT),
        cronjob.occurrence_id("job", INSTANT + timedelta(seconds=1)),
        cronjob.occurrence_id("job", INSTANT + timedelta(milliseconds=1)),
    }
    assert len(ids) == 4


@pytest.mark.parametrize(
    ("name", "instant", "error"),
    [
        ("job", datetime(2027, 1, 5, 3), ValueError),
        ("job", "2027-01-05T03:00:00Z", TypeError),
        (None, INSTANT, TypeError),
    ],
)
def test_bad_input_is_refused(name, instant, error):
    with pytest.raises(error):
        cronjob.occurrence_id(name, instant)


def test_a_second_run_on_another_replica_has_the_first_runs_id(replicas, clock):
    seen: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def slow(ctx: cronjob.Round) -> None:
        with lock:
            seen.append((ctx.replica, ctx.attempt, ctx.occurrence_id))
        if ctx.wait(30):
            ctx.check()

    registry = cronjob.Registry()
    registry.register(slow, "0 0 * * * *", "hourly")
    running = {name: replicas(registry, name) for name in ("a", "b")}
    clock.advance(3605)  # 10:00 runs
    [(first, _attempt, _id)] = seen
    crash(running[first])
    clock.advance(60)  # its lease expires; the other runs 10:00 a second time
    hour = datetime(2026, 3, 2, 10, tzinfo=UTC)
    assert [(attempt, id_) for _replica, attempt, id_ in seen] == [
        (1, cronjob.occurrence_id("hourly", hour)),
        (2, cronjob.occurrence_id("hourly", hour)),
    ]
    assert seen[1][0] != first


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 3, 2, 9, tzinfo=UTC))
