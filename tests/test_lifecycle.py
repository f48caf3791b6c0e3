"""The three ways to run the scheduler, and start-up when the database is away."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import cronjob
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[1]


class TestLifespan:
    def test_async_jobs_run_on_the_apps_loop_and_drain_with_it(self, tmp_path):
        clock = FakeClock(START)
        seen: list[tuple[datetime, bool]] = []
        app_loop: list[asyncio.AbstractEventLoop] = []

        async def job(ctx: cronjob.Round) -> None:
            seen.append((ctx.instant, asyncio.get_running_loop() is app_loop[0]))

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "hourly")
        lifespan = cronjob.lifespan(
            f"sqlite:///{tmp_path / 'app.sqlite'}", registry=registry, clock=clock
        )

        async def serve() -> None:
            app_loop.append(asyncio.get_running_loop())
            async with lifespan(object()):
                await asyncio.to_thread(clock.advance, 2 * 3600)

        asyncio.run(serve())
        assert seen == [(START + timedelta(hours=1), True), (START + timedelta(hours=2), True)]


DEFAULT_DATABASE_WARNING = (
    "database: the embedded default, cronjob.sqlite in the working directory: replicas on "
    "other hosts will not coordinate with this one and will each run every job; in "
    "production set $CRONJOB_DATABASE_URL (or --database-url, or Scheduler(database)) to the "
    "database all replicas share"
)


def warnings_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


class TestDefaultDatabase:
    """Without a URL, each host gets a lease table of its own: the start says so, once."""

    @pytest.fixture(autouse=True)
    def no_url(self, tmp_path, monkeypatch):
        monkeypatch.delenv("CRONJOB_DATABASE_URL", raising=False)
        monkeypatch.chdir(tmp_path)

    @staticmethod
    def registry() -> cronjob.Registry:
        registry = cronjob.Registry()
        registry.register(print, "@hourly", "hourly")
        return registry

    def test_the_embedded_default_warns_once_at_start(self, tmp_path, caplog):
        clock = FakeClock(START)
        with caplog.at_level(logging.INFO, logger="cronjob"):
            scheduler = cronjob.Scheduler(registry=self.registry(), clock=clock)
            assert warnings_logged(caplog) == []  # built, not started: nothing said yet
            with scheduler:
                clock.advance(2 * 3600)  # rounds run; the warning is not repeated
        assert warnings_logged(caplog) == [DEFAULT_DATABASE_WARNING]
        assert (tmp_path / "cronjob.sqlite").exists()

    def test_the_lifespan_on_the_default_warns_too(self, caplog):
        lifespan = cronjob.lifespan(registry=self.registry(), clock=FakeClock(START))

        async def serve() -> None:
            async with lifespan(object()):
                pass

        with caplog.at_level(logging.WARNING, logger="cronjob"):
            asyncio.run(serve())
        assert warnings_logged(caplog) == [DEFAULT_DATABASE_WARNING]

    def test_a_database_named_in_the_environment_does_not_warn(self, tmp_path, monkeypatch, caplog):
        monkeypatch.setenv("CRONJOB_DATABASE_URL", f"sqlite:///{tmp_path / 'shared.sqlite'}")
        with (
            caplog.at_level(logging.WARNING, logger="cronjob"),
            cronjob.Scheduler(registry=self.registry(), clock=FakeClock(START)),
        ):
            pass
        assert warnings_logged(caplog) == []
        assert not (tmp_path / "cronjob.sqlite").exists()

    def test_a_database_passed_in_does_not_warn(self, tmp_path, caplog):
        url = f"sqlite:///{tmp_path / 'app.sqlite'}"
        with (
            caplog.at_level(logging.WARNING, logger="cronjob"),
            cronjob.Scheduler(url, registry=self.registry(), clock=FakeClock(START)),
        ):
            pass
        assert warnings_logged(caplog) == []

    def test_no_jobs_is_a_warning_and_opens_no_database(self, tmp_path, caplog):
        with (
            caplog.at_level(logging.WARNING, logger="cronjob"),
            cronjob.Scheduler(registry=cronjob.Registry(), clock=FakeClock(START)),
        ):
            pass
        assert warnings_logged(caplog) == ["no jobs registered: the scheduler starts nothing"]
        assert not (tmp_path / "cronjob.sqlite").exists()


class TestDatabaseAway:
    def test_a_database_down_at_start_is_retried_and_per_instance_jobs_run(self, caplog):
        clock = FakeClock(START)
        local: list[datetime] = []
        leased: list[datetime] = []
        registry = cronjob.Registry()
        registry.register_per_instance(lambda ctx: local.append(ctx.instant), "@every 60s", "l")
        registry.register(lambda ctx: leased.append(ctx.instant), "@every 60s", "shared")
        url = "postgresql+psycopg://app:s3cret@127.0.0.1:1/none"  # nothing listens there
        with (
            caplog.at_level(logging.INFO, logger="cronjob"),
            cronjob.Scheduler(url, registry=registry, clock=clock),
        ):
            clock.advance(180)
        assert local == [START + timedelta(minutes=m) for m in (1, 2, 3)]
        assert leased == []
        messages = [r.getMessage() for r in caplog.records]
        assert any("unavailable at start" in m for m in messages)
        retries = [m for m in messages if "still unavailable" in m]
        assert len(retries) >= 5  # 1, 2, 4, 8, 16 s ... within 3 minutes: back-off, no loop
        assert len(retries) <= 10
        assert not any("s3cret" in m for m in messages)


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-m", "cronjob", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


class TestRunCommand:
    def test_a_missing_module_is_a_one_line_error(self, tmp_path):
        done = run_cli("run", "no_such_jobs", cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines()[-1] == (
            "cronjob: error: no module named 'no_such_jobs' (searched the working directory first)"
        )
        assert "Traceback" not in done.stderr

    def test_a_module_that_fails_to_import_says_so_first_then_shows_the_traceback(
        self, tmp_path
    ):
        (tmp_path / "brokenjobs.py").write_text("raise RuntimeError('no config')\n")
        done = run_cli("run", "brokenjobs", cwd=tmp_path)
        assert done.returncode == 2
        lines = done.stderr.splitlines()
        assert lines[0] == (
            "cronjob: error: cannot import job module 'brokenjobs': RuntimeError: no config"
        )
        assert lines[1] == "Traceback (most recent call last):"
        assert lines[-1] == "RuntimeError: no config"

    def test_a_module_importing_something_missing_says_so_first(self, tmp_path):
        (tmp_path / "jobs.py").write_text("import no_such_dependency\n")
        done = run_cli("run", "jobs", cwd=tmp_path)
        assert done.returncode == 2
        lines = done.stderr.splitlines()
        assert lines[0] == (
            "cronjob: error: cannot import job module 'jobs': "
            "No module named 'no_such_dependency'"
        )
        assert lines[1] == "Traceback (most recent call last):"

    def test_a_job_refused_at_registration_fails_the_start(self, tmp_path):
        (tmp_path / "badjobs.py").write_text(
            "import cronjob\ncronjob.register(print, '0 * * * *', 'five')\n"
        )
        done = run_cli("run", "badjobs", cwd=tmp_path)
        assert done.returncode == 2
        assert "cronjob: error: module 'badjobs': job 'five': '0 * * * *' has 5 fields" in (
            done.stderr
        )

    def test_a_database_that_cannot_carry_leases_fails_the_start(self, tmp_path):
        (tmp_path / "jobs.py").write_text(
            "import cronjob\ncronjob.register(print, '@hourly', 'hourly')\n"
        )
        done = run_cli("run", "--database-url", "mssql+pymssql://u:pw@h/db", "jobs", cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr.startswith("cronjob: error: ")
        assert "pw@" not in done.stderr

    def test_sigterm_drains_and_exits_0(self, tmp_path):
        (tmp_path / "jobs.py").write_text(
            textwrap.dedent(
                """
                import cronjob
                cronjob.register(print, "@hourly", "hourly")
                """
            )
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "cronjob", "run", "jobs"],
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        lines: list[str] = []
        started = threading.Event()

        def read() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                lines.append(line)
                if "started:" in line:
                    started.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert started.wait(30), "".join(lines)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        reader.join(5)
        assert any("SIGTERM received: draining" in line for line in lines)
        assert sum(DEFAULT_DATABASE_WARNING in line for line in lines) == 1
        assert (tmp_path / "cronjob.sqlite").exists()  # the embedded default


@pytest.mark.parametrize("module", ["cronjob", "lease", "execctx"])
def test_each_package_ships_its_type_marker(module):
    assert (REPO / module / "py.typed").exists()
