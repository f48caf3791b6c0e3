"""`cronjob.schedules`: schedules made of data, written in the caller's transaction.

Every test runs on the three databases (``db_engine``), on the lease tables at head and a
small table of the application's own (``tenants``). What a call wrote is read back with
plain statements on the tables (``cronjob_schedule``, ``cronjob_lease`` and the change
counter ``cronjob_schedule_rev``), never through the API under test alone.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import lease
from cronjob import RegistrationError, Registry, ScheduleError, default_registry, schedules
from cronjob.schedules import New
from tests.test_async_transaction import as_async

T0 = datetime(2027, 1, 4, 9, 0, tzinfo=UTC)
DAILY = "0 0 9 * * *"
ID = "report:tenant-42"


@pytest.fixture
def engine(db_engine: sa.Engine) -> sa.Engine:
    """Each database at head, with the application's ``tenants`` table."""
    lease.migrate(db_engine)
    with db_engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE tenants (id INTEGER PRIMARY KEY)"))
    return db_engine


def tenants(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT id FROM tenants ORDER BY id")).scalars())


def stored(engine: sa.Engine) -> dict[str, bool]:
    """Every schedule row, tombstones too: id -> removed."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, removed FROM cronjob_schedule"))
        return {id_: bool(removed) for id_, removed in rows}


def lease_rows(engine: sa.Engine) -> dict[str, Any]:
    """Every lease row: name -> paused_ms."""
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT name, paused_ms FROM cronjob_lease")).all())


def rev(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return lease.read_schedule_rev(conn)


def nothing_written(engine: sa.Engine, before: int = 0) -> None:
    assert stored(engine) == {}
    assert lease_rows(engine) == {}
    assert rev(engine) == before


def add(db: Any, id_: str = ID, **kwargs: Any) -> bool:
    kwargs.setdefault("task", "tenant-report")
    if "at" not in kwargs:
        kwargs.setdefault("spec", DAILY)
    return schedules.add(db, id_, **kwargs)


# --- The caller's transaction ---------------------------------------------------------


def test_a_rollback_leaves_neither_the_tenant_nor_the_schedule(engine):
    with engine.connect() as conn, conn.begin() as trans:
        conn.execute(sa.text("INSERT INTO tenants (id) VALUES (42)"))
        assert add(conn, args={"tenant": 42})
        assert schedules.get(conn, ID) is not None  # seen inside the transaction
        trans.rollback()
    assert tenants(engine) == []
    nothing_written(engine)


def test_another_connection_sees_the_schedule_only_after_the_commit(engine, db_url):
    # Not lease.create_engine: on SQLite its transactions all begin IMMEDIATE, a reader's too.
    second = sa.create_engine(db_url, poolclass=NullPool)
    with engine.connect() as conn, second.connect() as other:
        with conn.begin():
            conn.execute(sa.text("INSERT INTO tenants (id) VALUES (42)"))
            add(conn, args={"tenant": 42})
            assert schedules.get(other, ID) is None
            assert schedules.list(other) == []
            assert lease.read_schedule_rev(other) == 0
            other.rollback()
        record = schedules.get(other, ID)
        assert record is not None and record.args == {"tenant": 42}
        assert other.execute(sa.text("SELECT id FROM tenants")).scalars().all() == [42]
        assert lease.read_schedule_rev(other) == 1
    second.dispose()


def test_an_error_raised_in_the_callers_block_rolls_the_schedule_back(engine):
    with pytest.raises(ZeroDivisionError), engine.begin() as conn:
        add(conn)
        conn.execute(sa.text("INSERT INTO tenants (id) VALUES (1)"))
        _ = 1 / 0
    assert tenants(engine) == []
    nothing_written(engine)


# --- Engine and URL forms, get and list ------------------------------------------------


def test_an_engine_and_a_url_each_commit_a_transaction_of_their_own(engine, db_url):
    assert add(engine, "by-engine")
    assert add(db_url, "by-url")
    assert add(sa.make_url(db_url), "by-url-object")
    assert stored(engine) == {"by-engine": False, "by-url": False, "by-url-object": False}
    assert schedules.get(db_url, "by-engine") is not None
    assert [r.id for r in schedules.list(db_url)] == ["by-engine", "by-url", "by-url-object"]


def test_anything_else_is_refused_with_a_type_error(engine):
    with pytest.raises(TypeError, match="Connection, Engine or URL"):
        schedules.get(42, ID)  # type: ignore[arg-type]


def test_get_returns_the_record_as_added(engine):
    start, end = T0, T0 + timedelta(days=30)
    add(engine, spec="CRON_TZ=America/New_York 0 0 9 * * *", args={"n": [1, "é🙂"]}, start=start)
    add(engine, "one-off", task="remind", at=T0 + timedelta(hours=1), end=end)
    record = schedules.get(engine, ID)
    assert record is not None
    assert (record.id, record.task) == (ID, "tenant-report")
    assert record.spec == "CRON_TZ=America/New_York 0 0 9 * * *"
    assert (record.at, record.start, record.end) == (None, start, None)
    assert record.args == {"n": [1, "é🙂"]}
    assert record.created.tzinfo is not None and record.created == record.updated
    assert record.shown_spec == record.spec
    one_off = schedules.get(engine, "one-off")
    assert one_off is not None and one_off.spec is None
    assert (one_off.at, one_off.end) == (T0 + timedelta(hours=1), end)
    assert one_off.shown_spec == "@at 2027-01-04T10:00:00Z"
    assert schedules.get(engine, "missing") is None
    assert add(engine, "rapport:société-🙂", args={"k": "ü"})
    record = schedules.get(engine, "rapport:société-🙂")
    assert record is not None and record.args == {"k": "ü"}


def test_list_filters_by_task_and_by_a_prefix_taken_literally(engine):
    ids = ["a%b:1", "a_b:1", "axb:1", "a\\b:1", "A%b:2", "b:1"]
    schedules.add_many(engine, [New(i, task="t1" if "1" in i else "t2", spec=DAILY) for i in ids])
    assert [r.id for r in schedules.list(engine)] == sorted(ids)
    assert [r.id for r in schedules.list(engine, task="t2")] == ["A%b:2"]
    assert [r.id for r in schedules.list(engine, prefix="a%")] == ["a%b:1"]
    assert [r.id for r in schedules.list(engine, prefix="a_")] == ["a_b:1"]
    assert [r.id for r in schedules.list(engine, prefix="a\\")] == ["a\\b:1"]
    assert [r.id for r in schedules.list(engine, prefix="a")] == [
        "a%b:1",
        "a\\b:1",
        "a_b:1",
        "axb:1",
    ]
    assert [r.id for r in schedules.list(engine, prefix="A")] == ["A%b:2"]
    assert [r.id for r in schedules.list(engine, task="t1", prefix="b")] == ["b:1"]
    assert schedules.list(engine, task="T1") == []
    assert schedules.list(engine, task="t1 ") == []


def test_an_id_with_trailing_space_or_other_case_is_another_id(engine):
    add(engine, "report")
    assert schedules.get(engine, "report ") is None
    assert schedules.get(engine, "Report") is None
    assert schedules.remove(engine, "report ") is False
    assert schedules.update(engine, "report ", spec="0 0 10 * * *") is False
    assert schedules.get(engine, "\x00") is None
    assert schedules.remove(engine, "x" * 300) is False
    assert stored(engine) == {"report": False}
    record = schedules.get(engine, "report")
    assert record is not None and record.spec == DAILY


# --- update -------------------------------------------------------------------------


def test_update_changes_only_what_is_given(engine):
    add(engine, args={"tenant": 42}, start=T0, end=T0 + timedelta(days=9))
    before = schedules.get(engine, ID)
    assert schedules.update(engine, ID, args={"tenant": 43})
    after = schedules.get(engine, ID)
    assert before is not None and after is not None
    assert after.args == {"tenant": 43}
    assert (after.task, after.spec, after.start, after.end, after.created) == (
        before.task,
        before.spec,
        before.start,
        before.end,
        before.created,
    )
    assert schedules.update(engine, ID, spec="0 30 9 * * *")
    again = schedules.get(engine, ID)
    assert again is not None and (again.spec, again.args) == ("0 30 9 * * *", {"tenant": 43})


def test_update_switches_between_spec_and_at(engine):
    add(engine)
    assert schedules.update(engine, ID, at=T0)
    record = schedules.get(engine, ID)
    assert record is not None and (record.spec, record.at) == (None, T0)
    assert schedules.update(engine, ID, spec=DAILY)
    record = schedules.get(engine, ID)
    assert record is not None and (record.spec, record.at) == (DAILY, None)
    with pytest.raises(ScheduleError, match="exactly one"):
        schedules.update(engine, ID, spec=DAILY, at=T0)
    with pytest.raises(ScheduleError, match="exactly one"):
        schedules.update(engine, ID, spec=None)


def test_update_clears_start_and_end_with_none(engine):
    add(engine, start=T0, end=T0 + timedelta(days=1))
    assert schedules.update(engine, ID, start=None)
    record = schedules.get(engine, ID)
    assert record is not None and (record.start, record.end) == (None, T0 + timedelta(days=1))
    assert schedules.update(engine, ID, end=None)
    record = schedules.get(engine, ID)
    assert record is not None and (record.start, record.end) == (None, None)


def test_update_of_a_missing_or_removed_id_is_false_and_writes_nothing(engine):
    assert schedules.update(engine, "missing", spec=DAILY) is False
    assert rev(engine) == 0
    add(engine)
    schedules.remove(engine, ID)
    assert schedules.update(engine, ID, spec="0 0 10 * * *") is False
    assert rev(engine) == 2
    assert stored(engine) == {ID: True}


def test_a_refused_update_changes_nothing(engine):
    add(engine, start=T0)
    with pytest.raises(ScheduleError, match=ID):
        schedules.update(engine, ID, end=T0 - timedelta(days=1))
    with pytest.raises(RegistrationError, match=ID):
        schedules.update(engine, ID, args={"x": math.nan})
    with engine.connect() as conn, conn.begin(), pytest.raises(ScheduleError, match=ID):
        schedules.update(conn, ID, spec="not a spec")
    record = schedules.get(engine, ID)
    assert record is not None and (record.spec, record.start, record.end) == (DAILY, T0, None)
    assert rev(engine) == 1


# --- remove -------------------------------------------------------------------------


def test_remove_leaves_a_tombstone_that_is_neither_got_nor_listed(engine):
    add(engine)
    add(engine, "other")
    assert schedules.remove(engine, ID) is True
    assert schedules.remove(engine, ID) is False
    assert schedules.remove(engine, "never") is False
    assert schedules.get(engine, ID) is None
    assert [r.id for r in schedules.list(engine)] == ["other"]
    assert stored(engine) == {ID: True, "other": False}
    assert ID in lease_rows(engine)  # a round in flight ends on record


def test_a_removed_id_can_be_added_again(engine):
    add(engine, args={"v": 1})
    schedules.remove(engine, ID)
    assert add(engine, spec="0 0 10 * * *", args={"v": 2})  # if_exists="error": no live one
    record = schedules.get(engine, ID)
    assert record is not None and (record.spec, record.args) == ("0 0 10 * * *", {"v": 2})
    assert stored(engine) == {ID: False}


# --- add_many, if_exists, paused --------------------------------------------------------


def test_add_many_writes_all_and_returns_the_count(engine):
    news = [New(f"s{i}", task="t", spec=DAILY, args={"i": i}) for i in range(5)]
    assert schedules.add_many(engine, iter(news)) == 5
    assert sorted(stored(engine)) == [f"s{i}" for i in range(5)]
    assert sorted(lease_rows(engine)) == [f"s{i}" for i in range(5)]
    assert schedules.add_many(engine, []) == 0


def test_add_many_writes_nothing_when_one_is_refused(engine):
    good = [New(f"s{i}", task="t", spec=DAILY) for i in range(3)]
    with pytest.raises(ScheduleError, match="'bad'"):
        schedules.add_many(engine, [*good, New("bad", task="t", spec="0 0 0 30 2 *")])
    nothing_written(engine)
    add(engine, "s1")
    with pytest.raises(RegistrationError, match="'s1' already exists"):
        schedules.add_many(engine, good)
    assert stored(engine) == {"s1": False}
    with pytest.raises(RegistrationError, match="'s0' is given more than once"):
        schedules.add_many(engine, [good[0], good[0]], if_exists="replace")
    assert stored(engine) == {"s1": False}
    assert rev(engine) == 1


def test_if_exists_error_replace_and_keep(engine):
    add(engine, args={"v": 1})
    with pytest.raises(RegistrationError, match=f"{ID!r} already exists"):
        add(engine, args={"v": 2})
    assert add(engine, args={"v": 3}, if_exists="keep") is False
    record = schedules.get(engine, ID)
    assert record is not None and record.args == {"v": 1}
    assert add(engine, spec="0 0 10 * * *", args={"v": 4}, if_exists="replace") is True
    record = schedules.get(engine, ID)
    assert record is not None and (record.spec, record.args) == ("0 0 10 * * *", {"v": 4})
    schedules.remove(engine, ID)
    assert add(engine, args={"v": 5}, if_exists="keep") is True  # a tombstone is not kept
    with pytest.raises(ValueError, match="if_exists"):
        add(engine, if_exists="ignore")  # type: ignore[arg-type]
    assert schedules.add_many(engine, [New(ID, task="t", spec=DAILY)], if_exists="keep") == 0


def test_paused_sets_the_lease_rows_pause(engine):
    add(engine, "paused", paused=True)
    add(engine, "running")
    rows = lease_rows(engine)
    assert rows["paused"] is not None
    assert rows["running"] is None
    with engine.connect() as conn:
        by = conn.execute(
            sa.text("SELECT paused_by FROM cronjob_lease WHERE name = 'paused'")
        ).scalar_one()
    assert by == "schedules.add"


# --- The change counter -------------------------------------------------------------


def test_the_counter_rises_once_per_call(engine):
    assert rev(engine) == 0
    add(engine)
    assert rev(engine) == 1
    schedules.add_many(engine, [New(f"s{i}", task="t", spec=DAILY) for i in range(3)])
    assert rev(engine) == 2
    schedules.update(engine, ID, args={"x": 1})
    assert rev(engine) == 3
    schedules.remove(engine, ID)
    assert rev(engine) == 4
    schedules.get(engine, "s0")
    schedules.list(engine)
    assert rev(engine) == 4


def test_rows_changed_since_a_counter_value_include_tombstones(engine):
    add(engine, "a")
    add(engine, "b")
    seen = rev(engine)
    schedules.update(engine, "a", args={"x": 1})
    schedules.remove(engine, "b")
    add(engine, "c")
    now = rev(engine)
    with engine.connect() as conn:
        changed = lease.read_schedules(conn, since=seen)
        assert lease.read_schedules(conn, since=now) == []
    assert [(row.id, row.removed, row.rev) for row in changed] == [
        ("a", False, 3),
        ("b", True, 4),
        ("c", False, 5),
    ]


# --- Refused at the call, naming the id, nothing written ------------------------------


class _NotJson:
    pass


#: name -> (the call's keywords, the error, a phrase of its message)
BAD: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "spec-does-not-parse": ({"spec": "every tuesday"}, ScheduleError, "six"),
    "spec-never-fires": ({"spec": "0 0 0 30 2 *"}, ScheduleError, "never fires"),
    "local-zone": ({"spec": "CRON_TZ=Local 0 0 9 * * *"}, ScheduleError, r"'Local'.*refused"),
    "unknown-zone": ({"spec": "CRON_TZ=Mars/Olympus 0 0 9 * * *"}, ScheduleError, "unknown"),
    "args-an-object": ({"args": {"x": _NotJson()}}, RegistrationError, "not JSON"),
    "args-nan": ({"args": {"x": math.nan}}, RegistrationError, "not JSON"),
    "args-not-a-dict": ({"args": [1, 2]}, RegistrationError, "dict"),
    "args-too-large": ({"args": {"x": "y" * 65536}}, RegistrationError, "limit"),
    "args-lone-surrogate": ({"args": {"x": "\ud800"}}, RegistrationError, "surrogate"),
    "naive-at": ({"spec": None, "at": datetime(2027, 1, 5, 8)}, ScheduleError, "naive"),
    "naive-start": ({"start": datetime(2027, 1, 5, 8)}, ScheduleError, "naive"),
    "naive-end": ({"end": datetime(2027, 1, 5, 8)}, ScheduleError, "naive"),
    "end-before-start": ({"start": T0, "end": T0 - timedelta(days=1)}, ScheduleError, "before"),
    "never-within-start-end": (
        {"start": T0 + timedelta(hours=1), "end": T0 + timedelta(hours=2)},
        ScheduleError,
        "never fires",
    ),
    "at-outside-start-end": (
        {"spec": None, "at": T0, "start": T0 + timedelta(1)},
        ScheduleError,
        "outside start and end",
    ),
    "both-spec-and-at": ({"spec": DAILY, "at": T0}, ScheduleError, "exactly one"),
    "neither-spec-nor-at": ({"spec": None}, ScheduleError, "exactly one"),
    "task-not-a-name": ({"task": " padded "}, RegistrationError, "whitespace"),
}


def test_every_bad_input_is_refused_naming_the_id_with_nothing_written(engine):
    for name, (kwargs, error, phrase) in BAD.items():
        with pytest.raises(error, match=phrase) as raised:
            add(engine, **kwargs)
        assert repr(ID) in str(raised.value), name
        with (
            engine.connect() as conn,
            conn.begin(),
            pytest.raises(error, match=phrase),
        ):  # in the caller's transaction too
            add(conn, **kwargs)
        with pytest.raises(error, match=phrase):
            schedules.add_many(
                engine,
                [
                    New("fine", task="t", spec=DAILY),
                    New(ID, **{"task": "t", "spec": DAILY, **kwargs}),
                ],
            )
        nothing_written(engine)


def test_start_and_end_are_kept_in_whole_seconds_admitting_no_instant_outside(engine):
    start, end = T0 + timedelta(milliseconds=500), T0 + timedelta(days=2, milliseconds=500)
    add(engine, start=start, end=end)
    record = schedules.get(engine, ID)
    assert record is not None
    assert (record.start, record.end) == (T0 + timedelta(seconds=1), T0 + timedelta(days=2))
    add(engine, "at", spec=None, at=T0 + timedelta(milliseconds=700))
    one_off = schedules.get(engine, "at")
    assert one_off is not None and one_off.at == T0


def test_args_of_exactly_64_kib_are_taken(engine):
    args = {"x": "y" * (schedules.MAX_ARGS_BYTES - len('{"x":""}'))}
    assert add(engine, args=args)
    record = schedules.get(engine, ID)
    assert record is not None and record.args == args


@pytest.mark.parametrize(
    "id_",
    ["nul\x00inside", "lone\ud800", "x" * 201, " leading", "trailing ", "", 42],
    ids=["nul", "surrogate", "too-long", "leading-space", "trailing-space", "empty", "not-str"],
)
def test_an_id_the_database_cannot_store_is_refused(engine, id_):
    with pytest.raises(RegistrationError, match=r"schedule id|schedule needs an id"):
        add(engine, id_)
    nothing_written(engine)


def test_an_id_of_a_registered_job_is_refused(engine, monkeypatch):
    monkeypatch.setattr(default_registry, "_jobs", {})
    default_registry.register(lambda ctx: None, DAILY, "nightly")
    with pytest.raises(RegistrationError, match=r"'nightly'.*registered job"):
        add(engine, "nightly")
    registry = Registry()
    registry.register_task(lambda ctx: None, "tenant-report")
    registry.register(lambda ctx: None, DAILY, "own-job")
    with pytest.raises(RegistrationError, match=r"'own-job'.*registered job"):
        add(engine, "own-job", registry=registry)
    nothing_written(engine)


def test_an_id_with_a_lease_row_but_no_schedule_is_refused(engine):
    lease.LeaseStore(engine).ensure({"old-job": DAILY})
    with pytest.raises(RegistrationError, match=r"'old-job'.*job on record"):
        add(engine, "old-job")
    with (
        engine.connect() as conn,
        conn.begin(),
        pytest.raises(RegistrationError, match="'old-job'"),
    ):
        add(conn, "old-job")
    assert stored(engine) == {}
    assert list(lease_rows(engine)) == ["old-job"]
    assert rev(engine) == 0


def test_a_live_schedule_is_refused_with_if_exists_error_in_the_callers_transaction(engine):
    add(engine)
    with (
        engine.connect() as conn,
        conn.begin(),
        pytest.raises(RegistrationError, match="already exists"),
    ):
        add(conn, args={"v": 2})
    assert rev(engine) == 1
    record = schedules.get(engine, ID)
    assert record is not None and record.args == {}


def test_a_registry_without_the_task_is_refused(engine):
    registry = Registry()
    registry.register_task(lambda ctx: None, "remind")
    with pytest.raises(RegistrationError, match=f"{ID!r}: no task 'tenant-report'"):
        add(engine, registry=registry)
    assert add(engine, "r1", task="remind", registry=registry)
    assert list(stored(engine)) == ["r1"]


# --- Concurrent writers -----------------------------------------------------------------


def test_a_writer_whose_transaction_read_before_sees_the_latest_commit(engine, db_url):
    """A caller's transaction that read before another committed (a stale snapshot under
    MariaDB/MySQL's REPEATABLE READ) still sees that commit when it writes: its add is
    refused as a duplicate, and its update keeps the other's change."""
    plain = sa.create_engine(db_url, poolclass=NullPool)  # the database's own isolation
    try:
        add(engine, "u", args={"v": 1})
        with plain.connect() as conn, conn.begin():
            assert schedules.get(conn, "x") is None  # the snapshot is taken
            assert schedules.get(conn, "u") is not None
            if engine.dialect.name != "sqlite":  # SQLite: one writer at a time
                add(engine, "x")
                schedules.update(engine, "u", args={"v": 2})
                with pytest.raises(RegistrationError, match="'x' already exists"):
                    add(conn, "x")
            assert schedules.update(conn, "u", spec="0 0 10 * * *")
        record = schedules.get(engine, "u")
        assert record is not None and record.spec == "0 0 10 * * *"
        if engine.dialect.name != "sqlite":
            assert record.args == {"v": 2}
    finally:
        plain.dispose()


def test_a_second_writer_of_one_id_waits_for_the_first_and_is_refused(engine, db_url):
    second = lease.create_engine(db_url)  # SQLite: the fixture's engine has one connection
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            outcome["added"] = add(second, "x", args={"by": "second"})
        except Exception as exc:
            outcome["error"] = exc

    try:
        with engine.connect() as conn:
            trans = conn.begin()
            add(conn, "x", args={"by": "first"})
            thread = threading.Thread(target=write)
            thread.start()
            thread.join(1.0)
            assert thread.is_alive()  # it waits on the first's lock of the counter
            trans.commit()
        thread.join(30)
    finally:
        second.dispose()
    assert "added" not in outcome
    assert isinstance(outcome["error"], RegistrationError)
    assert "'x' already exists" in str(outcome["error"])
    record = schedules.get(engine, "x")
    assert record is not None and record.args == {"by": "first"}
    assert rev(engine) == 1


def test_concurrent_writers_each_get_a_counter_value_of_their_own(engine, db_url):
    engines = [lease.create_engine(db_url) for _ in range(6)]
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            add(engines[i], f"s{i}")
            schedules.update(engines[i], f"s{i}", args={"i": i})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for each in engines:
            each.dispose()
    assert errors == []
    with engine.connect() as conn:
        revs = sorted(row.rev for row in lease.read_schedules(conn, since=0))
    assert revs == sorted(set(revs)) and len(revs) == 6  # one value per change kept
    assert rev(engine) == 12


# --- Async ----------------------------------------------------------------------------


def run_async(db_url: str, body: Callable[[Any], Any]) -> Any:
    async def main() -> Any:
        engine = create_async_engine(as_async(db_url), poolclass=NullPool)
        try:
            return await body(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def test_the_async_forms_on_an_async_engine(engine, db_url):
    async def body(aengine):
        assert await schedules.add_async(aengine, ID, task="t", spec=DAILY, args={"a": 1})
        assert await schedules.add_many_async(aengine, [New("b", task="u", at=T0)]) == 1
        assert await schedules.update_async(aengine, ID, args={"a": 2})
        record = await schedules.get_async(aengine, ID)
        assert record is not None and record.args == {"a": 2}
        assert [r.id for r in await schedules.list_async(aengine, task="u")] == ["b"]
        assert await schedules.remove_async(aengine, "b")
        assert await schedules.remove_async(aengine, "b") is False
        with pytest.raises(ScheduleError, match="'bad'"):
            await schedules.add_async(aengine, "bad", task="t", spec="0 0 0 30 2 *")

    run_async(db_url, body)
    assert stored(engine) == {ID: False, "b": True}
    assert rev(engine) == 4


def test_the_async_forms_join_the_callers_async_transaction(engine, db_url):
    async def body(aengine):
        async with aengine.connect() as conn:
            trans = await conn.begin()
            await conn.execute(sa.text("INSERT INTO tenants (id) VALUES (7)"))
            await schedules.add_async(conn, "rolled-back", task="t", spec=DAILY)
            assert await schedules.get_async(conn, "rolled-back") is not None
            await trans.rollback()
        async with aengine.begin() as conn:
            await conn.execute(sa.text("INSERT INTO tenants (id) VALUES (8)"))
            await schedules.add_async(conn, "committed", task="t", spec=DAILY)

    run_async(db_url, body)
    assert tenants(engine) == [8]
    assert stored(engine) == {"committed": False}
    assert list(lease_rows(engine)) == ["committed"]
    assert rev(engine) == 1


def test_async_forms_refuse_a_sync_engine(engine):
    with pytest.raises(TypeError, match="AsyncConnection or AsyncEngine"):
        asyncio.run(schedules.get_async(engine, ID))  # type: ignore[arg-type]


# --- Many at once ---------------------------------------------------------------------


def test_add_many_of_ten_thousand_in_one_transaction(engine):
    news = [New(f"tenant:{i}", task="t", spec=DAILY, args={"tenant": i}) for i in range(10_000)]
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO tenants (id) VALUES (1)"))
        assert schedules.add_many(conn, news) == 10_000
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM cronjob_schedule")).scalar() == 10_000
        assert conn.execute(sa.text("SELECT COUNT(*) FROM cronjob_lease")).scalar() == 10_000
    assert rev(engine) == 1
    assert len(schedules.list(engine, prefix="tenant:1")) == 1 + 10 + 100 + 1000


@pytest.mark.parametrize(
    "args", [{1: "a"}, {"k": (1, 2)}, {None: 1}], ids=["int-key", "tuple", "none-key"]
)
def test_args_that_json_would_change_are_refused(migrated_engine, args):
    with pytest.raises(RegistrationError, match=r"^schedule .x.: args would change"):
        schedules.add(migrated_engine, "x", task="t", spec="0 * * * * *", args=args)
    assert schedules.get(migrated_engine, "x") is None


def test_schedules_over_are_retired_then_deleted_with_their_lease_rows(migrated_engine):
    engine = migrated_engine
    past = datetime(2025, 1, 1, tzinfo=UTC)
    schedules.add(engine, "one-off", task="t", at=past)
    schedules.add(engine, "ended", task="t", spec="0 * * * * *", start=past, end=past)
    schedules.add(engine, "live", task="t", spec="0 * * * * *")
    schedules.add(engine, "removed", task="t", spec="0 * * * * *")
    schedules.remove(engine, "removed")
    store = lease.LeaseStore(engine)
    with engine.connect() as conn:
        before = lease.read_schedule_rev(conn)
    # Done long ago: tombstones now (a change the replicas read), deleted later.
    assert lease.prune_schedules(store, days=14) == 0
    with engine.connect() as conn:
        assert lease.read_schedule_rev(conn) == before + 1
        changed = {row.id: row.removed for row in lease.read_schedules(conn, since=before)}
    assert changed == {"one-off": True, "ended": True}
    assert [r.id for r in schedules.list(engine)] == ["live"]
    # Every tombstone older than the horizon goes, with its lease row.
    assert lease.prune_schedules(store, days=0) == 3
    with engine.connect() as conn:
        names = set(conn.execute(sa.text("SELECT name FROM cronjob_lease")).scalars())
        rows = conn.execute(sa.text("SELECT id FROM cronjob_schedule")).scalars().all()
    assert names == {"live"} and rows == ["live"]


def test_a_replace_with_the_same_timing_keeps_the_deployment_a_new_timing_clears_it(
    migrated_engine,
):
    engine = migrated_engine
    schedules.add(engine, "r", task="t", spec="0 * * * * *", args={"v": 1})
    store = lease.LeaseStore(engine)
    store.ensure(["r"])  # a replica ran it: deployed
    deployed = store.read(["r"])["r"].deployed
    assert deployed is not None
    schedules.add(engine, "r", task="t", spec="0 * * * * *", args={"v": 2}, if_exists="replace")
    schedules.update(engine, "r", end=datetime(2099, 1, 1, tzinfo=UTC))
    assert store.read(["r"])["r"].deployed == deployed  # no instant of it moved
    schedules.add(engine, "r", task="t", spec="30 * * * * *", if_exists="replace")
    row = store.read(["r"])["r"]
    assert row.deployed is None  # a new timing: owed from its commit, nothing before
    assert row.committed is not None and row.committed == row.spec_changed
