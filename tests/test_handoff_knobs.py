"""The hand-off's knobs (``retry_within``, ``hold``, ``send_timeout``) on every publisher
and on ``cronjob beat``, derived when unset, and the warning at registration when the
given ones would keep a round sending past the job's next instant.

The publishers are built on real clients (Redis, RabbitMQ): building one sends nothing,
so no test here needs a broker to answer."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import redis
import rq
from celery import Celery

import cronjob
from cronjob import RegistrationError, Registry
from cronjob.contrib import Handoff, handoff, streams
from cronjob.contrib import celery as celery_target
from cronjob.contrib import dramatiq as dramatiq_target
from cronjob.contrib import rq as rq_target
from cronjob.contrib._handoff import HOLD_SECONDS, SEND_TIMEOUT
from cronjob.contrib.celery import BeatScheduleError, register_beat_schedule
from cronjob.engine._data import job_of
from lease import ScheduleRow
from tests._celery import RABBITMQ_URL, REDIS_URL, client_app
from tests._dramatiq import publisher_broker
from tests._process import run_python

NOW = datetime(2026, 3, 8, 6, 0, tzinfo=UTC)
#: The knobs as each test gives them, and as the hand-off must hold them.
GIVEN = {"retry_within": 3, "hold": 30, "send_timeout": 4}
HELD = (3.0, 30.0, 4.0)
#: What an unset knob is: derived.
DERIVED = (None, HOLD_SECONDS, min(SEND_TIMEOUT, HOLD_SECONDS / 2))


def knobs(job: Handoff) -> tuple[float | None, float, float]:
    return (job.retry_within, job.hold, job.send_timeout)


def rq_queue() -> rq.Queue:
    connection = redis.Redis.from_url(REDIS_URL)
    return rq.Queue(f"cronjob-test-{uuid.uuid4().hex[:12]}", connection=connection)


def celery_app() -> Celery:
    return client_app(RABBITMQ_URL)


#: Each publisher, built with the given knobs (``**kw``) on a real client.
PUBLISHERS = {
    "rq": lambda **kw: rq_target.enqueue(rq_queue(), "app.tasks.export", **kw),
    "celery": lambda **kw: celery_target.send(celery_app(), "app.tasks.export", **kw),
    "dramatiq": lambda **kw: dramatiq_target.send(publisher_broker("redis"), "export", **kw),
    "streams": lambda **kw: streams.publish(REDIS_URL, stream="cronjob-test-knobs", **kw),
}


class _Unsent:
    """A publisher that is never asked to send: registration alone is under test."""

    target = "test"

    def describe(self) -> dict[str, str]:
        return {}

    def publish(self, occurrence: object) -> None:
        raise AssertionError("registration must not publish")


class TestEachPublisher:
    @pytest.mark.parametrize("target", sorted(PUBLISHERS))
    def test_it_passes_its_knobs_to_the_handoff_it_returns(self, target):
        job = PUBLISHERS[target](**GIVEN)
        assert isinstance(job, Handoff)
        assert knobs(job) == HELD

    @pytest.mark.parametrize("target", sorted(PUBLISHERS))
    def test_unset_knobs_are_derived(self, target):
        assert knobs(PUBLISHERS[target]()) == DERIVED

    @pytest.mark.parametrize("target", sorted(PUBLISHERS))
    @pytest.mark.parametrize(
        ("given", "message"),
        [
            ({"hold": 0}, r"^handoff: hold must be a number of seconds > 0, got 0$"),
            (
                {"hold": 10, "send_timeout": 10},
                r"^handoff: send_timeout must be a number of seconds > 0 and below the "
                r"hold \(10s\), got 10$",
            ),
            (
                {"retry_within": -1},
                r"^handoff: retry_within must be a number of seconds >= 0, got -1$",
            ),
        ],
    )
    def test_it_refuses_a_bad_knob(self, target, given, message):
        with pytest.raises(RegistrationError, match=message):
            PUBLISHERS[target](**given)

    def test_handoff_takes_none_for_each_knob(self):
        job = handoff(_Unsent(), retry_within=None, hold=None, send_timeout=None)
        assert knobs(job) == DERIVED


def beat_app(**entries) -> Celery:
    app = Celery("knobs-test", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = entries
    return app


class TestBeat:
    def test_the_option_applies_to_every_entry_and_an_entrys_own_wins(self):
        app = beat_app(
            plain={"task": "proj.a", "schedule": 60},
            own={
                "task": "proj.b",
                "schedule": 60,
                "options": {"queue": "q", "cronjob_retry_within": 1, "cronjob_hold": 40},
            },
        )
        registry = Registry()
        register_beat_schedule(app, registry, retry_within=3, hold=30, send_timeout=4)
        jobs = {job.name: job.fn for job in registry.jobs}
        assert knobs(jobs["plain"]) == (3.0, 30.0, 4.0)
        assert knobs(jobs["own"]) == (1.0, 40.0, 4.0)
        # Taken out of the options: never passed to apply_async.
        assert jobs["own"].publisher.options == {"queue": "q"}
        # The app's own entry is left as it was.
        assert app.conf.beat_schedule["own"]["options"]["cronjob_hold"] == 40

    def test_unset_knobs_are_derived(self):
        registry = Registry()
        register_beat_schedule(beat_app(e={"task": "proj.a", "schedule": 60}), registry)
        [job] = registry.jobs
        assert knobs(job.fn) == DERIVED

    @pytest.mark.parametrize(
        ("options", "defaults", "message"),
        [
            (
                {"cronjob_hold": "ten"},
                {},
                r"^beat entry 'bad': options\['cronjob_hold'\] must be a number of "
                r"seconds > 0, not 'ten'$",
            ),
            (
                {"cronjob_send_timeout": 0},
                {},
                r"^beat entry 'bad': options\['cronjob_send_timeout'\] must be a number of "
                r"seconds > 0, not 0$",
            ),
            (
                {"cronjob_retry_within": -2},
                {},
                r"^beat entry 'bad': options\['cronjob_retry_within'\] must be a number of "
                r"seconds >= 0, not -2$",
            ),
            (
                {"cronjob_send_timeout": 30},
                {"hold": 20},
                r"^beat entry 'bad': send_timeout \(30 s\) must be below the hold \(20 s\)$",
            ),
            (
                {},
                {"send_timeout": HOLD_SECONDS},  # the command's: the first entry is named
                rf"^beat entry 'good': send_timeout \({HOLD_SECONDS:g} s\) must be below the "
                rf"hold \({HOLD_SECONDS:g} s\)$",
            ),
        ],
    )
    def test_a_bad_knob_is_refused_naming_the_entry_and_registers_nothing(
        self, options, defaults, message
    ):
        app = beat_app(
            good={"task": "proj.a", "schedule": 60},
            bad={"task": "proj.b", "schedule": 60, "options": options},
        )
        registry = Registry()
        with pytest.raises(BeatScheduleError, match=message):
            register_beat_schedule(app, registry, **defaults)
        assert registry.jobs == ()

    def test_the_commands_options_reach_the_jobs(self, tmp_path):
        """A real ``cronjob beat``: the registration warning names each entry with the
        knob it got, from the command's option or from its own ``options``."""
        (tmp_path / "proj.py").write_text(
            "from celery import Celery\n"
            "app = Celery('proj', broker='memory://')\n"
            "app.conf.beat_schedule = {\n"
            "    'plain': {'task': 'proj.a', 'schedule': 5},\n"
            "    'own': {'task': 'proj.b', 'schedule': 5,\n"
            "            'options': {'cronjob_retry_within': 8}},\n"
            "}\n"
        )
        database = f"sqlite:///{tmp_path / 'beat.sqlite'}"
        done = run_python(
            "-c",
            "import sys; from cronjob.admin._cli import main; "
            # Stop once registered: the scheduler itself is not under test.
            "import cronjob.contrib.celery._beat_cli as cli; cli.run_command = lambda a: 0; "
            "raise SystemExit(main())",
            "beat",
            "-A",
            "proj",
            "--retry-within",
            "6",
            "--database-url",
            database,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert "job 'plain': retry_within=6s may keep a round" in done.stderr
        assert "job 'own': retry_within=8s may keep a round" in done.stderr

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--hold", "0"], "argument --hold: must be a number of seconds above 0, not '0'"),
            (
                ["--retry-within", "soon"],
                "argument --retry-within: must be a number of seconds, 0 or more, not 'soon'",
            ),
            (
                ["--hold", "20", "--send-timeout", "20"],
                "beat entry 'e': send_timeout (20 s) must be below the hold (20 s)",
            ),
        ],
    )
    def test_the_command_refuses_a_bad_option_with_status_2(self, tmp_path, argv, message):
        (tmp_path / "proj.py").write_text(
            "from celery import Celery\n"
            "app = Celery('proj', broker='memory://')\n"
            "app.conf.beat_schedule = {'e': {'task': 'proj.a', 'schedule': 5}}\n"
        )
        done = run_python("-m", "cronjob", "beat", "-A", "proj", *argv, "--list", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr.splitlines()[-1]


def schedule_row(id: str, spec: str) -> ScheduleRow:
    return ScheduleRow(
        id=id,
        task="tenant-export",
        spec=spec,
        at=None,
        args="{}",
        start=None,
        end=None,
        rev=1,
        removed=False,
        created=NOW,
        updated=NOW,
    )


def warnings_of(caplog) -> list[str]:
    """The registration's warnings about the period (not the hold's own, see
    tests/test_registry.py)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "may keep a round" in r.getMessage()
    ]


class TestTheWarningAtRegistration:
    def test_retry_within_past_a_5s_period_warns_naming_the_job(self, caplog):
        registry = Registry()
        with caplog.at_level("WARNING", logger="cronjob"):
            registry.register(handoff(_Unsent(), retry_within=10), "@every 5s", "five")
        assert warnings_of(caplog) == [
            "job 'five': retry_within=10s may keep a round of this hand-off sending for "
            "10s, which reaches the 5s between two of its instants: the next instant would "
            "come due while it still sends; lower it, or leave it unset to have it derived "
            "from the period"
        ]

    def test_a_cron_schedules_shortest_gap_is_read_from_its_instants(self, caplog):
        """Every 5 s of minute 0, then nothing for the rest of the hour: from 06:00:00
        the next instants are 5 s apart."""
        job = handoff(_Unsent(), retry_within=10)
        with caplog.at_level("WARNING", logger="cronjob"):
            job.check_period("burst", cronjob.parse("*/5 0 * * * *"), now=NOW)
        [message] = warnings_of(caplog)
        assert message.startswith("job 'burst': retry_within=10s may keep a round")
        assert "the 5s between two of its instants" in message

    def test_a_given_send_timeout_counts_too(self, caplog):
        registry = Registry()
        job = handoff(_Unsent(), hold=30, send_timeout=6)
        with caplog.at_level("WARNING", logger="cronjob"):
            registry.register(job, "@every 5s", "five")
        [message] = warnings_of(caplog)
        assert message.startswith("job 'five': send_timeout=6s may keep a round")

    def test_given_retries_and_send_timeout_add_up(self, caplog):
        registry = Registry()
        job = handoff(_Unsent(), retry_within=3, hold=30, send_timeout=3)
        with caplog.at_level("WARNING", logger="cronjob"):
            registry.register(job, "@every 5s", "five")
        [message] = warnings_of(caplog)
        assert message.startswith(
            "job 'five': retry_within=3s + send_timeout=3s may keep a round of this "
            "hand-off sending for 6s"
        )

    def test_derived_knobs_never_warn(self, caplog):
        registry = Registry()
        with caplog.at_level("WARNING", logger="cronjob"):
            registry.register(handoff(_Unsent()), "@every 5s", "five")
            registry.register(handoff(_Unsent(), hold=30), "@every 1s", "one")
        assert warnings_of(caplog) == []

    def test_a_daily_job_does_not_warn(self, caplog):
        registry = Registry()
        with caplog.at_level("WARNING", logger="cronjob"):
            registry.register(handoff(_Unsent(), retry_within=10), "0 0 3 * * *", "daily")
        assert warnings_of(caplog) == []

    def test_a_task_warns_for_its_schedules_made_of_data_once_a_spec(self, caplog):
        """A task has no schedule of its own: its schedules are checked as each is made a
        job (at load and at each change), the first of each spec named."""
        registry = Registry()
        with caplog.at_level("WARNING", logger="cronjob"):
            registry.register_task(handoff(_Unsent(), retry_within=10), "tenant-export")
            assert warnings_of(caplog) == []
            [task] = registry.tasks
            for tenant, spec in [(42, "@every 5s"), (43, "@every 5s"), (44, "*/2 * * * * *")]:
                job_of(schedule_row(f"export:tenant-{tenant}", spec), task)
        first, second = warnings_of(caplog)
        assert first.startswith("job 'export:tenant-42': retry_within=10s may keep a round")
        assert second.startswith("job 'export:tenant-44': retry_within=10s may keep a round")

    def test_a_one_off_has_no_gap_and_no_warning(self, caplog):
        from cronjob._bounds import OneOff

        job = handoff(_Unsent(), retry_within=10)
        with caplog.at_level("WARNING", logger="cronjob"):
            job.check_period("once", OneOff("@at 2026-03-08T07:00:00Z", at=NOW), now=NOW)
        assert warnings_of(caplog) == []
