"""The three ways to run the scheduler, and start-up when the database is away."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.testing import FakeClock
from tests._helpers import run_sql
from tests._process import run_python, run_until_started

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

    def test_the_same_lifespan_started_twice_runs_rounds_on_each_start(self, tmp_path):
        """Two ``asyncio.run`` (two ``with TestClient(app)``): each start its own loop."""
        clock = FakeClock(START)
        seen: list[tuple[datetime, asyncio.AbstractEventLoop]] = []
        fatal: list[str] = []

        async def job(ctx: cronjob.Round) -> None:
            seen.append((ctx.instant, asyncio.get_running_loop()))

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "hourly")
        lifespan = cronjob.lifespan(
            f"sqlite:///{tmp_path / 'app.sqlite'}",
            registry=registry,
            clock=clock,
            on_fatal=fatal.append,
        )
        loops: list[asyncio.AbstractEventLoop] = []

        async def serve() -> None:
            loops.append(asyncio.get_running_loop())
            async with lifespan(object()):
                await asyncio.to_thread(clock.advance, 3600)

        asyncio.run(serve())
        asyncio.run(serve())
        assert seen == [
            (START + timedelta(hours=1), loops[0]),
            (START + timedelta(hours=2), loops[1]),
        ]
        assert fatal == []

    def test_the_lifespan_puts_its_scheduler_on_app_state(self, tmp_path):
        clock = FakeClock(START)
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        app = SimpleNamespace(state=SimpleNamespace())
        lifespan = cronjob.lifespan(
            f"sqlite:///{tmp_path / 'app.sqlite'}", registry=registry, clock=clock
        )
        states: list[bool] = []

        async def serve() -> cronjob.Scheduler:
            async with lifespan(app):
                scheduler = app.state.cronjob_scheduler
                states.append(scheduler.ready)
            return scheduler

        scheduler = asyncio.run(serve())
        assert isinstance(scheduler, cronjob.Scheduler)
        assert states == [True]
        assert not scheduler.ready  # stopped with the app

    def test_async_with_a_scheduler_composes_inside_an_apps_own_lifespan(self, tmp_path):
        """``async with Scheduler(...)``: async jobs run on the loop that entered it."""
        clock = FakeClock(START)
        seen: list[bool] = []

        async def job(ctx: cronjob.Round) -> None:
            seen.append(asyncio.get_running_loop() is app_loop)

        registry = cronjob.Registry()
        registry.register(job, "0 0 * * * *", "hourly")

        async def serve() -> None:
            nonlocal app_loop
            app_loop = asyncio.get_running_loop()
            url = f"sqlite:///{tmp_path / 'app.sqlite'}"
            async with cronjob.Scheduler(url, registry=registry, clock=clock) as scheduler:
                assert scheduler.ready
                await asyncio.to_thread(clock.advance, 3600)

        app_loop: asyncio.AbstractEventLoop | None = None
        asyncio.run(serve())
        assert seen == [True]

    def test_a_cancelled_async_with_stops_the_scheduler_its_start_began(self, tmp_path):
        """Cancelled while ``start()`` runs in its thread: nothing is left running."""
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        engine = lease.create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
        connecting, release = threading.Event(), threading.Event()

        @sa.event.listens_for(engine, "connect")
        def slow_connect(*_args: object) -> None:  # start() waits here, in its thread
            connecting.set()
            release.wait(30)

        scheduler = cronjob.Scheduler(engine, registry=registry, clock=FakeClock(START))

        async def serve() -> None:
            async with scheduler:
                raise AssertionError("the block must not be entered")

        async def cancel_during_start() -> None:
            task = asyncio.create_task(serve())
            await asyncio.to_thread(connecting.wait, 30)
            task.cancel()
            await asyncio.sleep(0)  # the cancellation reaches __aenter__ first
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task

        try:
            asyncio.run(cancel_during_start())
            assert scheduler._flags.stopped, "start() finished with nobody to stop it"
            assert not scheduler.ready
        finally:
            release.set()
            scheduler.stop()
            engine.dispose()


class TestReadiness:
    def test_a_scheduler_is_ready_once_its_tables_are_at_head_and_until_it_stops(self, db_url):
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        scheduler = cronjob.Scheduler(db_url, registry=registry, clock=FakeClock(START))
        assert not scheduler.ready
        with scheduler:
            assert scheduler.ready
            assert scheduler.database_error is None
        assert not scheduler.ready

    def test_a_replica_that_has_not_reached_its_database_is_not_ready(self):
        clock = FakeClock(START)
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "@every 60s", "shared")
        url = "postgresql+psycopg://app:s3cret@127.0.0.1:1/none"  # nothing listens there
        with cronjob.Scheduler(url, registry=registry, clock=clock) as scheduler:
            clock.advance(60)
            assert not scheduler.ready
            error = scheduler.database_error
            assert error is not None and "Connection refused" in error
            assert "s3cret" not in error

    def test_a_scheduler_with_no_jobs_is_ready_without_a_database(self):
        url = "postgresql+psycopg://app@127.0.0.1:1/none"
        with cronjob.Scheduler(url, registry=cronjob.Registry()) as scheduler:
            assert scheduler.ready


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


def _with_database(url: str, database: str) -> str:
    return sa.make_url(url).set(database=database).render_as_string(hide_password=False)


def _with_user(url: str, user: str, password: str | None = None) -> str:
    return (
        sa.make_url(url).set(username=user, password=password).render_as_string(hide_password=False)
    )


def _start_refused(url: str) -> lease.DatabaseRefused:
    """Start a scheduler with one leased job on ``url``; return what start() raised."""
    registry = cronjob.Registry()
    registry.register(lambda ctx: None, "@every 60s", "shared")
    scheduler = cronjob.Scheduler(url, registry=registry, clock=FakeClock(START))
    threads = threading.active_count()
    with pytest.raises(lease.DatabaseRefused) as caught:
        scheduler.start()
    assert threading.active_count() == threads  # nothing left running
    assert not scheduler.ready
    scheduler.stop()  # harmless after a failed start
    assert isinstance(caught.value, lease.LeaseError)
    return caught.value


@dataclass(frozen=True)
class Refusing:
    """How a server refuses a start, for :class:`TestDatabaseRefused`."""

    #: The fixture naming a fresh database on it.
    fixture: str
    #: What it says of a database that does not exist (``cronjob_no_such_db``).
    no_database: str
    #: A user it does not know (the test servers trust 127.0.0.1, so a wrong password is
    #: not checked there; an unknown user is refused the same way).
    unknown_user: str
    #: The statements letting ``cronjob_noperm`` connect but not create tables, given
    #: the fixture's URL; and the one statement taking that back.
    grant: Callable[[sa.URL], tuple[str, ...]]
    revoke: Callable[[sa.URL], str]
    #: What it says when ``cronjob_noperm`` tries.
    denied: str


def _schema(url: sa.URL) -> str:
    """The scratch schema a ``postgres_url`` fixture's URL names."""
    return str(url.query["options"]).split("=", 1)[1]


REFUSING = [
    pytest.param(
        Refusing(
            fixture="postgres_url",
            no_database='database "cronjob_no_such_db" does not exist',
            unknown_user="cronjob_no_such_role",  # refused (28000) as a wrong password (28P01)
            grant=lambda url: (
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cronjob_noperm')"
                " THEN CREATE ROLE cronjob_noperm LOGIN; END IF; END $$",
                f"GRANT USAGE ON SCHEMA {_schema(url)} TO cronjob_noperm",
            ),
            revoke=lambda url: f"REVOKE ALL ON SCHEMA {_schema(url)} FROM cronjob_noperm",
            denied="permission denied for schema",
        ),
        marks=pytest.mark.postgres,
        id="postgres",
    ),
    pytest.param(
        Refusing(
            fixture="mysql_url",
            no_database="Unknown database 'cronjob_no_such_db'",
            unknown_user="cronjob_no_such_user",
            grant=lambda url: (
                "CREATE USER IF NOT EXISTS 'cronjob_noperm'@'127.0.0.1'",
                f"GRANT SELECT ON {url.database}.* TO 'cronjob_noperm'@'127.0.0.1'",
            ),
            revoke=lambda url: f"REVOKE ALL ON {url.database}.* FROM 'cronjob_noperm'@'127.0.0.1'",
            denied="command denied",
        ),
        marks=pytest.mark.mysql,
        id="mysql",
    ),
]


class TestDatabaseRefused:
    """A database that will not heal by waiting fails the start; one that is down does not."""

    @pytest.mark.parametrize("server", REFUSING)
    def test_a_database_that_does_not_exist(self, request, server):
        url = request.getfixturevalue(server.fixture)
        error = _start_refused(_with_database(url, "cronjob_no_such_db"))
        assert str(error).startswith("migrate the lease tables: the database does not exist: ")
        assert server.no_database in str(error)

    @pytest.mark.parametrize("server", REFUSING)
    def test_an_unknown_user(self, request, server):
        url = request.getfixturevalue(server.fixture)
        error = _start_refused(_with_user(url, server.unknown_user, "s3cret"))
        assert str(error).startswith("migrate the lease tables: the credentials were refused: ")
        assert "s3cret" not in str(error)

    @pytest.mark.parametrize("server", REFUSING)
    def test_a_user_without_create_rights(self, request, server):
        url = request.getfixturevalue(server.fixture)
        run_sql(url, *server.grant(sa.make_url(url)))
        try:
            error = _start_refused(_with_user(url, "cronjob_noperm"))
        finally:
            run_sql(url, server.revoke(sa.make_url(url)))
        assert str(error).startswith("migrate the lease tables: a permission is missing: ")
        assert server.denied in str(error)

    def test_sqlite_a_directory_that_does_not_exist(self, tmp_path):
        error = _start_refused(f"sqlite:///{tmp_path / 'missing' / 'app.sqlite'}")
        assert str(error).startswith("migrate the lease tables: the SQLite file cannot be opened: ")

    def test_a_server_that_is_down_is_not_refused(self):
        engine = lease.create_engine("postgresql+psycopg://app:s3cret@127.0.0.1:1/none")
        with pytest.raises(lease.DatabaseUnavailable) as caught:
            lease.migrate(engine)
        engine.dispose()
        assert not isinstance(caught.value, lease.DatabaseRefused)


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):
    return run_python("-m", "cronjob", *args, cwd=cwd, env=env, timeout=timeout)


def refused_run(tmp_path: Path, module: str, source: str) -> list[str]:
    """``cronjob run MODULE`` in ``tmp_path``, MODULE.py holding ``source``: it exits 2
    (bad input); the lines of its stderr."""
    (tmp_path / f"{module}.py").write_text(source)
    done = run_cli("run", module, cwd=tmp_path)
    assert done.returncode == 2
    return done.stderr.splitlines()


class TestRunCommand:
    def test_a_missing_module_is_a_one_line_error(self, tmp_path):
        done = run_cli("run", "no_such_jobs", cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines()[-1] == (
            "cronjob: error: no module named 'no_such_jobs' (searched the working directory first)"
        )
        assert "Traceback" not in done.stderr

    def test_a_module_that_fails_to_import_says_so_first_then_shows_the_traceback(self, tmp_path):
        lines = refused_run(tmp_path, "brokenjobs", "raise RuntimeError('no config')\n")
        assert lines[0] == (
            "cronjob: error: cannot import job module 'brokenjobs': RuntimeError: no config"
        )
        assert lines[1] == "Traceback (most recent call last):"
        assert lines[-1] == "RuntimeError: no config"

    def test_a_module_importing_something_missing_says_so_first(self, tmp_path):
        lines = refused_run(tmp_path, "jobs", "import no_such_dependency\n")
        assert lines[0] == (
            "cronjob: error: cannot import job module 'jobs': No module named 'no_such_dependency'"
        )
        assert lines[1] == "Traceback (most recent call last):"

    def test_a_job_refused_at_registration_fails_the_start(self, tmp_path):
        source = "import cronjob\ncronjob.register(print, '0 * * * *', 'five')\n"
        lines = refused_run(tmp_path, "badjobs", source)
        assert "cronjob: error: module 'badjobs': job 'five': '0 * * * *' has 5 fields" in (
            "\n".join(lines)
        )

    def test_a_database_that_cannot_carry_leases_fails_the_start(self, tmp_path):
        (tmp_path / "jobs.py").write_text(
            "import cronjob\ncronjob.register(print, '@hourly', 'hourly')\n"
        )
        done = run_cli("run", "--database-url", "mssql+pymssql://u:pw@h/db", "jobs", cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr.startswith("cronjob: error: ")
        assert "pw@" not in done.stderr

    def test_a_sqlite_file_that_cannot_be_opened_is_a_one_line_error(self, tmp_path):
        (tmp_path / "jobs.py").write_text(
            "import cronjob\ncronjob.register(print, '@hourly', 'hourly')\n"
        )
        url = f"sqlite:///{tmp_path / 'missing' / 'app.sqlite'}"
        done = run_cli("run", "--database-url", url, "jobs", cwd=tmp_path, timeout=30)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines()[-1] == (
            f"cronjob: error: database {url}: migrate the lease tables: the SQLite file "
            "cannot be opened: OperationalError: unable to open database file"
        )
        assert "Traceback" not in done.stderr

    @pytest.mark.postgres
    def test_a_postgres_database_that_does_not_exist_exits_2(self, tmp_path, postgres_url):
        (tmp_path / "jobs.py").write_text(
            "import cronjob\ncronjob.register(print, '@hourly', 'hourly')\n"
        )
        url = _with_user(_with_database(postgres_url, "cronjob_no_such_db"), "postgres", "s3cret")
        done = run_cli("run", "--database-url", url, "jobs", cwd=tmp_path, timeout=30)
        assert done.returncode == 2, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("cronjob: error: database postgresql+psycopg://postgres:***@")
        assert "the database does not exist: " in last
        assert "s3cret" not in done.stderr
        assert "Traceback" not in done.stderr

    def test_sigterm_drains_and_exits_0(self, tmp_path):
        (tmp_path / "jobs.py").write_text(
            textwrap.dedent(
                """
                import cronjob
                cronjob.register(print, "@hourly", "hourly")
                """
            )
        )
        argv = [sys.executable, "-m", "cronjob", "run", "jobs"]
        status, log = run_until_started(argv, cwd=tmp_path)
        assert status == 0, log
        lines = log.splitlines()
        assert any("SIGTERM received: draining" in line for line in lines)
        assert sum(DEFAULT_DATABASE_WARNING in line for line in lines) == 1
        assert (tmp_path / "cronjob.sqlite").exists()  # the embedded default

    def test_a_second_signal_during_the_drain_exits_at_once(self, tmp_path):
        """The first SIGTERM drains; a round that ignores its cancellation keeps the
        drain waiting; a second SIGTERM ends the process at once, status 128 + 15."""
        (tmp_path / "jobs.py").write_text(
            textwrap.dedent(
                """
                import sys, time
                import cronjob

                def stuck(ctx):
                    print("stuck started", file=sys.stderr, flush=True)
                    time.sleep(120)  # ignores the drain's cancellation

                cronjob.register(stuck, "@every 1s", "stuck")
                """
            )
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "cronjob", "run", "jobs"],
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        assert process.stderr is not None
        lines: list[str] = []
        try:
            for line in process.stderr:
                lines.append(line)
                if "stuck started" in line:
                    process.send_signal(signal.SIGTERM)
                if "SIGTERM received: draining" in line:
                    process.send_signal(signal.SIGTERM)
                    break
            assert process.wait(20) == 128 + signal.SIGTERM, "".join(lines)
            lines.extend(process.stderr)
        finally:
            process.kill()
            process.wait()
        assert any("second SIGTERM: exiting without waiting" in line for line in lines), lines

    def test_what_start_up_built_is_frozen_out_of_the_garbage_collector(self, tmp_path):
        """`cronjob run` owns its process: once the scheduler started, it collects and
        freezes what start-up built (full collections at scale skip it)."""
        (tmp_path / "jobs.py").write_text(
            textwrap.dedent(
                """
                import gc, sys
                import cronjob

                _freeze = gc.freeze

                def freeze():  # reports what it froze, from within the process
                    _freeze()
                    print(f"frozen: {gc.get_freeze_count()}", file=sys.stderr, flush=True)

                gc.freeze = freeze
                cronjob.register(print, "@hourly", "hourly")
                """
            )
        )
        argv = [sys.executable, "-m", "cronjob", "run", "jobs"]
        status, log = run_until_started(argv, cwd=tmp_path)
        assert status == 0, log
        (frozen,) = [line for line in log.splitlines() if line.startswith("frozen: ")]
        assert int(frozen.removeprefix("frozen: ")) > 10_000  # the modules, the registry...


@pytest.mark.parametrize("module", ["cronjob", "lease", "execctx"])
def test_each_package_ships_its_type_marker(module):
    assert (REPO / module / "py.typed").exists()
