"""A hand-off cannot run in a child process: its function is an object holding its
publisher, its sender thread and the sends it gave up on, which a child can neither
import by name nor share. ``isolation="process"`` on one is refused at registration,
naming the job, wherever a job's policies come from."""

from __future__ import annotations

import pytest

import cronjob
import cronjob.schedules
from cronjob.contrib import handoff
from tests.test_outbox import _Recorder as Recorder

MINUTE = "0 * * * * *"


def refusal(name: str) -> str:
    return (
        rf"^job '{name}': isolation='process' runs each round in a child process; "
        r"<Handoff test \{\}> hands its instants to a task queue from this replica \(its "
        r"publisher, its sends in flight\) and cannot run there: leave isolation to the "
        r"workers that run the task$"
    )


class TestIsolatedHandoffRefused:
    def test_a_registered_job_is_refused(self):
        registry = cronjob.Registry()
        with pytest.raises(cronjob.RegistrationError, match=refusal("export")):
            registry.register(handoff(Recorder()), MINUTE, "export", isolation="process")
        assert registry.jobs == ()

    def test_the_decorator_form_is_refused(self):
        registry = cronjob.Registry()
        with pytest.raises(cronjob.RegistrationError, match=refusal("export")):
            registry.job(MINUTE, name="export", isolation="process")(handoff(Recorder()))

    def test_a_task_is_refused_so_none_of_its_schedules_runs_isolated(self):
        """A schedule's own policies never set isolation: it is its task's alone."""
        registry = cronjob.Registry()
        with pytest.raises(cronjob.RegistrationError, match=refusal("tenant-export")):
            registry.register_task(handoff(Recorder()), "tenant-export", isolation="process")
        assert registry.tasks == ()

    def test_a_schedule_cannot_ask_for_isolation_itself(self):
        registry = cronjob.Registry()
        registry.register_task(handoff(Recorder()), "tenant-export")
        with pytest.raises(TypeError, match="isolation"):
            cronjob.schedules.add(  # type: ignore[call-arg]
                "sqlite://",
                "t1",
                task="tenant-export",
                spec=MINUTE,
                registry=registry,
                isolation="process",
            )

    def test_a_derived_registry_s_replacement_is_refused(self):
        registry = cronjob.Registry()
        registry.register(_top_level, MINUTE, "export", isolation="process")
        with pytest.raises(cronjob.RegistrationError, match=refusal("export")):
            registry.derive(replace={"export": handoff(Recorder())})

    def test_in_a_thread_it_is_accepted(self):
        registry = cronjob.Registry()
        registry.register(handoff(Recorder()), MINUTE, "export", isolation="thread")
        assert [job.name for job in registry.jobs] == ["export"]


def _top_level(ctx: cronjob.Round) -> None:
    """A job a child process can import."""


def test_a_beat_entry_cannot_ask_for_isolation():
    """``cronjob beat`` registers each entry's hand-off with the default policies; an
    entry that asks for isolation through its options is refused, naming it."""
    celery = pytest.importorskip("celery")
    from cronjob.contrib.celery import register_beat_schedule
    from cronjob.contrib.celery._beat import BeatScheduleError

    app = celery.Celery("beat-isolation", broker="memory://")
    app.conf.beat_schedule = {
        "nightly": {"task": "t", "schedule": 60.0, "options": {"isolation": "process"}}
    }
    registry = cronjob.Registry()
    with pytest.raises(BeatScheduleError, match=r"^beat entry 'nightly': .*isolation"):
        register_beat_schedule(app, registry)
    assert registry.jobs == ()
