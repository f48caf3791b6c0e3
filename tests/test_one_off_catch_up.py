"""A one-off schedule whose instant passed unclaimed runs late only as its catch-up
policy allows: its own (``catch_up``, ``catch_up_window`` on the schedule) or else its
task's. With ``catch_up="none"`` it never runs and is done; with a window, it runs once
if its instant lies within the window, at once, and is done otherwise.

Replicas on a fake clock (nothing sleeps), on each database at head.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import cronjob
from cronjob import admin, schedules
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOUR = 3600.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


class Seen:
    """The instants each schedule's rounds ran, by id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instants: dict[str, list[datetime]] = {}

    def __call__(self, ctx: cronjob.Round) -> None:
        with self.lock:
            self.instants.setdefault(ctx.name, []).append(ctx.instant)


def registry_with(seen: Seen, **policy: Any) -> cronjob.Registry:
    registry = cronjob.Registry()
    registry.register_task(seen, "remind", **policy)
    return registry


def ago(hours: float) -> datetime:
    return START - timedelta(hours=hours)


#: (id, the one-off's own policies, hours its instant passed, whether it runs): under a
#: task with the default policy (the latest within a day).
OWN: list[tuple[str, dict[str, Any], float, bool]] = [
    ("plain", {}, 3, True),
    ("none", {"catch_up": "none"}, 3, False),
    ("none-just-passed", {"catch_up": "none"}, 1 / 3600, False),
    ("all", {"catch_up": "all"}, 3, True),
    ("outside-window", {"catch_up_window": HOUR}, 3, False),
    ("within-window", {"catch_up_window": 4 * HOUR}, 3, True),
    ("window-past-a-day", {"catch_up_window": 72 * HOUR}, 48, True),
    ("past-the-day", {}, 48, False),
]
#: The same, with no policies of their own, under a task that sets them.
TASKS: list[tuple[dict[str, Any], float, bool]] = [
    ({"catch_up": "none"}, 3, False),
    ({"catch_up_window": HOUR}, 3, False),
    ({"catch_up_window": 4 * HOUR}, 3, True),
    ({"catch_up_window": 72 * HOUR}, 48, True),
]


def add_own(url: str) -> None:
    for id_, own, hours, _runs in OWN:
        schedules.add(url, id_, task="remind", at=ago(hours), **own)


def check_own(seen: Seen, url: str) -> None:
    for id_, _own, hours, runs in OWN:
        assert seen.instants.get(id_, []) == ([ago(hours)] if runs else []), id_
        assert len(admin.history(url, id_)) == (1 if runs else 0), id_


@pytest.mark.parametrize("when", ["running", "at_start"])
def test_a_passed_one_off_honours_its_own_catch_up(migrated_engine, db_url, replicas, clock, when):
    """Seen by running replicas as it is added, or by replicas starting after it was."""
    seen = Seen()
    if when == "at_start":
        add_own(db_url)
    replicas(registry_with(seen), "a")
    replicas(registry_with(seen), "b")
    if when == "running":
        add_own(db_url)
    clock.advance(30)
    check_own(seen, db_url)
    clock.advance(2 * 86_400)  # done: nothing of them runs later either
    check_own(seen, db_url)


@pytest.mark.parametrize(("policy", "hours", "runs"), TASKS)
def test_a_passed_one_off_honours_its_tasks_catch_up(
    migrated_engine, db_url, replicas, clock, policy, hours, runs
):
    seen = Seen()
    replicas(registry_with(seen, **policy), "a")
    schedules.add(db_url, "r", task="remind", at=ago(hours))
    clock.advance(30)
    assert seen.instants.get("r", []) == ([ago(hours)] if runs else [])


def test_a_schedules_own_latest_overrides_its_tasks_none(migrated_engine, db_url, replicas, clock):
    seen = Seen()
    replicas(registry_with(seen, catch_up="none"), "a")
    schedules.add(db_url, "own", task="remind", at=ago(3), catch_up="latest")
    schedules.add(db_url, "tasks", task="remind", at=ago(3))
    clock.advance(30)
    assert seen.instants == {"own": [ago(3)]}
