"""Job policies told of rounds' ends on the hooks thread: ``on_success`` and
``heartbeat=URL``.

Replicas on one fake clock and one database (each of the three in turn). The heartbeat
is pinged over real HTTP: each test starts a local server (``http.server`` in a thread)
that notes every request; the pings are network I/O on the hooks thread, in real time,
so the tests wait for them with a bounded poll, never a fixed sleep.
"""

from __future__ import annotations

import http.server
import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest

import cronjob
import lease
from cronjob import Registry, admin, schedules, web
from cronjob.admin import Why
from cronjob.engine import _failures, _heartbeat
from cronjob.engine._failures import Hooks
from cronjob.engine._heartbeat import ping, ping_url
from cronjob.testing import FakeClock
from tests._endpoint import WAIT
from tests._helpers import wsgi_call

#: A Monday, on the hour (the ``clock`` fixture's start).
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
EVERY_MINUTE = "0 * * * * *"


def at(minutes: int = 0, seconds: float = 0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


class Hooked:
    """A hook that keeps the records it is given and the thread it ran on."""

    def __init__(self, raises: bool = False) -> None:
        self.records: list[admin.RoundRecord] = []
        self.threads: list[str] = []
        self.raises = raises
        self.called = threading.Semaphore(0)

    def __call__(self, record: admin.RoundRecord) -> None:
        self.records.append(record)
        self.threads.append(threading.current_thread().name)
        self.called.release()
        if self.raises:
            raise RuntimeError("the dashboard is down")

    def wait(self, count: int) -> None:
        for _ in range(count):
            assert self.called.acquire(timeout=WAIT), f"only {len(self.records)} hook calls"


def fine(ctx: cronjob.Round) -> None:
    """A job that does nothing, well."""


def boom(ctx: cronjob.Round) -> None:
    raise ValueError("boom")


class TestOnSuccess:
    def test_it_is_called_once_per_succeeded_round_with_its_record_on_the_hooks_thread(
        self, db_url, replicas, clock
    ):
        succeeded, failed = Hooked(), Hooked()
        calls: list[int] = []

        def every_other(ctx: cronjob.Round) -> None:
            calls.append(1)
            if len(calls) == 2:
                raise ValueError("boom")

        registry = Registry()
        registry.register(
            every_other, EVERY_MINUTE, "sync", on_success=succeeded, on_failure=failed
        )
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(3 * 60 + 5)  # 09:01 succeeds, 09:02 fails, 09:03 succeeds
        succeeded.wait(2)
        failed.wait(1)
        assert [(r.job, r.instant, r.outcome) for r in succeeded.records] == [
            ("sync", at(1), admin.Outcome.SUCCEEDED),
            ("sync", at(3), admin.Outcome.SUCCEEDED),
        ]
        assert [r.instant for r in failed.records] == [at(2)]
        first = succeeded.records[0]
        assert (first.attempt, first.why, first.error) == (1, Why.SCHEDULE, None)
        # The record is the history's, from the replica that ran the round.
        assert first == next(r for r in admin.history(db_url, "sync") if r.instant == at(1))
        assert set(succeeded.threads) == {"cronjob-hooks"}
        assert len(calls) == 3  # each instant ran once across the two replicas

    def test_a_success_hook_that_raises_is_logged_and_the_scheduler_goes_on(
        self, db_url, replicas, clock, caplog
    ):
        caplog.set_level(logging.ERROR, logger="cronjob")
        hook = Hooked(raises=True)
        registry = Registry()
        registry.register(fine, EVERY_MINUTE, "sync", on_success=hook)
        replicas(registry, "a")
        clock.advance(60 + 5)
        hook.wait(1)
        clock.advance(60)
        hook.wait(1)
        assert [r.instant for r in hook.records] == [at(1), at(2)]
        logged = [r for r in caplog.records if "success hook" in r.getMessage()]
        assert logged
        assert logged[0].getMessage().startswith("job 'sync': its success hook ")
        assert logged[0].exc_info is not None
        assert "the dashboard is down" in str(logged[0].exc_info[1])

    def test_a_per_instance_job_calls_its_success_hook_on_each_replica(
        self, db_url, replicas, clock
    ):
        hook = Hooked()
        registry = Registry()
        registry.register_per_instance(fine, EVERY_MINUTE, "local", on_success=hook)
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(60 + 5)
        hook.wait(2)
        assert sorted((r.instant, r.replica) for r in hook.records) == [
            (at(1), "a"),
            (at(1), "b"),
        ]

    def test_a_retried_round_that_succeeds_calls_it_once(self, db_url, replicas, clock):
        hook = Hooked()
        attempts: list[int] = []

        def flaky(ctx: cronjob.Round) -> None:
            attempts.append(ctx.attempt)
            if ctx.attempt == 1:
                raise ValueError("once")

        registry = Registry()
        registry.register(flaky, EVERY_MINUTE, "flaky", retries=1, retry_backoff=1, on_success=hook)
        replicas(registry, "a")
        clock.advance(60 + 5)
        hook.wait(1)
        assert attempts == [1, 2]
        [record] = hook.records
        assert (record.instant, record.attempt, record.outcome) == (
            at(1),
            2,
            admin.Outcome.SUCCEEDED,
        )

    def test_it_must_be_callable(self):
        with pytest.raises(
            cronjob.RegistrationError,
            match=r"^job 'sync': on_success must be callable, got 'print'$",
        ):
            Registry().register(fine, EVERY_MINUTE, "sync", on_success="print")  # type: ignore[arg-type]


class TestHeartbeatRegistration:
    @pytest.mark.parametrize(
        "url",
        ["hc-ping.com/abc", "ftp://hc-ping.com/abc", "https:///abc", "mailto:ops@example.com"],
    )
    def test_it_must_be_an_http_or_https_url_with_a_host(self, url):
        with pytest.raises(
            cronjob.RegistrationError,
            match=rf"^job 'sync': heartbeat must be an http or https URL with a host, "
            rf"got '{url}'$",
        ):
            Registry().register(fine, EVERY_MINUTE, "sync", heartbeat=url)

    def test_it_must_be_a_string(self):
        with pytest.raises(
            cronjob.RegistrationError, match=r"^job 'sync': heartbeat must be a URL \(a str\)"
        ):
            Registry().register(fine, EVERY_MINUTE, "sync", heartbeat=42)  # type: ignore[arg-type]

    def test_a_malformed_url_is_refused_naming_the_job(self):
        with pytest.raises(cronjob.RegistrationError, match=r"^job 'sync': heartbeat "):
            Registry().register(fine, EVERY_MINUTE, "sync", heartbeat="https://[::1/abc")

    def test_a_task_takes_it_for_all_its_schedules(self):
        registry = Registry()
        registry.register_task(fine, "report", heartbeat="https://hc-ping.com/k", jitter=5)
        [task] = registry.tasks
        assert task.policy.heartbeat == "https://hc-ping.com/k"
        assert task.policy.jitter == timedelta(seconds=5)

    def test_it_is_shown_by_its_host_only(self):
        registry = Registry()
        registry.register(
            fine,
            EVERY_MINUTE,
            "sync",
            heartbeat="https://hc-ping.com/secret-uuid",
            on_success=print,
        )
        [job] = registry.jobs
        assert job.policy.describe() == {
            "on_success": "builtins.print",
            "heartbeat": "hc-ping.com",
        }
        assert cronjob._policy.policy_text(job.policy.describe()) == (
            "on success builtins.print, heartbeat to hc-ping.com"
        )


class TestPingUrl:
    def test_healthchecks_style_start_success_and_fail(self):
        url = "https://hc-ping.com/5f4c1e2a"
        assert ping_url(url, "start") == "https://hc-ping.com/5f4c1e2a/start"
        assert ping_url(url, "success") == url
        assert ping_url(url, "fail") == "https://hc-ping.com/5f4c1e2a/fail"

    def test_a_query_string_stays_after_the_path(self):
        url = "https://hc-ping.com/key/backup?create=1"
        assert ping_url(url, "start") == "https://hc-ping.com/key/backup/start?create=1"
        assert ping_url(url, "fail") == "https://hc-ping.com/key/backup/fail?create=1"

    def test_a_trailing_slash_is_not_doubled(self):
        assert ping_url("https://hc-ping.com/key/", "fail") == "https://hc-ping.com/key/fail"

    def test_sentry_crons_check_in_url_gets_its_status(self):
        url = "https://o1.ingest.sentry.io/api/2/cron/nightly/abc123/?status=ok&environment=prod"
        base = "https://o1.ingest.sentry.io/api/2/cron/nightly/abc123/"
        assert ping_url(url, "start") == f"{base}?status=in_progress&environment=prod"
        assert ping_url(url, "success") == f"{base}?status=ok&environment=prod"
        assert ping_url(url, "fail") == f"{base}?status=error&environment=prod"


class TestHeartbeat:
    def test_a_round_that_succeeds_pings_start_then_the_url(
        self, db_url, replicas, clock, endpoint
    ):
        registry = Registry()
        registry.register(fine, EVERY_MINUTE, "sync", heartbeat=f"{endpoint.base}/ping/k1")
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(60 + 5)
        assert endpoint.wait_for(2) == ["/ping/k1/start", "/ping/k1"]
        clock.advance(60)
        assert endpoint.wait_for(4)[2:] == ["/ping/k1/start", "/ping/k1"]

    def test_a_round_that_fails_or_times_out_pings_fail(self, db_url, replicas, clock, endpoint):
        def slow(ctx: cronjob.Round) -> None:
            if ctx.wait(30):
                ctx.check()

        registry = Registry()
        registry.register(boom, EVERY_MINUTE, "boom", heartbeat=f"{endpoint.base}/boom")
        registry.register(
            slow, "30 * * * * *", "slow", heartbeat=f"{endpoint.base}/slow", timeout=5
        )
        replicas(registry, "a")
        clock.advance(60 + 5)  # 09:00:30 slow times out at :35; 09:01 boom fails
        requests = endpoint.wait_for(4)
        assert [r for r in requests if r.startswith("/slow")] == ["/slow/start", "/slow/fail"]
        assert [r for r in requests if r.startswith("/boom")] == ["/boom/start", "/boom/fail"]
        outcomes = {r.instant: r.outcome for r in admin.history(db_url, "slow")}
        assert outcomes == {at(0, 30): admin.Outcome.TIMED_OUT}

    def test_a_missed_start_deadline_pings_fail_without_a_start(
        self, db_url, replicas, clock, endpoint
    ):
        registry = Registry()
        registry.register(
            fine, EVERY_MINUTE, "late", heartbeat=f"{endpoint.base}/late", start_deadline=1
        )
        # The first replica runs 09:01, then stops; the next starts at 09:02:30 and is
        # owed 09:02 (catch-up), 30 s past its deadline of 1 s.
        first = replicas(registry, "a")
        clock.advance(60 + 5)
        assert endpoint.wait_for(2) == ["/late/start", "/late"]
        first.stop()
        clock.advance(85)
        replicas(registry, "b")
        clock.advance(1)
        assert endpoint.wait_for(3)[2:] == ["/late/fail"]
        outcomes = {r.instant: r.outcome for r in admin.history(db_url, "late")}
        assert outcomes[at(2)] == admin.Outcome.MISSED_DEADLINE

    def test_a_retried_round_pings_start_once_and_its_final_end(
        self, db_url, replicas, clock, endpoint
    ):
        def flaky(ctx: cronjob.Round) -> None:
            if ctx.attempt == 1:
                raise ValueError("once")

        registry = Registry()
        registry.register(
            flaky, EVERY_MINUTE, "flaky", retries=1, retry_backoff=1, heartbeat=endpoint.base
        )
        replicas(registry, "a")
        clock.advance(60 + 5)
        assert endpoint.wait_for(2) == ["/start", "/"]
        assert [(r.attempt, r.outcome) for r in reversed(admin.history(db_url, "flaky"))] == [
            (1, admin.Outcome.RETRYING),
            (2, admin.Outcome.SUCCEEDED),
        ]
        assert len(endpoint.requests) == 2

    def test_sentry_crons_gets_in_progress_then_ok(self, db_url, replicas, clock, endpoint):
        url = f"{endpoint.base}/api/0/cron/nightly/key/?status=in_progress"
        registry = Registry()
        registry.register(fine, EVERY_MINUTE, "nightly", heartbeat=url)
        replicas(registry, "a")
        clock.advance(60 + 5)
        assert endpoint.wait_for(2) == [
            "/api/0/cron/nightly/key/?status=in_progress",
            "/api/0/cron/nightly/key/?status=ok",
        ]

    def test_a_hanging_endpoint_delays_neither_the_record_nor_the_next_round(
        self, db_url, replicas, clock, endpoint, monkeypatch
    ):
        # Longer than the test takes (5 s in production): every ping hangs until released.
        monkeypatch.setattr(_heartbeat, "PING_TIMEOUT", 60.0)
        endpoint.hang = True
        started: list[datetime] = []

        def noted(ctx: cronjob.Round) -> None:
            started.append(clock.now())

        registry = Registry()
        registry.register(noted, EVERY_MINUTE, "sync", heartbeat=f"{endpoint.base}/k")
        replicas(registry, "a")
        clock.advance(60)  # 09:01 runs; its start ping hangs on the hooks thread
        endpoint.wait_for(1)
        # The round ended and is on record while its ping still hangs.
        [record] = admin.history(db_url, "sync")
        assert (record.instant, record.outcome) == (at(1), admin.Outcome.SUCCEEDED)
        clock.advance(60)  # 09:02 starts on time, the ping still hanging
        assert started == [at(1), at(2)]
        assert [r.instant for r in admin.history(db_url, "sync")] == [at(2), at(1)]
        assert endpoint.requests == ["/k/start"]  # the rest wait behind it
        endpoint.release.set()
        assert endpoint.wait_for(4) == ["/k/start", "/k", "/k/start", "/k"]

    def test_no_hooks_thread_without_hook_or_heartbeat(self, db_url, replicas, clock):
        registry = Registry()
        registry.register(fine, EVERY_MINUTE, "plain")
        scheduler = replicas(registry, "a")
        clock.advance(60 + 5)
        assert scheduler._hooks is None


class TestPing:
    def test_an_endpoint_that_does_not_answer_is_given_up_and_logged(self, endpoint, caplog):
        caplog.set_level(logging.WARNING, logger="cronjob")
        endpoint.hang = True
        assert ping("sync", f"{endpoint.base}/secret", "start", timeout=0.2) is False
        [line] = [r.getMessage() for r in caplog.records]
        assert line.startswith("job 'sync': its heartbeat ping (start) to 127.0.0.1 failed: ")
        assert "secret" not in line

    def test_an_http_error_is_logged_not_raised(self, caplog, monkeypatch):
        monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
        caplog.set_level(logging.WARNING, logger="cronjob")

        class Gone(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_error(404)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gone)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            host, port = server.server_address[:2]
            assert ping("sync", f"http://{host!s}:{port}/k", "fail") is False
        finally:
            server.shutdown()
            server.server_close()
        assert any("404" in r.getMessage() for r in caplog.records)

    def test_the_timeout_is_five_seconds(self):
        assert _heartbeat.PING_TIMEOUT == 5.0

    def test_pings_past_the_queue_bound_are_dropped_with_a_warning(
        self, endpoint, caplog, monkeypatch
    ):
        caplog.set_level(logging.WARNING, logger="cronjob")
        monkeypatch.setattr(_failures, "MAX_QUEUED_PINGS", 2)
        endpoint.hang = True
        hooks = Hooks()
        try:
            hooks.ping_later("sync", f"{endpoint.base}/k", "start")
            endpoint.wait_for(1)  # in flight, hanging: no longer queued
            for _ in range(3):
                hooks.ping_later("sync", f"{endpoint.base}/k", "success")
            dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
            assert dropped == [
                "job 'sync': its success ping is dropped: 2 heartbeat pings wait already "
                "(an endpoint that does not answer?)"
            ]
            endpoint.release.set()
            assert endpoint.wait_for(3) == ["/k/start", "/k", "/k"]
        finally:
            endpoint.release.set()
            assert hooks.close(timeout=WAIT)


class TestTaskHooks:
    def test_a_tasks_success_hook_and_heartbeat_serve_each_of_its_schedules(
        self, db_url, replicas, clock, endpoint
    ):
        engine = lease.create_engine(db_url)
        lease.migrate(engine)
        try:
            hook = Hooked()
            registry = Registry()
            registry.register_task(fine, "report", on_success=hook, heartbeat=f"{endpoint.base}/r")
            replicas(registry, "a")
            replicas(registry, "b")
            for tenant in (1, 2):
                schedules.add(engine, f"report:{tenant}", task="report", spec=EVERY_MINUTE)
            clock.advance(60 + 5)
            hook.wait(2)
            assert sorted((r.job, r.instant) for r in hook.records) == [
                ("report:1", at(1)),
                ("report:2", at(1)),
            ]
            assert sorted(endpoint.wait_for(4)) == ["/r", "/r", "/r/start", "/r/start"]
        finally:
            engine.dispose()


class TestShown:
    @pytest.fixture
    def clock(self) -> FakeClock:
        """About now: ``cronjob status`` reads the database's clock to tell live replicas."""
        return FakeClock(datetime.now(UTC).replace(microsecond=0))

    def test_status_and_the_page_show_them_with_the_heartbeats_host_only(
        self, db_url, replicas, clock
    ):
        registry = Registry()
        registry.register(
            fine,
            EVERY_MINUTE,
            "sync",
            on_success=print,
            heartbeat="https://hc-ping.com/0b5e-secret",
            jitter=90,
        )
        replicas(registry, "a")
        clock.advance(0)
        [job] = [j for j in admin.status(db_url, now=clock.now()).jobs if j.name == "sync"]
        assert job.policies == {
            "on_success": "builtins.print",
            "heartbeat": "hc-ping.com",
            "jitter": 90.0,
        }
        page = wsgi_call(web.wsgi_app(db_url, clock=clock), "/job", "name=sync")[2]
        assert "on success builtins.print, heartbeat to hc-ping.com, jitter 1m30s" in page
        assert "secret" not in page
