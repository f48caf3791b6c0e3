"""``cronjob beat -A APP``: a Celery ``beat_schedule`` read into cronjob jobs.

The mapping is checked entry form by entry form, and against Celery's own arithmetic
(the next instants of each crontab as Celery computes them); then a real ``cronjob
beat`` process sends an every-second entry to a real worker."""

from __future__ import annotations

import signal
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar

import cronjob
from cronjob.contrib.celery import BeatScheduleError, register_beat_schedule
from cronjob.contrib.celery._beat import app_zone, beat_entries
from tests._celery import (
    RABBITMQ_URL,
    REDIS_URL,
    ROOT,
    delete_queue,
    new_queue,
    require_broker,
    start_worker,
)
from tests._process import run_python, watched

T = "proj.tasks.t"


def app(**conf) -> Celery:
    celery_app = Celery("beat-test", broker="memory://", set_as_current=False)
    celery_app.conf.update(**conf)
    return celery_app


def spec_of(when, **conf) -> str:
    celery_app = app(**conf)
    [entry] = beat_entries({"e": {"task": T, "schedule": when}}, app_zone(celery_app))
    return entry.spec


class TestCrontabFields:
    @pytest.mark.parametrize(
        ("when", "spec"),
        [
            (crontab(), "0 * * * * *"),
            (crontab(minute="*/15"), "0 */15 * * * *"),
            (crontab(minute=0, hour="*/3"), "0 0 */3 * * *"),
            (crontab(minute="0,30", hour="9,17"), "0 0,30 9,17 * * *"),
            (crontab(minute=5, hour="9-17"), "0 5 9-17 * * *"),
            (crontab(minute="1,13,30-45,50-59/2"), "0 1,13,30-45,50,52,54,56,58 * * * *"),
            (crontab(minute=0, hour=0, day_of_week="mon-fri"), "0 0 0 * * 1-5"),
            (crontab(minute=0, hour=0, day_of_week="sun"), "0 0 0 * * 0"),
            (crontab(minute=0, hour=0, day_of_week="sat,sun"), "0 0 0 * * 0,6"),
            (crontab(minute=0, hour=0, day_of_week="fri-mon"), "0 0 0 * * 0-1,5-6"),
            (crontab(minute=0, hour=0, day_of_week="*/2"), "0 0 0 * * */2"),
            (crontab(minute=0, hour=3, day_of_month="1,15"), "0 0 3 1,15 * *"),
            (
                crontab(minute=0, hour=3, day_of_month="2-30/2"),
                "0 0 3 2,4,6,8,10,12,14,16,18,20,22,24,26,28,30 * *",
            ),
            (crontab(minute=0, hour=0, day_of_month=1, month_of_year="*/3"), "0 0 0 1 */3 *"),
            (crontab(minute=0, hour=0, month_of_year="jan,jul"), "0 0 0 * 1,7 *"),
            (crontab(minute=0, hour=0, day_of_month="1-31"), "0 0 0 * * *"),
            (crontab.from_string("30 4 * * 1"), "0 30 4 * * 1"),
        ],
    )
    def test_a_crontab_becomes_the_six_field_spec(self, when, spec):
        assert spec_of(when) == spec
        cronjob.parse(spec)  # and it is one cronjob reads

    def test_it_refuses_a_crontab_restricting_both_day_fields(self):
        with pytest.raises(
            BeatScheduleError,
            match=r"^beat entry 'e': crontab restricts both day_of_month \(1-7\) and "
            r"day_of_week \(1\); Celery runs on days in both, cron on days in either",
        ):
            spec_of(crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon"))


class TestZones:
    def test_the_apps_timezone_becomes_the_specs_zone(self):
        assert spec_of(crontab(minute=0, hour=3), timezone="Europe/Berlin") == (
            "CRON_TZ=Europe/Berlin 0 0 3 * * *"
        )

    def test_utc_by_default(self):
        assert spec_of(crontab(minute=0, hour=3)) == "0 0 3 * * *"

    def test_a_timezone_applies_with_enable_utc_false_too(self):
        spec = spec_of(crontab(minute=0, hour=3), timezone="America/New_York", enable_utc=False)
        assert spec == "CRON_TZ=America/New_York 0 0 3 * * *"

    def test_utc_named_is_utc(self):
        assert spec_of(crontab(minute=0, hour=3), timezone="UTC") == "0 0 3 * * *"

    def test_it_refuses_the_machines_local_zone(self):
        with pytest.raises(
            BeatScheduleError,
            match=r"^beat entry 'e': the app reads crontabs on the machine's local zone "
            r"\(enable_utc is False and timezone is unset\)",
        ):
            spec_of(crontab(minute=0, hour=3), enable_utc=False)

    def test_intervals_need_no_zone_even_on_local_time(self):
        assert spec_of(timedelta(minutes=5), enable_utc=False) == "@every 300s"


class TestAgreesWithCelery:
    """The spec's next instants are Celery's own for the same crontab (away from DST
    changes, where each follows its own rules: cronjob's are in docs/concepts)."""

    @pytest.mark.parametrize(
        "when",
        [
            crontab(minute="*/15"),
            crontab(minute=30, hour="9-17", day_of_week="mon-fri"),
            crontab(minute=0, hour=0, day_of_month="1,15"),
            crontab(minute=0, hour=0, day_of_month=1, month_of_year="*/3"),
            crontab(minute=45, hour=23, day_of_week="fri-mon"),
            crontab(minute=0, hour=12, day_of_week="*/2"),
        ],
    )
    @pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "Asia/Kolkata"])
    def test_the_next_instants_match(self, when, zone):
        celery_app = app(timezone=zone)
        spec = spec_of(when, timezone=zone)
        ours = cronjob.parse(spec)
        tz = ZoneInfo(zone)
        moment = datetime(2026, 1, 5, 10, 7, tzinfo=UTC)
        # Europe's first change of 2026 is on 29 March; India has none.
        while (mine := ours.next(moment)) < datetime(2026, 3, 28, tzinfo=UTC):
            local = moment.astimezone(tz)
            probe = crontab(
                minute=when._orig_minute,
                hour=when._orig_hour,
                day_of_week=when._orig_day_of_week,
                day_of_month=when._orig_day_of_month,
                month_of_year=when._orig_month_of_year,
                nowfun=lambda local=local: local,
                app=celery_app,
            )
            theirs = local + probe.remaining_estimate(local)
            assert mine == theirs.astimezone(UTC), (spec, moment)
            moment = mine


class TestIntervals:
    @pytest.mark.parametrize(
        ("when", "spec"),
        [
            (timedelta(minutes=5), "@every 300s"),
            (timedelta(hours=1, seconds=30), "@every 3630s"),
            (30, "@every 30s"),
            (30.0, "@every 30s"),
            (schedule(run_every=timedelta(hours=2)), "@every 7200s"),
            (schedule(run_every=10.0, relative=True), "@every 10s"),
        ],
    )
    def test_an_interval_becomes_every_on_the_epochs_multiples(self, when, spec):
        assert spec_of(when) == spec

    @pytest.mark.parametrize("when", [0.5, timedelta(milliseconds=1500), 0, -5])
    def test_it_refuses_a_period_that_is_not_whole_positive_seconds(self, when):
        with pytest.raises(BeatScheduleError, match=r"^beat entry 'e': the period .* s is not a"):
            spec_of(when)


class CustomSchedule(schedule):
    pass


class TestRefused:
    def test_solar_names_the_entry(self):
        with pytest.raises(
            BeatScheduleError, match=r"^beat entry 'e': solar schedules have no cron spec"
        ):
            spec_of(solar("sunset", 48.8, 2.3))

    @pytest.mark.parametrize("when", [CustomSchedule(5), "*/5 * * * *", None])
    def test_another_schedule_names_the_entry(self, when):
        with pytest.raises(BeatScheduleError, match=r"^beat entry 'e': schedule .* is not a"):
            spec_of(when)

    def test_an_unknown_key_is_named(self):
        with pytest.raises(BeatScheduleError, match=r"^beat entry 'e': unknown key 'scheduel'"):
            beat_entries({"e": {"task": T, "scheduel": 5}}, UTC)

    def test_an_entry_without_a_task(self):
        with pytest.raises(BeatScheduleError, match=r"^beat entry 'e': 'task' must name a task"):
            beat_entries({"e": {"schedule": 5}}, UTC)


class TestRegistration:
    def test_each_entry_is_a_job_named_by_its_key_with_args_and_options(self):
        celery_app = app(timezone="Europe/Paris")
        celery_app.conf.beat_schedule = {
            "nightly-export": {
                "task": T,
                "schedule": crontab(minute=0, hour=3),
                "args": (1,),
                "kwargs": {"full": True},
                "options": {"queue": "exports", "priority": 3, "expires": 600},
            },
            "heartbeat": {"task": "proj.tasks.ping", "schedule": 30.0},
        }
        registry = cronjob.Registry()
        assert register_beat_schedule(celery_app, registry) == ["nightly-export", "heartbeat"]
        jobs = {job.name: job for job in registry.jobs}
        assert jobs["nightly-export"].schedule.spec == "CRON_TZ=Europe/Paris 0 0 3 * * *"
        assert jobs["heartbeat"].schedule.spec == "@every 30s"
        publisher = jobs["nightly-export"].fn.publisher
        assert publisher.describe() == {
            "task": T,
            "args": 1,
            "kwargs": ["full"],
            "queue": "exports",
            "priority": 3,
            "expires": 600,
        }
        assert publisher.args == (1,)
        assert publisher.kwargs == {"full": True}

    def test_an_unknown_option_names_the_entry_and_registers_nothing(self):
        celery_app = app()
        celery_app.conf.beat_schedule = {
            "good": {"task": T, "schedule": 5},
            "bad": {"task": T, "schedule": 5, "options": {"countdown": 3}},
        }
        registry = cronjob.Registry()
        with pytest.raises(
            BeatScheduleError,
            match=r"^beat entry 'bad': task 'proj.tasks.t': unknown option "
            r"'countdown'",
        ):
            register_beat_schedule(celery_app, registry)
        assert not registry.jobs


#: ``cronjob beat``, as a process.
BEAT = "from cronjob.admin._cli import main; raise SystemExit(main())"


class TestTheCommand:
    @pytest.mark.parametrize("broker_url", [RABBITMQ_URL, REDIS_URL], ids=["rabbitmq", "redis"])
    def test_cronjob_beat_sends_each_instant_to_a_real_worker(self, broker_url, tmp_path):
        require_broker(broker_url)
        queue = new_queue()
        database = f"sqlite:///{tmp_path / 'beat.sqlite'}"
        env = {
            "CELERY_TEST_BROKER": broker_url,
            "CELERY_TEST_QUEUE": queue,
            "CELERY_TEST_BEAT": "every",
        }
        workers = start_worker(broker_url, queue, tmp_path)
        worker = next(workers)
        argv = [sys.executable, "-c", BEAT, "beat", "-A", "tests.celery_beat_app"]
        try:
            with watched([*argv, "--database-url", database], cwd=ROOT, env=env) as beat:
                assert beat.started.wait(60), beat.output
                got = worker.wait_for(3)
                beat.process.send_signal(signal.SIGTERM)
                assert beat.process.wait(30) == 0, beat.output
        finally:
            workers.close()
            delete_queue(broker_url, queue)
        for record in got:
            instant = datetime.fromisoformat(record["instant"])
            assert record["id"] == cronjob.occurrence_id("every-second", instant)
            assert record["name"] == "every-second"
            assert record["args"] == [7]
            assert record["kwargs"] == {"source": "beat"}
        instants = sorted(datetime.fromisoformat(r["instant"]) for r in got)
        assert len(set(instants)) == len(instants)  # one message per instant

    def test_a_solar_entry_stops_it_at_start_naming_the_entry(self, tmp_path):
        done = run_python(
            "-c",
            BEAT,
            "beat",
            "-A",
            "tests.celery_beat_app",
            "--database-url",
            f"sqlite:///{tmp_path / 'beat.sqlite'}",
            cwd=ROOT,
            env={"CELERY_TEST_BEAT": "solar"},
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            "cronjob: error: beat entry 'at-dusk': solar schedules have no cron spec "
            "(cronjob has no sunrise or sunset)"
        ]

    def test_an_app_that_cannot_be_loaded_is_one_line_and_status_2(self, tmp_path):
        done = run_python("-c", BEAT, "beat", "-A", "no_such_module_here", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(
            "cronjob: error: cannot load the Celery app 'no_such_module_here':"
        )
        assert len(done.stderr.splitlines()) == 1

    def test_a_module_without_the_named_app_says_the_attribute_is_missing(self, tmp_path):
        """Celery's loader would say "No module named 'proj:nosuch'", blaming the module."""
        (tmp_path / "proj.py").write_text("app = None\n")
        done = run_python("-c", BEAT, "beat", "-A", "proj:nosuch", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            "cronjob: error: cannot load the Celery app 'proj:nosuch': "
            "AttributeError: module 'proj' has no attribute 'nosuch'"
        ]

    def test_a_missing_module_named_with_its_app_is_the_module(self, tmp_path):
        done = run_python("-c", BEAT, "beat", "-A", "no_such_module_here:app", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            "cronjob: error: cannot load the Celery app 'no_such_module_here:app': "
            "ModuleNotFoundError: No module named 'no_such_module_here'"
        ]


class TestTheList:
    def test_list_prints_each_entry_as_a_job_and_exits(self, tmp_path):
        (tmp_path / "proj.py").write_text(
            "from datetime import timedelta\n"
            "from celery import Celery\n"
            "from celery.schedules import crontab\n"
            "app = Celery('proj', broker='memory://')\n"
            "app.conf.timezone = 'Europe/Paris'\n"
            "app.conf.beat_schedule = {\n"
            "    'nightly-export': {'task': 'proj.export', 'schedule': crontab(0, 3),\n"
            "                       'options': {'queue': 'exports'}},\n"
            "    'weekday-report': {'task': 'proj.report',\n"
            "                       'schedule': crontab(30, 8, day_of_week='mon-fri')},\n"
            "    'heartbeat': {'task': 'proj.ping', 'schedule': timedelta(seconds=30)},\n"
            "}\n"
        )
        done = run_python("-m", "cronjob", "beat", "-A", "proj", "--list", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "nightly-export\tCRON_TZ=Europe/Paris 0 0 3 * * *\tproj.export",
            "weekday-report\tCRON_TZ=Europe/Paris 0 30 8 * * 1-5\tproj.report",
            "heartbeat\t@every 30s\tproj.ping",
        ]


def test_without_celery_beat_says_how_to_install_it(tmp_path):
    """The bare install: the command exists, and tells which extra it needs."""
    code = (
        "import sys; sys.modules['celery'] = None;"  # as if Celery were not installed
        "from cronjob.admin._cli import main; raise SystemExit(main())"
    )
    done = run_python("-c", code, "beat", "-A", "proj", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("cronjob: error: cronjob beat needs Celery (")
    assert line.endswith("): pip install 'cronjob-lease[celery]'")
