"""`cronjob.schedules.check`: the refusals of `add`, each with add's exception and message,
writing nothing and reading no database (a form's ``clean()`` calls it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from cronjob import RegistrationError, Registry, ScheduleError, schedules

WHEN = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

#: (values, the exception): each a schedule `add` refuses.
REFUSED: list[tuple[dict[str, Any], type[ValueError]]] = [
    ({"spec": "61 * * * * *"}, ScheduleError),
    ({"spec": "CRON_TZ=Mars/Olympus 0 * * * * *"}, ScheduleError),
    ({}, ScheduleError),  # neither spec nor at
    ({"spec": "@hourly", "at": WHEN}, ScheduleError),
    ({"at": datetime(2026, 3, 2, 9, 0)}, ScheduleError),  # naive
    ({"spec": "@hourly", "start": WHEN, "end": WHEN.replace(hour=8)}, ScheduleError),
    ({"spec": "0 0 0 30 2 *"}, ScheduleError),  # never fires
    ({"spec": "@hourly", "args": {1: "x"}}, RegistrationError),
    ({"spec": "@hourly", "args": ["x"]}, RegistrationError),
    ({"spec": "@hourly", "task": "nosuch"}, RegistrationError),  # not in the registry
    ({"spec": "@hourly", "id": ""}, RegistrationError),
    ({"spec": "@hourly", "overlap": "sometimes"}, RegistrationError),
]


@pytest.fixture
def registry() -> Registry:
    found = Registry()
    found.register_task(lambda ctx: None, "export")
    return found


@pytest.mark.parametrize(("values", "kind"), REFUSED)
def test_it_refuses_what_add_refuses_with_the_same_message(values, kind, registry, tmp_path):
    values = {"id": "tenant-1", "task": "export", **values}
    id_ = values.pop("id")
    with pytest.raises(kind) as checked:
        schedules.check(id_, registry=registry, **values)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        with pytest.raises(kind) as added:
            schedules.add(engine, id_, registry=registry, **values)
        assert str(checked.value) == str(added.value)
        assert isinstance(checked.value, ValueError)
        assert not sa.inspect(engine).has_table("cronjob_schedule") or not schedules.list(engine)
    finally:
        engine.dispose()


def test_it_accepts_what_add_accepts_and_touches_no_database(registry):
    assert (
        schedules.check(
            "tenant-1",
            task="export",
            spec="CRON_TZ=Europe/Paris 0 0 9 * * *",
            args={"tenant": 1},
            start=WHEN,
            registry=registry,
            jitter=30,
        )
        is None
    )
    schedules.check("tenant-2", task="anything", at=WHEN)  # no registry: any task


def test_the_django_module_offers_it():
    from cronjob.contrib.django import schedules as django_schedules

    assert django_schedules.check is schedules.check
