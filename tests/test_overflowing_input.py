"""Input past what `datetime`, `timedelta` or the interpreter's recursion can hold is
refused at registration, or at a schedule's write, with the error bad input gets (a
`RegistrationError` or `ScheduleError`, both `ValueError`s) naming the job or schedule,
never a bare `OverflowError` or `RecursionError`; and nothing is registered or written."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import cronjob
import lease
from cronjob import RegistrationError, Registry, ScheduleError, schedules
from cronjob.schedules import New
from tests.test_async_transaction import as_async

MAX = datetime.max.replace(tzinfo=UTC)
MIN = datetime.min.replace(tzinfo=UTC)
#: datetime.max west of UTC and datetime.min east of it: past datetime's range in UTC.
MAX_WEST = datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))
MIN_EAST = datetime.min.replace(tzinfo=timezone(timedelta(hours=5)))
T0 = datetime(2027, 1, 4, 9, 0, tzinfo=UTC)
DURATIONS = ("timeout", "retry_backoff", "start_deadline", "jitter", "catch_up_window")
#: Durations past timedelta's range (999,999,999 days), or past float's.
HUGE = (1e20, 10**400, timedelta.max)


def nested(depth: int) -> dict[str, Any]:
    """A dict nested ``depth`` deep."""
    args: dict[str, Any] = {}
    inner = args
    for _ in range(depth):
        inner["a"] = {}
        inner = inner["a"]
    return args


def job(ctx: cronjob.Round) -> None:
    pass


def too_long(option: str, value: object) -> str:
    shown = re.escape(repr(value))
    return rf"^job 'j': {option} must be at most 36500 days \(100 years\), got {shown}$"


# --- Registration --------------------------------------------------------------------


def _register(registry: Registry, **options: Any) -> None:
    registry.register(job, "@hourly", "j", **options)


def _register_per_instance(registry: Registry, **options: Any) -> None:
    registry.register_per_instance(job, "@hourly", "j", **options)


def _job_decorator(registry: Registry, **options: Any) -> None:
    registry.job("@hourly", name="j", **options)(job)


def _task_decorator(registry: Registry, **options: Any) -> None:
    registry.task(name="j", **options)(job)


def _register_task(registry: Registry, **options: Any) -> None:
    registry.register_task(job, "j", **options)


REGISTRATIONS = [_register, _job_decorator, _task_decorator, _register_task]


@pytest.mark.parametrize("value", HUGE, ids=["1e20", "10**400", "timedelta.max"])
@pytest.mark.parametrize("option", DURATIONS)
@pytest.mark.parametrize("how", REGISTRATIONS)
def test_a_duration_past_a_century_is_refused_naming_the_job(how, option, value):
    registry = Registry()
    with pytest.raises(RegistrationError, match=too_long(option, value)):
        how(registry, **{option: value})
    assert len(registry) == 0


@pytest.mark.parametrize("option", ["timeout", "retry_backoff", "start_deadline", "jitter"])
def test_a_per_instance_jobs_duration_past_a_century_is_refused(option):
    registry = Registry()
    with pytest.raises(RegistrationError, match=too_long(option, 1e20)):
        _register_per_instance(registry, **{option: 1e20})
    assert len(registry) == 0


def test_a_century_itself_is_taken():
    registry = Registry()
    _register(registry, timeout=timedelta(days=36_500), catch_up_window=36_500 * 86_400)
    assert registry.jobs[0].policy.timeout == timedelta(days=36_500)


def test_a_heartbeat_whose_port_overflows_is_refused_at_registration():
    registry = Registry()
    url = "https://hc.example/ping/x"
    bad = "https://hc.example:99999999999999999999/ping/x"
    with pytest.raises(RegistrationError, match=r"^job 'j': heartbeat .* is not a URL: Port"):
        _register(registry, heartbeat=bad)
    _register(registry, heartbeat=url)


@pytest.mark.parametrize(
    "call",
    [
        lambda: cronjob.register(job, "@hourly", "overflowing", timeout=1e20),
        lambda: cronjob.register_per_instance(job, "@hourly", "overflowing", jitter=1e20),
        lambda: cronjob.job("@hourly", name="overflowing", retry_backoff=1e20)(job),
        lambda: cronjob.task(name="overflowing", catch_up_window=1e20)(job),
        lambda: cronjob.register_task(job, "overflowing", start_deadline=1e20),
    ],
)
def test_the_default_registrys_forms_refuse_it_too(call: Callable[[], object]):
    with pytest.raises(RegistrationError, match=r"^job 'overflowing': \w+ must be at most"):
        call()
    names = {
        each.name for each in (*cronjob.default_registry.jobs, *cronjob.default_registry.tasks)
    }
    assert "overflowing" not in names


# --- Schedules made of data ----------------------------------------------------------

#: (keywords of schedules.add besides the id and task, the refusal, its message's start).
BAD_SCHEDULES: list[tuple[dict[str, Any], type[ValueError], str]] = [
    *(
        ({"at": at}, ScheduleError, "schedule 's': at ")
        for at in (MAX, MIN, MAX_WEST, MIN_EAST, datetime(9000, 1, 1, tzinfo=UTC))
    ),
    *(
        ({"spec": "@hourly", key: when}, ScheduleError, f"schedule 's': {key} ")
        for key in ("start", "end")
        for when in (MAX, MIN, MAX_WEST, MIN_EAST, MAX - timedelta(days=1))
    ),
    *(
        ({"spec": "@hourly", key: value}, RegistrationError, f"schedule 's': {key} must be at most")
        for key in ("jitter", "catch_up_window")
        for value in HUGE
    ),
    ({"spec": "@hourly", "args": nested(5000)}, RegistrationError, "schedule 's': args are nested"),
    ({"at": T0, "args": {"a": [nested(5000)]}}, RegistrationError, "schedule 's': args are nested"),
]


def nothing_written(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM cronjob_schedule")).scalar() == 0
        assert conn.execute(sa.text("SELECT COUNT(*) FROM cronjob_lease")).scalar() == 0
        assert lease.read_schedule_rev(conn) == 0


def test_every_overflowing_schedule_is_refused_naming_it_with_nothing_written(
    migrated_engine, db_url
):
    """Each of `BAD_SCHEDULES` through ``add``, ``add_many`` and ``add_async``."""

    async def add_async(**kwargs: Any) -> None:
        aengine = create_async_engine(as_async(db_url), poolclass=NullPool)
        try:
            await schedules.add_async(aengine, "s", task="t", **kwargs)
        finally:
            await aengine.dispose()

    forms: list[Callable[..., object]] = [
        lambda **kw: schedules.add(migrated_engine, "s", task="t", **kw),
        lambda **kw: schedules.add_many(
            migrated_engine, [New("ok", task="t", spec="@hourly"), New("s", task="t", **kw)]
        ),
        lambda **kw: asyncio.run(add_async(**kw)),
    ]
    for kwargs, error, start in BAD_SCHEDULES:
        for form in forms:
            with pytest.raises(error) as raised:
                form(**kwargs)
            assert str(raised.value).startswith(start), (kwargs, str(raised.value))
    nothing_written(migrated_engine)


def test_an_overflowing_update_is_refused_and_changes_nothing(migrated_engine):
    schedules.add(migrated_engine, "s", task="t", spec="@hourly", args={"v": 1})
    for kwargs, error, start in BAD_SCHEDULES:
        if "spec" in kwargs:
            kwargs = {key: value for key, value in kwargs.items() if key != "spec"}
        with pytest.raises(error) as raised:
            schedules.update(migrated_engine, "s", **kwargs)
        assert str(raised.value).startswith(start), (kwargs, str(raised.value))
    record = schedules.get(migrated_engine, "s")
    assert record is not None
    assert (record.spec, record.at, record.start, record.end, record.args) == (
        "@hourly",
        None,
        None,
        None,
        {"v": 1},
    )
    assert record.jitter is None and record.catch_up_window is None
    with migrated_engine.connect() as conn:
        assert lease.read_schedule_rev(conn) == 1


def test_the_range_of_instants_a_schedule_may_name_is_taken_to_its_ends(migrated_engine):
    first = datetime(1000, 1, 1, tzinfo=UTC)
    last = datetime(8999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert schedules.add(migrated_engine, "early", task="t", at=first)
    assert schedules.add(migrated_engine, "late", task="t", at=last)
    assert schedules.add(
        migrated_engine, "bounded", task="t", spec="@hourly", start=first, end=last
    )
    early, late = schedules.get(migrated_engine, "early"), schedules.get(migrated_engine, "late")
    assert early is not None and early.at == first
    assert late is not None and late.at == last
