"""`cronjob.schedules`: a refusal is one family, whichever field is wrong.

`ScheduleError` for when the schedule fires, `RegistrationError` for the rest; both are
`ValueError`s and `CronjobError`s, so a form's ``clean()`` catches one class
(docs/decisions.md, "One family for a schedule call's refusals").
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import CronjobError, RegistrationError, ScheduleError, schedules

DAILY = "0 0 9 * * *"
T0 = datetime(2027, 1, 4, 9, 0, tzinfo=UTC)


@pytest.fixture
def engine(tmp_path) -> sa.Engine:
    engine = lease.create_engine(f"sqlite:///{tmp_path / 'e.sqlite'}")
    lease.migrate(engine)
    schedules.add(engine, "taken", task="t", spec=DAILY)
    return engine


def test_both_classes_are_value_errors_of_the_packages_family():
    for kind in (ScheduleError, RegistrationError):
        assert issubclass(kind, ValueError) and issubclass(kind, CronjobError)


WHEN: list[dict[str, Any]] = [
    {"spec": "0 0 9 30 2 *"},  # never fires
    {"spec": "not a spec"},
    {"spec": "CRON_TZ=Local 0 0 9 * * *"},
    {"spec": DAILY, "at": T0},  # both
    {},  # neither
    {"at": datetime(2027, 1, 4, 9, 0)},  # naive
    {"spec": DAILY, "start": T0, "end": datetime(2027, 1, 1, tzinfo=UTC)},
]
REST: list[tuple[str, dict[str, Any]]] = [
    ("taken", {"spec": DAILY}),  # the id is a schedule's already
    ("", {"spec": DAILY}),
    ("a", {"spec": DAILY, "args": {"not": {1, 2}}}),
    ("a", {"spec": DAILY, "overlap": "queue"}),
    ("a", {"spec": DAILY, "registry": cronjob.Registry()}),  # no such task there
]


@pytest.mark.parametrize("fields", WHEN)
def test_when_it_fires_is_a_schedule_error(engine, fields):
    with pytest.raises(ScheduleError):
        schedules.add(engine, "a", task="t", **fields)
    assert [r.id for r in schedules.list(engine)] == ["taken"]


@pytest.mark.parametrize(("id_", "fields"), REST)
def test_the_rest_is_a_registration_error(engine, id_, fields):
    with pytest.raises(RegistrationError):
        schedules.add(engine, id_, task="t", **fields)
    assert [r.id for r in schedules.list(engine)] == ["taken"]


def test_update_refuses_in_the_same_two_classes(engine):
    with pytest.raises(ScheduleError):
        schedules.update(engine, "taken", spec="not a spec")
    with pytest.raises(RegistrationError):
        schedules.update(engine, "taken", overlap="queue")
    assert schedules.get(engine, "taken").spec == DAILY
