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
        assert (tmp_path / "cronjob.sqlite").exists()  # the embedded default


@pytest.mark.parametrize("module", ["cronjob", "lease", "execctx"])
def test_each_package_ships_its_type_marker(module):
    assert (REPO / module / "py.typed").exists()
