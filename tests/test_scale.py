"""Scale by design: many jobs, few threads, one claim statement per instant."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import sqlalchemy as sa

import cronjob
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_ten_thousand_jobs_run_once_each_on_few_threads_with_one_claim(tmp_path):
    """10,000 jobs due at one instant: all run, one claim statement, no thread per job."""
    clock = FakeClock(START)
    ran: list[str] = []
    lock = threading.Lock()

    def job(ctx: cronjob.Round) -> None:
        with lock:
            ran.append(ctx.name)

    registry = cronjob.Registry()
    for i in range(10_000):
        registry.register(job, "@every 10s", f"job-{i:05d}")
    statements: list[tuple[str, object]] = []
    scheduler = cronjob.Scheduler(
        f"sqlite:///{tmp_path / 'scale.sqlite'}", registry=registry, clock=clock, max_workers=8
    )
    with scheduler:
        assert scheduler.engine is not None
        sa.event.listen(
            scheduler.engine,
            "before_cursor_execute",
            lambda conn, cursor, statement, parameters, *rest: statements.append(
                (statement, parameters)
            ),
        )
        threads_idle = threading.active_count()
        clock.advance(10)
        threads_busy = threading.active_count()
    assert sorted(ran) == [f"job-{i:05d}" for i in range(10_000)]
    claims = [
        statement
        for statement, parameters in statements
        if statement.lstrip().upper().startswith("UPDATE")
        and "attempt" in statement
        and "job-00000" in str(parameters)  # not the hourly try to prune the history
    ]
    assert len(claims) == 1
    assert threads_busy - threads_idle <= 8  # the round workers, not one thread per job


def test_a_process_exits_although_a_job_ignores_its_cancellation(tmp_path):
    """Threads of rounds are daemons: a stuck job cannot keep the process from exiting."""
    import subprocess
    import sys

    script = f"""
from datetime import datetime, timezone
import cronjob
from cronjob.testing import FakeClock
clock = FakeClock(datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc))
registry = cronjob.Registry()
registry.register(lambda ctx: clock.sleep(10_000), "0 0 * * * *", "stuck")
s = cronjob.Scheduler("sqlite:///{tmp_path / "exit.sqlite"}", registry=registry, clock=clock,
                      drain_timeout=0)
s.start()
clock.advance(3600)
s.stop()
print("stopped")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"
