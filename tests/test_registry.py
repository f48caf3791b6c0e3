"""Registration refuses every job it cannot honour, at import time, naming the job."""

from __future__ import annotations

import functools
import importlib
import re
import sys
from datetime import timedelta

import pytest

import cronjob
from cronjob import RegistrationError, Registry, ScheduleError


def job(ctx: cronjob.Round) -> None:
    pass


async def async_job(ctx: cronjob.Round) -> None:
    pass


def no_args() -> None:
    pass


def two_args(ctx: cronjob.Round, extra: int) -> None:
    pass


class AsyncCallable:
    async def __call__(self, ctx: cronjob.Round) -> None:
        pass

    async def method(self, ctx: cronjob.Round) -> None:
        pass


class SyncCallable:
    def __call__(self, ctx: cronjob.Round) -> None:
        pass


class TestRegister:
    def test_it_returns_the_function_unchanged(self):
        registry = Registry()
        assert registry.register(job, "0 * * * * *", "tick") is job
        assert registry.register_per_instance(async_job, "@hourly", "tock") is async_job

    def test_it_keeps_jobs_in_registration_order_with_their_kind(self):
        registry = Registry()
        registry.register(job, "0 * * * * *", "tick")
        registry.register_per_instance(async_job, "@hourly", "tock")
        assert [(j.name, j.leased, j.is_async) for j in registry.jobs] == [
            ("tick", True, False),
            ("tock", False, True),
        ]
        assert registry.jobs[0].schedule == cronjob.parse("0 * * * * *")

    @pytest.mark.parametrize(
        ("fn", "is_async"),
        [
            (job, False),
            (async_job, True),
            (functools.partial(async_job), True),
            (functools.partial(functools.partial(async_job)), True),
            (AsyncCallable(), True),
            (functools.partial(AsyncCallable()), True),
            (AsyncCallable().method, True),
            (SyncCallable(), False),
            (functools.partial(SyncCallable()), False),
        ],
        ids=[
            "function",
            "async-function",
            "partial",
            "partial-of-partial",
            "async-call",
            "partial-of-async-call",
            "async-method",
            "sync-call",
            "partial-of-sync-call",
        ],
    )
    def test_it_tells_an_async_job_however_it_is_wrapped(self, fn, is_async):
        registry = Registry()
        registry.register(fn, "@hourly", "job")
        assert registry.jobs[0].is_async is is_async

    def test_the_module_level_functions_use_the_default_registry(self):
        from cronjob._registry import default_registry

        before = len(default_registry)
        name = "test-registry-default"
        cronjob.register(job, "@daily", name)
        assert len(default_registry) == before + 1
        assert default_registry.jobs[-1].name == name
        default_registry._jobs.pop(name)


class TestRefusals:
    @pytest.mark.parametrize("name", ["", "   "])
    def test_it_refuses_a_job_without_a_name(self, name):
        with pytest.raises(RegistrationError, match=r"^a job needs a name: got an empty one$"):
            Registry().register(job, "@hourly", name)

    @pytest.mark.parametrize("name", [" report", "report ", "report\n"])
    def test_it_refuses_a_name_with_whitespace_at_either_end(self, name):
        with pytest.raises(RegistrationError, match=r"starts or ends with whitespace$"):
            Registry().register_per_instance(job, "@hourly", name)

    def test_it_refuses_a_name_that_is_not_a_string(self):
        with pytest.raises(RegistrationError, match=r"^a job name must be a string, got 42$"):
            Registry().register(job, "@hourly", 42)  # type: ignore[arg-type]

    def test_it_refuses_a_name_too_long_for_the_lease_table(self):
        with pytest.raises(RegistrationError, match=r"is 201 characters long; the limit is 200$"):
            Registry().register(job, "@hourly", "x" * 201)

    def test_it_refuses_a_name_with_a_nul_character(self):
        """PostgreSQL cannot store NUL in text: the one statement carrying every name fails."""
        message = (
            r"job name 'nightly\x00report' contains a NUL character at index 7, "
            r"which PostgreSQL cannot store"
        )
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            Registry().register(job, "@hourly", "nightly\x00report")

    @pytest.mark.parametrize("register", ["register", "register_per_instance"])
    def test_it_refuses_a_name_with_a_lone_surrogate(self, register):
        """os.listdir yields these for undecodable bytes; UTF-8 cannot encode them."""
        message = (
            r"job name 'clean-\udc80' contains the lone surrogate '\udc80' at index 6, "
            r"which is not valid Unicode and no database can store"
        )
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            getattr(Registry(), register)(job, "@hourly", "clean-\udc80")

    @pytest.mark.parametrize(
        "name",
        ["r\u00e9sum\u00e9", "clock-\u23f0-\U0001f980", "a\x01\x7fb", "\U0010ffff", "x" * 200],
    )
    def test_it_accepts_any_other_text_every_database_round_trips(self, name):
        """tests/test_lease.py stores these very names on all three databases."""
        registry = Registry()
        registry.register(job, "@hourly", name)
        assert [j.name for j in registry.jobs] == [name]

    def test_it_refuses_a_name_already_taken_naming_who_took_it(self):
        registry = Registry()
        registry.register(job, "@hourly", "report")
        with pytest.raises(
            RegistrationError,
            match="^" + re.escape(f"job name 'report' is already taken by {__name__}.job") + "$",
        ):
            registry.register_per_instance(async_job, "@daily", "report")
        assert len(registry) == 1

    def test_a_module_imported_under_two_names_is_named_in_the_refusal(self, tmp_path, monkeypatch):
        """`app.jobs` and `jobs` are one file run twice: the second registers everything again."""
        (tmp_path / "app").mkdir()
        (tmp_path / "app" / "__init__.py").write_text("")
        (tmp_path / "holder.py").write_text("import cronjob\nregistry = cronjob.Registry()\n")
        jobs = tmp_path / "app" / "jobs.py"
        jobs.write_text(
            "from holder import registry\n"
            "def digest(ctx):\n    pass\n"
            "registry.register(digest, '@daily', 'digest')\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.syspath_prepend(str(tmp_path / "app"))
        for module in ("holder", "app", "app.jobs", "jobs"):
            monkeypatch.delitem(sys.modules, module, raising=False)
        importlib.import_module("app.jobs")
        message = (
            f"job name 'digest' is already taken by app.jobs.digest: {jobs} was imported twice, "
            "as app.jobs and as jobs; import it under one name"
        )
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            importlib.import_module("jobs")
        for module in ("holder", "app", "app.jobs", "jobs"):
            sys.modules.pop(module, None)

    def test_it_refuses_something_not_callable(self):
        with pytest.raises(RegistrationError, match=r"^job 'x': 'nope' is not callable$"):
            Registry().register("nope", "@hourly", "x")  # type: ignore[arg-type]

    def test_a_function_without_a_parameter_is_refused_for_too_few_arguments(self):
        message = (
            f"job 'x': {__name__}.no_args takes no arguments: too few; a job must "
            "accept the round as its one positional argument, e.g. def job(ctx): ..."
        )
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            Registry().register(no_args, "@hourly", "x")

    def test_a_function_needing_more_is_refused_for_too_many_arguments(self):
        message = (
            f"job 'x': {__name__}.two_args requires 2 arguments (ctx, extra): too "
            "many; a job must accept the round as its one positional argument, e.g. "
            "def job(ctx): ..."
        )
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            Registry().register(two_args, "@hourly", "x")

    def test_a_required_keyword_only_argument_is_too_many(self):
        def keyword(ctx, *, extra):
            pass

        with pytest.raises(RegistrationError, match=r"requires 2 arguments \(ctx, extra\)"):
            Registry().register(keyword, "@hourly", "x")

    @pytest.mark.parametrize(
        "fn",
        [
            lambda ctx, extra=1: None,
            lambda *args: None,
            lambda ctx, **kwargs: None,
            functools.partial(lambda a, ctx: None, 1),
        ],
    )
    def test_extra_parameters_with_defaults_are_accepted(self, fn):
        Registry().register(fn, "@hourly", "x")

    @pytest.mark.parametrize(
        ("spec", "name"),
        [
            pytest.param("0 * * * *", "report", id="a-bad-spec-names-the-job"),
            pytest.param("0 0 0 30 2 *", "feb30", id="a-spec-that-never-fires-is-refused"),
            pytest.param("CRON_TZ=Local 0 0 9 * * *", "x", id="a-local-zone-is-refused"),
            pytest.param(None, "x", id="a-spec-that-is-not-a-string-is-a-schedule-error"),
        ],
    )
    def test_a_spec_refused_is_a_schedule_error_naming_the_job(self, spec, name):
        with pytest.raises(ScheduleError, match=rf"^job '{name}': "):
            Registry().register(job, spec, name)

    def test_errors_are_value_errors(self):
        assert issubclass(RegistrationError, ValueError)
        assert issubclass(ScheduleError, ValueError)

    def test_registering_after_the_scheduler_started_raises(self):
        registry = Registry()
        registry.register(job, "@hourly", "a")
        registry._freeze(by="'replica-1'")
        with pytest.raises(RuntimeError, match=r"^cannot register job 'b': the scheduler "):
            registry.register(job, "@hourly", "b")
        assert [j.name for j in registry.jobs] == ["a"]


class TestRunAtStart:
    def test_a_per_instance_job_keeps_the_flag_on_its_frozen_spec(self):
        registry = Registry()
        registry.register_per_instance(job, "@every 1h", "warm", run_at_start=True)
        registry.register_per_instance(job, "@every 1h", "plain")
        assert [(j.name, j.run_at_start) for j in registry.jobs] == [
            ("warm", True),
            ("plain", False),
        ]

    def test_a_leased_job_is_refused_run_at_start(self):
        message = (
            "job 'digest': run_at_start is for per-instance jobs (every replica runs it as "
            "it starts); a leased job catches up its latest missed instant at start instead"
        )
        registry = Registry()
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            registry.register(job, "@daily", "digest", run_at_start=True)
        assert len(registry) == 0
        registry.register(job, "@daily", "digest", run_at_start=False)
        assert registry.jobs[0].run_at_start is False

    def test_run_at_start_must_be_a_bool(self):
        with pytest.raises(
            RegistrationError, match=r"^job 'warm': run_at_start must be True or False, got 'yes'$"
        ):
            Registry().register_per_instance(job, "@hourly", "warm", run_at_start="yes")  # type: ignore[arg-type]

    def test_the_module_level_function_passes_it_on(self):
        from cronjob._registry import default_registry

        cronjob.register_per_instance(job, "@hourly", "test-run-at-start", run_at_start=True)
        try:
            assert default_registry.jobs[-1].run_at_start is True
        finally:
            default_registry._jobs.pop("test-run-at-start")


class TestDecorators:
    def test_job_registers_a_leased_job_and_returns_the_function_unchanged(self):
        registry = Registry()

        @registry.job("0 0 9 * * *", name="digest")
        def digest(ctx: cronjob.Round) -> None:
            pass

        assert digest.__name__ == "digest" and callable(digest)
        (registered,) = registry.jobs
        assert registered.fn is digest
        assert (registered.name, registered.leased, registered.run_at_start) == (
            "digest",
            True,
            False,
        )
        assert registered.schedule == cronjob.parse("0 0 9 * * *")

    def test_job_per_instance_registers_a_per_instance_job(self):
        registry = Registry()

        @registry.job_per_instance("@every 1h", name="clear-tmp", run_at_start=True)
        async def clear_tmp(ctx: cronjob.Round) -> None:
            pass

        (registered,) = registry.jobs
        assert registered.fn is clear_tmp
        assert (registered.leased, registered.is_async, registered.run_at_start) == (
            False,
            True,
            True,
        )

    def test_the_name_is_required(self):
        registry = Registry()
        with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'name'"):
            registry.job("@hourly")  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"takes 2 positional arguments but 3 were given"):
            registry.job("@hourly", "digest")  # type: ignore[misc]

    def test_a_bad_job_fails_where_it_is_defined(self):
        registry = Registry()
        with pytest.raises(ScheduleError, match=r"^job 'digest': '0 9 \* \* \*' has 5 fields"):

            @registry.job("0 9 * * *", name="digest")
            def digest(ctx: cronjob.Round) -> None:
                pass

        with pytest.raises(RegistrationError, match=r"^job 'x': .* takes no arguments: too few"):

            @registry.job_per_instance("@hourly", name="x")
            def no_round() -> None:
                pass

        assert len(registry) == 0

    def test_the_module_level_decorators_use_the_default_registry(self):
        from cronjob._registry import default_registry

        @cronjob.job("@daily", name="test-decorator-leased")
        def leased(ctx: cronjob.Round) -> None:
            pass

        @cronjob.job_per_instance("@daily", name="test-decorator-local", run_at_start=True)
        def local(ctx: cronjob.Round) -> None:
            pass

        try:
            by_name = {j.name: j for j in default_registry.jobs}
            assert by_name["test-decorator-leased"].fn is leased
            assert by_name["test-decorator-leased"].leased
            assert by_name["test-decorator-local"].fn is local
            assert by_name["test-decorator-local"].run_at_start
        finally:
            default_registry._jobs.pop("test-decorator-leased")
            default_registry._jobs.pop("test-decorator-local")


class TestPolicyOptions:
    """Each policy option refused at registration when it cannot be honoured, naming the
    job, with the exact message; accepted values become the job's ``policy``."""

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"timeout": 0}, "job 'p': timeout must be positive, got 0"),
            ({"timeout": -1.5}, "job 'p': timeout must be positive, got -1.5"),
            ({"timeout": float("nan")}, "job 'p': timeout must be positive, got nan"),
            ({"timeout": float("inf")}, "job 'p': timeout must be positive, got inf"),
            (
                {"timeout": timedelta(0)},
                "job 'p': timeout must be positive, got datetime.timedelta(0)",
            ),
            (
                {"timeout": "10"},
                "job 'p': timeout must be seconds (a number) or a timedelta, got '10'",
            ),
            (
                {"timeout": True},
                "job 'p': timeout must be seconds (a number) or a timedelta, got True",
            ),
            ({"start_deadline": -1}, "job 'p': start_deadline must be positive, got -1"),
            ({"retry_backoff": 0}, "job 'p': retry_backoff must be positive, got 0"),
            ({"retries": -1}, "job 'p': retries must be at least 0, got -1"),
            ({"retries": 1.0}, "job 'p': retries must be a whole number, got 1.0"),
            ({"retries": False}, "job 'p': retries must be a whole number, got False"),
            (
                {"pause_after_failures": 0},
                "job 'p': pause_after_failures must be at least 1, got 0",
            ),
            ({"on_failure": 3}, "job 'p': on_failure must be callable, got 3"),
            (
                {"timout": 3},
                "job 'p': unknown option(s) timout; a job's options are timeout, retries, "
                "retry_backoff, start_deadline, pause_after_failures, on_failure, isolation, "
                "overlap, catch_up, catch_up_window, on_success, heartbeat, jitter",
            ),
        ],
    )
    def test_a_bad_value_is_refused_naming_the_job(self, options, message):
        registry = Registry()
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            registry.register(job, "0 * * * * *", "p", **options)
        assert registry.jobs == ()

    def test_pause_after_failures_is_refused_for_a_per_instance_job(self):
        message = (
            "job 'p': pause_after_failures is for leased jobs; a per-instance job has no "
            "state shared by the replicas to pause"
        )
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            Registry().register_per_instance(job, "0 * * * * *", "p", pause_after_failures=3)

    def test_a_registry_hook_that_is_not_callable_is_refused(self):
        message = "Registry(on_failure=...) must be callable, got 'log'"
        with pytest.raises(RegistrationError, match="^" + re.escape(message) + "$"):
            Registry(on_failure="log")  # type: ignore[arg-type]

    def test_the_decorators_refuse_as_register_does(self):
        with pytest.raises(RegistrationError, match=r"^job 'd': retries must be at least 0"):
            Registry().job("0 * * * * *", name="d", retries=-2)(job)
        with pytest.raises(RegistrationError, match=r"^job 'd': timeout must be positive"):
            Registry().job_per_instance("0 * * * * *", name="d", timeout=0)(job)

    def test_accepted_values_make_the_policy_in_a_timedelta(self):
        registry = Registry()
        registry.register(
            job, "0 * * * * *", "p", timeout=1.5, retries=2, start_deadline=timedelta(minutes=1)
        )
        [registered] = registry.jobs
        policy = registered.policy
        assert policy.timeout == timedelta(seconds=1.5)
        assert policy.retries == 2 and policy.retry_backoff == timedelta(seconds=10)
        assert policy.start_deadline == timedelta(minutes=1)
        assert not policy.is_default

    def test_a_job_without_options_keeps_the_default_policy(self):
        registry = Registry()
        registry.register(job, "0 * * * * *", "p")
        [registered] = registry.jobs
        assert registered.policy.is_default and registered.policy == cronjob.Policy()

    def test_jobs_without_options_share_one_policy_and_jobs_with_options_have_their_own(self):
        """The default policy is immutable: the jobs without options share it (a replica
        of 100,000 jobs kept 100,000 equal ones); options, even one, make a policy."""
        registry = Registry()
        registry.register(job, "0 * * * * *", "a")
        registry.register_per_instance(job, "0 * * * * *", "b")
        registry.register(job, "0 * * * * *", "c", retries=1)
        registry.register(job, "0 * * * * *", "d", retry_backoff=10)
        a, b, c, d = registry.jobs
        assert a.policy is b.policy
        assert c.policy is not a.policy and c.policy.retries == 1
        assert d.policy is not a.policy and d.policy == a.policy


class _Unsent:
    """A publisher that is never asked to send: registration alone is under test."""

    target = "test"

    def describe(self) -> dict[str, str]:
        return {}

    def publish(self, occurrence: object) -> None:
        raise AssertionError("registration must not publish")


class TestAHandoffIsLeasedOnly:
    def test_per_instance_is_refused_naming_the_job(self):
        from cronjob.contrib import handoff

        registry = Registry()
        with pytest.raises(RegistrationError, match=r"job 'export'.*not per instance"):
            registry.register_per_instance(handoff(_Unsent()), "0 0 3 * * *", "export")
        assert registry.jobs == ()

    def test_leased_is_taken(self):
        from cronjob.contrib import handoff

        registry = Registry()
        registry.register(handoff(_Unsent()), "0 0 3 * * *", "export")
        [job] = registry.jobs
        assert (job.name, job.leased) == ("export", True)
