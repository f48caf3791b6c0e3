"""The public surface of cronjob: what it exports, under its public module name.

execctx and lease pin their own surfaces in their test modules.
"""

from __future__ import annotations

import importlib

import pytest

SURFACE = {
    "cronjob": [
        "Cancelled",
        "Clock",
        "CronjobError",
        "History",
        "Job",
        "LeaseLost",
        "Outcome",
        "Policy",
        "RegistrationError",
        "Retry",
        "Round",
        "Schedule",
        "ScheduleError",
        "Scheduler",
        "Shutdown",
        "Superseded",
        "SystemClock",
        "Task",
        "TimedOut",
        "Trigger",
        "default_registry",
        "job",
        "job_per_instance",
        "lifespan",
        "occurrence_id",
        "parse",
        "register",
        "register_per_instance",
        "register_task",
        "schedules",
        "task",
    ],
    "cronjob.schedules": [
        "MAX_ARGS_BYTES",
        "Database",
        "IfExists",
        "New",
        "ScheduleRecord",
        "add",
        "add_async",
        "add_many",
        "add_many_async",
        "check",
        "get",
        "get_async",
        "list",
        "list_async",
        "remove",
        "remove_async",
        "update",
        "update_async",
    ],
    "cronjob.testing": ["FakeClock", "RanRound", "crash", "make_round", "record_rounds"],
    "cronjob.contrib.django": ["database_url", "fenced"],
    "cronjob.contrib.django.schedules": [
        "New",
        "ScheduleRecord",
        "add",
        "add_many",
        "check",
        "get",
        "list",
        "pause",
        "remove",
        "resume",
        "update",
    ],
    "cronjob.contrib.flask": ["Cronjob", "command"],
    "cronjob.contrib": [
        "Handoff",
        "InvalidOccurrence",
        "NotPublished",
        "Occurrence",
        "OccurrenceBusy",
        "Publisher",
        "format_instant",
        "handoff",
        "parse_instant",
        "run_once",
    ],
    "cronjob.contrib.rq": [
        "JOB_OPTIONS",
        "META_KEY",
        "RQPublisher",
        "enqueue",
        "once",
        "trace_context",
    ],
    "cronjob.contrib.celery": [
        "BeatScheduleError",
        "CeleryPublisher",
        "OptionError",
        "once",
        "register_beat_schedule",
        "send",
    ],
    "cronjob.contrib.dramatiq": [
        "INSTANT_OPTION",
        "NAME_OPTION",
        "TRACE_OPTION",
        "DramatiqPublisher",
        "once",
        "send",
    ],
    "cronjob.admin": [
        "Acknowledgement",
        "Activity",
        "Backfill",
        "BackfillCancelled",
        "BackfillTooLarge",
        "FAILED_OUTCOMES",
        "ForgetRefused",
        "Forgotten",
        "JobStatus",
        "OutboxStatus",
        "Outcome",
        "PauseChange",
        "Refusal",
        "ReplicaStatus",
        "RequestState",
        "RequestStatus",
        "RoundRecord",
        "SchemaNewer",
        "SchemaOutdated",
        "Status",
        "StatusError",
        "TablesMissing",
        "TriggerRefused",
        "TriggerRequest",
        "UNSENT_AFTER",
        "UnknownJob",
        "Why",
        "acknowledge",
        "backfill",
        "cancel_backfill",
        "forget",
        "history",
        "pause",
        "pause_all",
        "requests",
        "resume",
        "resume_all",
        "status",
        "trigger",
        "wait",
    ],
    "cronjob.web": ["asgi_app", "serve", "wsgi_app"],
}


@pytest.mark.parametrize("package", sorted(SURFACE))
def test_the_package_exports_exactly_its_surface(package):
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(SURFACE[package])
    for name in module.__all__:
        assert hasattr(module, name), name


@pytest.mark.parametrize("name", [n for n in SURFACE["cronjob"] if n != "schedules"])
def test_public_objects_name_the_public_module(name):
    import cronjob

    obj = getattr(cronjob, name)
    assert obj.__module__ == "cronjob"


def test_schedules_is_the_public_module():
    import cronjob

    assert cronjob.schedules.__name__ == "cronjob.schedules"
    assert cronjob.schedules.ScheduleRecord.__module__ == "cronjob.schedules"


def test_importing_cronjob_starts_no_thread():
    import subprocess
    import sys

    code = "import threading, cronjob, cronjob.testing;print(len(threading.enumerate()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_the_base_install_brings_no_framework():
    from importlib.metadata import requires

    base = [r for r in requires("cronjob-lease") or [] if "extra ==" not in r]
    assert base, "the distribution's requirements are not installed"
    for framework in ("django", "flask", "fastapi", "starlette", "dramatiq"):
        assert not [r for r in base if r.lower().startswith(framework)], base
    extras = set(requires("cronjob-lease") or [])
    assert {
        "django>=4.2; extra == 'django'",
        "flask>=2.3; extra == 'flask'",
        "dramatiq>=1.17; extra == 'dramatiq'",
    } <= extras


def test_importing_cronjob_imports_no_framework():
    import subprocess
    import sys

    code = (
        "import sys, cronjob, cronjob.testing, cronjob.contrib, cronjob.admin._cli;"
        "frameworks = ('django', 'flask', 'fastapi', 'starlette', 'celery', 'kombu', 'rq',"
        " 'redis', 'dramatiq', 'pika');"
        "print(sorted(m for m in frameworks if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
