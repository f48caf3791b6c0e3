"""A schedule's own policies at the API: checked at the call as registration checks them
(the same messages, naming the schedule's id), nothing written of a bad one; stored,
read back, changed and cleared; the row's format tells a previous release to leave it.

The policies at run time are in test_schedule_policies.py.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import admin, schedules
from cronjob._policy import CatchUp, Overlap
from cronjob.admin._cli import main
from cronjob.schedules._policies import described, own_of, with_own
from tests.test_admin_schedules import live_replica
from tests.test_schedules_api import run_async

DAILY = "0 0 9 * * *"
#: A spec that never fires within a test: 09:00 on 1 January.
YEARLY = "0 0 9 1 1 *"
ID = "report:tenant-42"


@pytest.fixture
def engine(db_engine: sa.Engine) -> sa.Engine:
    lease.migrate(db_engine)
    return db_engine


def row(engine: sa.Engine, id_: str = ID) -> tuple[int, str | None]:
    """The schedule's (format, policies) as stored."""
    with engine.connect() as conn:
        [found] = lease.read_schedules(conn, ids=[id_])
    return found.format, found.policies


def rev(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return lease.read_schedule_rev(conn)


def add(db: Any, id_: str = ID, **kwargs: Any) -> bool:
    kwargs.setdefault("task", "tenant-report")
    kwargs.setdefault("spec", DAILY)
    return schedules.add(db, id_, **kwargs)


BAD = [
    (
        {"overlap": "queue"},
        "schedule 'r': overlap must be one of 'skip', 'buffer_one', 'cancel_other', got 'queue'",
    ),
    (
        {"catch_up": True},
        "schedule 'r': catch_up must be one of 'latest', 'none', 'all', 'oldest', got True",
    ),
    ({"catch_up_window": 0}, "schedule 'r': catch_up_window must be positive, got 0"),
    (
        {"catch_up_window": "1h"},
        "schedule 'r': catch_up_window must be seconds (a number) or a timedelta, got '1h'",
    ),
    ({"jitter": -5}, "schedule 'r': jitter must be positive, got -5"),
    ({"jitter": timedelta(0)}, "schedule 'r': jitter must be positive, got datetime.timedelta(0)"),
    (
        {"heartbeat": "ftp://hc-ping.com/k"},
        "schedule 'r': heartbeat must be an http or https URL with a host, got 'ftp://hc-ping.com/k'",
    ),
    ({"heartbeat": 42}, "schedule 'r': heartbeat must be a URL (a str), got 42"),
    (
        {"heartbeat": "https://hc-ping.com/" + "k" * 5000},
        "schedule 'r': its policies take 5036 bytes as JSON; the limit is 4096",
    ),
]


class TestChecked:
    @pytest.mark.parametrize(("options", "message"), BAD)
    def test_a_bad_policy_is_refused_with_registrations_message_naming_the_id(
        self, engine, options, message
    ):
        with pytest.raises(cronjob.RegistrationError, match=rf"^{_re(message)}$"):
            add(engine, "r", **options)
        assert schedules.list(engine) == [] and rev(engine) == 0

    @pytest.mark.parametrize(("options", "message"), BAD[:3])
    def test_registration_refuses_the_same_values_with_the_same_words(self, options, message):
        with pytest.raises(
            cronjob.RegistrationError, match=rf"^{_re(message)}$".replace("schedule", "job")
        ):
            cronjob.Registry().register(lambda ctx: None, DAILY, "r", **options)

    def test_add_many_writes_nothing_when_one_policy_is_refused(self, engine):
        news = [
            schedules.New("a", "tenant-report", DAILY, jitter=5),
            schedules.New("b", "tenant-report", DAILY, overlap="queue"),
        ]
        with pytest.raises(cronjob.RegistrationError, match=r"^schedule 'b': overlap must be"):
            schedules.add_many(engine, news)
        assert schedules.list(engine) == [] and rev(engine) == 0

    def test_a_refused_update_changes_nothing(self, engine):
        add(engine, jitter=5)
        before = (schedules.get(engine, ID), rev(engine))
        with pytest.raises(cronjob.RegistrationError, match=rf"^schedule '{ID}': heartbeat must"):
            schedules.update(engine, ID, heartbeat="mailto:ops@example.com")
        assert (schedules.get(engine, ID), rev(engine)) == before

    def test_the_policies_of_new_are_keyword_only_and_code_is_no_option(self, engine):
        with pytest.raises(TypeError):
            schedules.New("a", "t", DAILY, None, {}, None, None, False, "buffer_one")  # type: ignore[misc]
        with pytest.raises(TypeError):
            add(engine, on_failure=print)
        with pytest.raises(TypeError):
            add(engine, timeout=30)

    def test_jitter_at_or_past_the_interval_is_taken_as_registration_takes_it(self, engine):
        """Registration caps the delay below the gap to the next instant; so does a
        schedule's (see test_policies_jitter.py): nothing to refuse."""
        assert add(engine, spec="0 * * * * *", jitter=600)
        assert schedules.get(engine, ID).jitter == timedelta(minutes=10)


class TestStored:
    def test_get_and_list_give_the_schedules_own_policies_none_for_the_tasks(self, engine):
        add(
            engine,
            overlap="buffer_one",
            catch_up=CatchUp.ALL,
            catch_up_window=timedelta(hours=2),
            jitter=7.5,
            heartbeat="https://hc-ping.com/secret",
        )
        add(engine, "plain")
        got = schedules.get(engine, ID)
        assert got is not None
        assert (got.overlap, got.catch_up, got.catch_up_window, got.jitter, got.heartbeat) == (
            Overlap.BUFFER_ONE,
            CatchUp.ALL,
            timedelta(hours=2),
            timedelta(seconds=7.5),
            "https://hc-ping.com/secret",
        )
        plain = schedules.get(engine, "plain")
        assert plain is not None
        assert (plain.overlap, plain.catch_up, plain.catch_up_window, plain.jitter) == (None,) * 4
        assert plain.heartbeat is None
        assert {r.id: r.overlap for r in schedules.list(engine)} == {
            ID: Overlap.BUFFER_ONE,
            "plain": None,
        }

    def test_a_row_with_policies_is_format_2_one_without_format_1(self, engine):
        add(engine, jitter=5)
        add(engine, "plain")
        assert row(engine) == (lease.POLICIES_FORMAT, '{"jitter":5.0}')
        assert row(engine, "plain") == (1, None)
        assert lease.POLICIES_FORMAT == 2 == lease.SCHEDULE_FORMAT

    def test_update_changes_only_the_policies_given_and_none_gives_one_back(self, engine):
        add(engine, jitter=5, overlap="cancel_other")
        assert schedules.update(engine, ID, catch_up="none")
        got = schedules.get(engine, ID)
        assert (got.jitter, got.overlap, got.catch_up) == (
            timedelta(seconds=5),
            Overlap.CANCEL_OTHER,
            CatchUp.NONE,
        )
        assert got.spec == DAILY
        schedules.update(engine, ID, jitter=None, overlap=None, catch_up=None)
        got = schedules.get(engine, ID)
        assert (got.jitter, got.overlap, got.catch_up) == (None, None, None)
        assert row(engine) == (1, None)  # a previous release runs it again
        schedules.update(engine, ID, heartbeat="https://hc-ping.com/k")
        assert row(engine) == (2, '{"heartbeat":"https://hc-ping.com/k"}')

    def test_replace_writes_the_new_policies_and_format(self, engine):
        add(engine, jitter=5)
        add(engine, if_exists="replace")
        assert row(engine) == (1, None)
        add(engine, if_exists="replace", overlap="buffer_one")
        assert row(engine) == (2, '{"overlap":"buffer_one"}')

    def test_the_async_form_takes_them(self, engine, db_url):
        async def body(aengine: Any) -> None:
            await schedules.add_async(aengine, ID, task="t", spec=DAILY, overlap="buffer_one")
            await schedules.update_async(aengine, ID, jitter=3)

        run_async(db_url, body)
        got = schedules.get(engine, ID)
        assert (got.overlap, got.jitter) == (Overlap.BUFFER_ONE, timedelta(seconds=3))


class TestLaidOver:
    def test_the_schedules_own_policies_lie_over_its_tasks_the_rest_stays(self):
        task = cronjob.Policy(timeout=timedelta(seconds=30), jitter=timedelta(seconds=9))
        own = '{"catch_up":"all","jitter":2.0}'
        policy = with_own(task, "r", own)
        assert policy == cronjob.Policy(
            timeout=timedelta(seconds=30), jitter=timedelta(seconds=2), catch_up=CatchUp.ALL
        )
        assert with_own(task, "r", None) is task

    @pytest.mark.parametrize(
        "text", ["[1]", '{"timeout":5}', '{"overlap":"queue"}', "{", '{"jitter":-1}']
    )
    def test_a_malformed_row_is_a_schedule_error_naming_the_id(self, text):
        with pytest.raises(cronjob.ScheduleError, match=r"^schedule 'r': its policies "):
            own_of("r", text)

    def test_operators_see_the_heartbeat_by_its_host_only(self):
        text = '{"heartbeat":"https://hc-ping.com/secret","overlap":"skip"}'
        assert described(text) == {"overlap": "skip", "heartbeat": "hc-ping.com"}
        assert described("{") == {"policies": "{"}
        assert described(None) == {}


def _re(message: str) -> str:
    return re.escape(message)


class TestShown:
    def test_status_lays_a_schedules_own_policies_over_its_tasks(self, engine, capsys):
        schedules.add(
            engine, "own", task="report", spec=YEARLY, jitter=30, heartbeat="https://hc.io/k"
        )
        schedules.add(engine, "plain", task="report", spec=YEARLY)
        policies = {"report": {"jitter": 5.0, "timeout": 60.0}}
        live_replica(engine, policies=policies)
        jobs = {job.name: job for job in admin.status(engine).jobs}
        assert jobs["own"].policies == {"jitter": 30.0, "timeout": 60.0, "heartbeat": "hc.io"}
        assert jobs["plain"].policies == {"jitter": 5.0, "timeout": 60.0}
        url = engine.url.render_as_string(hide_password=False)
        assert main(["status", "--json", "--database-url", url]) in (0, 1)
        shown = {job["name"]: job for job in json.loads(capsys.readouterr().out)["jobs"]}
        assert shown["own"]["policies"] == {"jitter": 30.0, "timeout": 60.0, "heartbeat": "hc.io"}

    def test_cronjob_schedules_shows_them_the_heartbeat_by_its_host(self, engine, capsys):
        schedules.add(
            engine,
            "own",
            task="report",
            spec=YEARLY,
            overlap="buffer_one",
            catch_up="all",
            catch_up_window=7200,
            heartbeat="https://hc.io/secret-key",
        )
        schedules.add(engine, "plain", task="report", spec=YEARLY)
        url = engine.url.render_as_string(hide_password=False)
        assert main(["schedules", "--database-url", url]) == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert lines[0].endswith("ARGS (BYTES)  OWN POLICIES")
        assert lines[1].endswith("overlap buffer_one, catch-up all within 2h, heartbeat to hc.io")
        assert lines[2].endswith(" -")
        assert "secret-key" not in out
        assert main(["schedules", "--json", "--database-url", url]) == 0
        listed = {found["id"]: found for found in json.loads(capsys.readouterr().out)}
        assert listed["own"]["policies"] == {
            "overlap": "buffer_one",
            "catch_up": "all",
            "catch_up_window": 7200.0,
            "heartbeat": "hc.io",
        }
        assert listed["plain"]["policies"] == {}

    def test_without_policies_the_schedules_table_keeps_its_columns(self, engine, capsys):
        schedules.add(engine, "plain", task="report", spec=YEARLY)
        url = engine.url.render_as_string(hide_password=False)
        assert main(["schedules", "--database-url", url]) == 0
        assert capsys.readouterr().out.splitlines()[0].endswith("ARGS (BYTES)")
