"""The base install and the sync extras run without greenlet.

SQLAlchemy 2.1 no longer installs greenlet, and importing its asyncio support without it
raises ImportError; only the ``*-async`` extras bring it. So a scheduler must start and
run sync jobs, and async jobs that never open ``ctx.transaction_async()``, without ever
importing ``sqlalchemy.ext.asyncio``; a job that does open one gets the error naming what
to install, and the others keep running.

The test process itself has greenlet (the test extra brings it) and may already have
imported SQLAlchemy's asyncio support, so each case runs in a fresh interpreter in which
``import greenlet`` fails, as it does in an environment without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests._process import lease_names, run_until_started

#: Run first in each child interpreter: greenlet cannot be imported, as if not installed.
WITHOUT_GREENLET = 'import sys; sys.modules["greenlet"] = None\n'

#: A scheduler on a fake clock, with a sync job, an async job that opens no async
#: transaction and one that does, for 3 of its per-second instants; it prints what ran.
SCHEDULER = WITHOUT_GREENLET + textwrap.dedent(
    """
    import json
    from datetime import UTC, datetime

    import lease
    from cronjob import Registry, Round, Scheduler
    from cronjob.testing import FakeClock

    ran = {"sync": 0, "async": 0, "errors": []}

    def sync_job(ctx: Round) -> None:
        with ctx.transaction():
            ran["sync"] += 1

    async def async_job(ctx: Round) -> None:
        ran["async"] += 1

    async def async_transaction(ctx: Round) -> None:
        try:
            async with ctx.transaction_async():
                pass
        except lease.DatabaseError as exc:
            ran["errors"].append(str(exc))

    registry = Registry()
    registry.register(sync_job, "* * * * * *", "sync")
    registry.register(async_job, "* * * * * *", "async")
    registry.register(async_transaction, "0 * * * * *", "async-transaction")
    clock = FakeClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))
    with Scheduler(sys.argv[1], registry=registry, clock=clock):
        clock.advance(3)
        ran["asyncio imported"] = "sqlalchemy.ext.asyncio" in sys.modules
        clock.advance(57)
    print(json.dumps(ran))
    """
)


def run_without_greenlet(code: str, *args: str, cwd: Path) -> str:
    """Run ``code`` in a new interpreter without greenlet; return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_scheduler_runs_sync_and_async_jobs_without_greenlet(db_url, tmp_path):
    ran = json.loads(run_without_greenlet(SCHEDULER, db_url, cwd=tmp_path))
    backend = "sqlite" if db_url.startswith("sqlite") else db_url.split("+")[0]
    extra = {"sqlite": "sqlite-async", "postgresql": "postgres-async", "mysql": "mysql-async"}
    assert ran["sync"] == 60
    assert ran["async"] == 60
    assert ran["asyncio imported"] is False
    [error] = ran["errors"]
    prefix = (
        "job 'async-transaction': SQLAlchemy's asyncio support needs greenlet, which is not "
        "installed: install "
    )
    assert error.startswith(prefix), error
    assert f"[{extra[backend]}]" in error


def test_cronjob_run_starts_and_drains_without_greenlet(tmp_path):
    """The command's own import path (job module, database, scheduler) needs no greenlet."""
    (tmp_path / "jobs.py").write_text(
        "import cronjob\ncronjob.register(lambda ctx: None, '* * * * * *', 'tick')\n"
    )
    command = WITHOUT_GREENLET + "from cronjob.admin._cli import main; sys.exit(main())"
    status, log = run_until_started(
        [sys.executable, "-c", command, "run", "--database-url", "sqlite:///jobs.sqlite", "jobs"],
        cwd=tmp_path,
    )
    assert status == 0, log
    assert "started:" in log
    assert lease_names(tmp_path / "jobs.sqlite") == ["tick"]


def test_an_async_url_without_greenlet_is_refused_with_what_to_install(tmp_path):
    """Not SQLAlchemy's ImportError from inside: lease's DatabaseError naming the extra."""
    code = WITHOUT_GREENLET + textwrap.dedent(
        """
        import lease
        try:
            lease.create_async_engine("sqlite+aiosqlite:///jobs.sqlite")
        except lease.DatabaseError as exc:
            print(exc)
        """
    )
    message = run_without_greenlet(code, cwd=tmp_path)
    assert message.startswith("SQLAlchemy's asyncio support needs greenlet"), message
    assert "[sqlite-async]" in message


def test_an_async_url_without_greenlet_fails_only_the_job_that_opens_a_transaction(tmp_path):
    """Given ``sqlite+aiosqlite://``, the leases run on pysqlite; the sync job runs."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite'}"
    ran = json.loads(run_without_greenlet(SCHEDULER, url, cwd=tmp_path))
    assert (ran["sync"], ran["async"], ran["asyncio imported"]) == (60, 60, False)
    [error] = ran["errors"]
    assert "SQLAlchemy's asyncio support needs greenlet" in error
