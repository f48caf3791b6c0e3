"""The alembic migrations of the lease table: to head, locked, from a checkout and a wheel."""

from __future__ import annotations

import io
import multiprocessing
import os
import queue
import subprocess
import sys
import sysconfig
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Any

import alembic
import alembic.command
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import lease
from lease import _migrate
from tests._helpers import replica_row

#: Migrations start from a database without the lease tables (tests/_pool.py).
pytestmark = pytest.mark.blank_database

REPO = Path(__file__).resolve().parent.parent
HEAD = "0018"


def lease_tables_only(name: str | None, type_: str, parent_names: object) -> bool:
    return type_ != "table" or name in lease.metadata.tables


def versions(engine: sa.Engine, table: str = "cronjob_alembic_version") -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT version_num FROM {table}")).scalars())


class TestUpgrade:
    def test_a_blank_database_upgrades_to_exactly_the_metadata(self, db_engine):
        lease.migrate(db_engine)
        with db_engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"include_name": lease_tables_only, "compare_type": True}
            )
            assert compare_metadata(context, lease.metadata) == []
        assert versions(db_engine) == [HEAD]
        assert lease.current_revision(db_engine) == lease.head_revision() == HEAD

    def test_migrating_a_database_at_head_changes_nothing(self, db_engine):
        lease.migrate(db_engine)
        lease.migrate(db_engine)
        lease.migrate(db_engine, auto_migrate=False)
        assert versions(db_engine) == [HEAD]

    def test_the_applications_own_alembic_history_is_untouched(self, sqlite_url):
        engine = lease.create_engine(sqlite_url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32))")
            conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('app1234')")
        lease.migrate(engine)
        assert versions(engine, "alembic_version") == ["app1234"]
        assert versions(engine) == [HEAD]
        engine.dispose()

    def test_a_blank_database_without_auto_migrate_requires_a_migration(self, db_engine):
        message = (
            r"^the lease tables are at revision none \(never migrated\) but the head is "
            rf"{HEAD}; "
            r"run lease.migrate\(\) or allow auto_migrate$"
        )
        with pytest.raises(lease.MigrationRequired, match=message):
            lease.migrate(db_engine, auto_migrate=False)
        assert lease.current_revision(db_engine) is None

    def test_a_newer_additive_revision_is_run_beside_without_migrating(self, sqlite_url, caplog):
        """A rolling deploy: the new release migrated to a later numbered revision; a
        replica of this release still starts, and its statements still work."""
        engine = lease.create_engine(sqlite_url)
        lease.migrate(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE cronjob_alembic_version SET version_num = '9999'")
        with caplog.at_level("INFO", logger="lease"):
            lease.migrate(engine)
            lease.migrate(engine, auto_migrate=False)
        assert versions(engine) == ["9999"]  # left as the newer release made it
        assert "newer than this release's" in caplog.text
        store = lease.LeaseStore(engine, claim_ahead=None)
        store.ensure(["a"])
        assert store.read(["a"])["a"].state is lease.LeaseState.NEW
        engine.dispose()

    def test_an_unknown_revision_that_is_not_additive_is_refused(self, sqlite_url):
        engine = lease.create_engine(sqlite_url)
        lease.migrate(engine)
        for revision in ("g2-0001", "0000abc"):
            with engine.begin() as conn:
                conn.execute(
                    sa.text("UPDATE cronjob_alembic_version SET version_num = :v"), {"v": revision}
                )
            with pytest.raises(
                lease.MigrationFailed, match=rf"^the lease tables are at revision '{revision}'"
            ):
                lease.migrate(engine)
        engine.dispose()

    def test_an_unreachable_database_raises_database_unavailable(self):
        engine = lease.create_engine("mysql+pymysql://root:secret@127.0.0.1:1/test")
        with pytest.raises(lease.DatabaseUnavailable) as caught:
            lease.migrate(engine)
        assert "secret" not in str(caught.value)
        engine.dispose()

    def test_the_sql_can_be_rendered_offline_for_a_dba(self):
        config = _migrate._config()
        config.output_buffer = io.StringIO()
        config.set_main_option("sqlalchemy.url", "postgresql://")
        alembic.command.upgrade(config, "head", sql=True)
        sql = config.output_buffer.getvalue()
        assert "CREATE TABLE cronjob_lease" in sql
        assert "CREATE TABLE cronjob_alembic_version" in sql
        assert "INSERT INTO cronjob_alembic_version (version_num) VALUES ('0001')" in sql
        assert "UPDATE cronjob_alembic_version SET version_num='0002'" in sql
        assert "ALTER TABLE cronjob_lease ADD COLUMN paused_ms BIGINT" in sql
        assert "UPDATE cronjob_alembic_version SET version_num='0003'" in sql
        assert "ALTER TABLE cronjob_lease ADD COLUMN deployed_ms BIGINT" in sql
        assert "UPDATE cronjob_alembic_version SET version_num='0005'" in sql
        assert "ALTER TABLE cronjob_lease ADD COLUMN due_s BIGINT" in sql
        assert "CREATE INDEX ix_cronjob_lease_due_s ON cronjob_lease (due_s)" in sql
        assert "UPDATE cronjob_alembic_version SET version_num='0006'" in sql


def _migrate_in_process(url: str, barrier: Any, results: Any) -> None:
    engine = lease.create_engine(url)
    try:
        barrier.wait()
        results.put("started")
        lease.migrate(engine)
        results.put("ok")
    except BaseException as exc:
        results.put(repr(exc))
        raise
    finally:
        engine.dispose()


class TestMigrationLock:
    def test_processes_migrating_one_blank_database_together_all_succeed(self, db_url):
        processes = 4
        spawn = multiprocessing.get_context("spawn")
        barrier = spawn.Barrier(processes)
        results = spawn.Queue()
        workers = [
            spawn.Process(target=_migrate_in_process, args=(db_url, barrier, results))
            for _ in range(processes)
        ]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=120) for _ in range(2 * processes)]
        for worker in workers:
            worker.join(timeout=60)
        assert sorted(outcomes) == ["ok"] * processes + ["started"] * processes
        engine = lease.create_engine(db_url)
        assert versions(engine) == [HEAD]
        engine.dispose()

    def test_a_migration_waits_for_the_lock(self, db_url):
        """While this process holds the lock, another one's migration does not proceed."""
        engine = lease.create_engine(db_url)
        spawn = multiprocessing.get_context("spawn")
        barrier = spawn.Barrier(1)
        results = spawn.Queue()
        worker = spawn.Process(target=_migrate_in_process, args=(db_url, barrier, results))
        with engine.connect() as conn, _migrate._migration_lock(engine, conn, pooled=False):
            worker.start()
            assert results.get(timeout=60) == "started"
            with pytest.raises(queue.Empty):
                results.get(timeout=0.5)
            # Another engine: on SQLite, `engine`'s one connection holds the lock.
            observer = lease.create_engine(db_url)
            assert lease.current_revision(observer) is None
            observer.dispose()
        assert results.get(timeout=60) == "ok"
        worker.join(timeout=60)
        assert lease.current_revision(engine) == HEAD
        engine.dispose()


class TestWithoutAlembic:
    """A start on a database at head reads its revision without importing alembic."""

    @staticmethod
    def migrated_in_a_process(url: str) -> list[str]:
        """Migrate ``url`` in a new process; what it prints: the revision, and whether
        it imported alembic."""
        code = (
            "import sys, lease\n"
            "engine = lease.create_engine(sys.argv[1])\n"
            "lease.migrate(engine)\n"
            "print(lease.current_revision(engine), 'alembic' in sys.modules)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, url], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def test_the_head_read_from_the_file_names_is_alembics(self):
        assert _migrate.shipped_head() == lease.head_revision() == HEAD

    def test_a_process_that_starts_on_a_database_at_head_never_imports_alembic(self, db_url):
        engine = lease.create_engine(db_url)
        lease.migrate(engine)
        engine.dispose()
        assert self.migrated_in_a_process(db_url) == [HEAD, "False"]

    def test_a_process_that_migrates_a_blank_database_imports_it(self, sqlite_url):
        assert self.migrated_in_a_process(sqlite_url) == [HEAD, "True"]


class TestLocation:
    def test_a_checkout_finds_the_migrations_at_the_top_of_the_repository(self):
        assert _migrate.migrations_location() == REPO / "alembic"

    def test_the_migrations_never_shadow_the_alembic_library(self):
        assert not (REPO / "alembic" / "__init__.py").exists()
        # Even with the repository first on sys.path, `import alembic` is the library.
        out = subprocess.run(
            [sys.executable, "-c", "import alembic, alembic.command; print(alembic.__file__)"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert Path(out) == Path(alembic.__file__)
        assert not Path(out).is_relative_to(REPO / "alembic")


def _build_wheel(out: Path) -> Path:
    """Build the project's wheel into ``out``: offline when hatchling is installed here."""
    try:
        import hatchling  # noqa: F401
    except ImportError:
        isolation: list[str] = []  # build fetches hatchling into its own environment
    else:
        isolation = ["--no-isolation"]
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", *isolation, "--outdir", str(out), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("cronjob_lease-*.whl")
    return wheel


@pytest.mark.slow
def test_an_installed_wheel_migrates_with_its_packaged_migrations(tmp_path):
    wheel = _build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert "lease/_migrations/env.py" in names
    assert any(n.startswith("lease/_migrations/versions/0001_") for n in names)
    assert not any(n.startswith("alembic/") for n in names), "alembic/ would shadow the library"
    # The distribution is cronjob-lease (PyPI's `cronjob` is another project); the README
    # names the three import packages it installs.
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {
        "cronjob",
        "lease",
        "execctx",
    }
    metadata = zipfile.ZipFile(wheel).read("cronjob_lease-0.1.0.dist-info/METADATA").decode()
    assert "\nName: cronjob-lease\n" in metadata

    # A fresh environment holding only the wheel; its dependencies (SQLAlchemy, alembic...)
    # are borrowed from this one through a .pth line, appended after its own packages.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    database = tmp_path / "wheel.sqlite"
    script = f"""
import pathlib, alembic, alembic.command, lease
from lease import _migrate
site = pathlib.Path({purelib!r})
assert pathlib.Path(lease.__file__).is_relative_to(site), lease.__file__
assert not pathlib.Path(alembic.__file__).is_relative_to(site), alembic.__file__
assert hasattr(alembic.command, "upgrade"), "alembic is not the library"
assert _migrate.migrations_location() == site / "lease" / "_migrations"
engine = lease.create_engine("sqlite:///{database}")
lease.migrate(engine)
print(lease.current_revision(engine))
"""
    # -I: no PYTHONPATH, no current directory on sys.path; the checkout stays out of it.
    result = subprocess.run(
        [python, "-I", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == HEAD


#: The lease table as release 0001 knows it: its statements name only these columns.
_OLD = sa.Table(
    "cronjob_lease",
    sa.MetaData(),
    *(
        sa.Column(name, sa.BigInteger() if name != "name" else sa.String(200))
        for name in ("name", "instant", "attempt", "token", "expires_ms", "skipped_through")
    ),
    sa.Column("state", sa.String(16)),
    sa.Column("holder", sa.String(255)),
    sa.Column("prev_instant", sa.BigInteger()),
    sa.Column("prev_state", sa.String(16)),
    sa.Column("prev_attempt", sa.SmallInteger()),
)


def _old_job_running(db_engine: sa.Engine, **running: Any) -> None:
    """As an older release leaves it: rows for ``old-job`` and ``new-job``, and a round of
    ``old-job`` in flight (``running``: the columns it set)."""
    with db_engine.begin() as conn:
        for name in ("old-job", "new-job"):
            conn.execute(
                _OLD.insert().values(name=name, instant=-1, attempt=1, state="new", token=0)
            )
        conn.execute(_OLD.update().where(_OLD.c.name == "old-job").values(**running))


def _upgraded_under_a_round(
    db_engine: sa.Engine, revision: str, now: datetime, *, holder: str
) -> int:
    """Upgrade to ``revision``, whose release makes the rows and runs a round of
    ``old-job`` at ``now`` (token 42, ``holder``'s for 15 s); then the new release starts
    and upgrades to head, live. Returns the round's ``expires_ms``."""
    TestUpgradeTo0002.upgrade_to(db_engine, revision)
    expires = int(now.timestamp() * 1000) + 15_000
    _old_job_running(
        db_engine,
        instant=int(now.timestamp()),
        state="running",
        token=42,
        holder=holder,
        expires_ms=expires,
    )
    lease.migrate(db_engine)
    return expires


class TestUpgradeTo0002:
    """Revision 0002 only adds, so a live database upgrades under rounds in flight and a
    replica of release 0001 (whose statements name only 0001's columns) keeps working."""

    @staticmethod
    def upgrade_to(engine: sa.Engine, revision: str) -> None:
        with engine.connect() as conn:
            config = _migrate._config()
            config.attributes["connection"] = conn
            alembic.command.upgrade(config, revision)
            conn.commit()

    def test_a_round_in_flight_survives_the_upgrade_and_old_statements_keep_working(
        self, db_engine, manual_clock
    ):
        from datetime import timedelta

        t0 = manual_clock.now()
        expires = _upgraded_under_a_round(db_engine, "0001", t0, holder="old-replica")
        new = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        new.ensure(["new-job"], specs={"new-job": "0 * * * * *"})
        assert lease.current_revision(db_engine) == HEAD

        row = new.read(["old-job"])["old-job"]
        assert (row.instant, row.state, row.token, row.holder, row.expires_ms) == (
            t0,
            lease.LeaseState.RUNNING,
            42,
            "old-replica",
            expires,
        )
        assert (row.spec, row.last_outcome, row.failures) == (None, None, 0)

        # Release 0001 ends its round and claims the next instant, naming old columns only.
        manual_clock.advance(3)
        now_ms = int(manual_clock.now().timestamp() * 1000)
        mine = sa.and_(_OLD.c.name == "old-job", _OLD.c.token == 42)
        with db_engine.begin() as conn:
            done = conn.execute(
                _OLD.update()
                .where(mine, _OLD.c.state == "running")
                .values(state="done", expires_ms=None, skipped_through=now_ms // 1000)
            )
            assert done.rowcount == 1
            later = int((t0 + timedelta(minutes=1)).timestamp())
            conn.execute(
                _OLD.update()
                .where(_OLD.c.name == "old-job", _OLD.c.instant < later)
                .values(instant=later, attempt=1, state="running", token=7, holder="old-replica")
            )
            assert conn.execute(sa.select(_OLD).where(_OLD.c.name == "new-job")).one()

        # Beside it, the new release runs its own job and puts the end on record.
        [claim] = new.claim(["new-job"], t0 + timedelta(minutes=1), "new-replica")
        record = lease.RoundRow(
            name="new-job",
            instant=claim.instant,
            attempt=1,
            holder="new-replica",
            why="schedule",
            started=manual_clock.now(),
            ended=manual_clock.now(),
            outcome="succeeded",
        )
        assert new.finish("new-job", claim.token, ended=manual_clock.now(), record=record)
        rows = new.read(["old-job", "new-job"])
        assert rows["old-job"].instant == t0 + timedelta(minutes=1)
        assert rows["new-job"].last_outcome == "succeeded"
        assert [r.name for r in new.rounds("new-job", limit=5)] == ["new-job"]


class TestUpgradeTo0003:
    """Revision 0003 only adds the pause's nullable columns: a round in flight survives the
    upgrade, and release 0002's claim (which never names them) keeps claiming beside it."""

    def test_a_round_in_flight_survives_and_a_release_0002_claim_ignores_the_pause(
        self, db_engine, manual_clock
    ):
        from datetime import timedelta

        TestUpgradeTo0002.upgrade_to(db_engine, "0002")
        t0 = manual_clock.now()
        _old_job_running(  # release 0002 made the rows and runs a round
            db_engine, instant=int(t0.timestamp()), state="running", token=42, holder="old"
        )
        lease.migrate(db_engine)  # the new release starts: 0002 -> 0003, live
        assert lease.current_revision(db_engine) == HEAD
        new = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        row = new.read(["old-job"])["old-job"]
        assert (row.state, row.token, row.holder, row.paused) == (
            lease.LeaseState.RUNNING,
            42,
            "old",
            None,
        )
        assert new.set_paused(["new-job"], paused=True, by="ops") == ["new-job"]
        later = t0 + timedelta(minutes=1)
        assert new.claim(["new-job"], later, "new-replica") == []  # this release obeys it
        with db_engine.begin() as conn:  # release 0002's claim names old columns only
            claimed = conn.execute(
                _OLD.update()
                .where(_OLD.c.name == "new-job", _OLD.c.instant < int(later.timestamp()))
                .values(instant=int(later.timestamp()), state="running", token=7)
            )
            assert claimed.rowcount == 1


class TestLog:
    """One INFO line of ours per start; alembic's own lines are DEBUG records."""

    @staticmethod
    def start(url: str) -> None:
        from datetime import UTC, datetime

        import cronjob
        from cronjob.testing import FakeClock

        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "tick")
        clock = FakeClock(datetime(2026, 3, 2, 9, tzinfo=UTC))
        with cronjob.Scheduler(url, registry=registry, clock=clock, replica_id="a"):
            pass

    @staticmethod
    def ours(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
        """The records the migration logs itself, with their level."""
        return [
            (r.levelname, r.getMessage())
            for r in caplog.records
            if r.name == "lease" and Path(r.pathname).name == "_migrate.py"
        ]

    @staticmethod
    def alembic(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name.split(".")[0] == "alembic" and r.levelno == level
        ]

    def test_a_fresh_start_and_a_later_one_log_one_line_each(self, db_url, caplog):
        import logging

        head = lease.head_revision()  # a new revision moves it: never written here
        caplog.set_level(logging.DEBUG)
        self.start(db_url)
        assert self.ours(caplog) == [("INFO", f"lease schema created at {head}")]
        assert self.alembic(caplog, logging.INFO) == []
        # Lowered, not lost: alembic's lines are there at DEBUG.
        # (A blank database is created at head and stamped: tests/test_migrations_created.py.)
        assert f"new branch insert {head}" in self.alembic(caplog, logging.DEBUG)
        caplog.clear()
        self.start(db_url)
        assert self.ours(caplog) == [("INFO", f"lease schema at {head}")]
        assert [r for r in caplog.records if r.name.startswith("alembic") and r.levelno >= 20] == []

    def test_an_upgrade_names_the_revision_it_came_from(self, db_engine, caplog):
        import logging

        TestUpgradeTo0002.upgrade_to(db_engine, "0002")
        caplog.clear()
        caplog.set_level(logging.INFO)
        lease.migrate(db_engine)
        head = lease.head_revision()
        assert self.ours(caplog) == [("INFO", f"lease schema at {head}, upgraded from 0002")]
        assert self.alembic(caplog, logging.INFO) == []

    def test_at_info_a_process_logs_nothing_of_alembic_not_even_at_import(self, tmp_path):
        """A fresh process, logging at INFO before it imports the package: alembic logs
        as it is imported, and as it migrates."""
        script = (
            "import logging, sys\n"
            "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s %(message)s')\n"
            "import lease\n"
            "engine = lease.create_engine(sys.argv[1])\n"
            "lease.migrate(engine)\n"
            "lease.migrate(engine)\n"
            "engine.dispose()\n"
        )
        url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
        done = subprocess.run(
            [sys.executable, "-c", script, url], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        head = lease.head_revision()
        assert done.stderr.splitlines() == [
            f"INFO lease lease schema created at {head}",
            f"INFO lease lease schema at {head}",
        ]

    def test_another_threads_alembic_records_keep_their_level(self, caplog):
        """An application migrating its own tables on another thread meanwhile: its
        alembic lines are left as they are."""
        import logging
        import threading

        from lease._alembic_log import alembic_at_debug

        caplog.set_level(logging.DEBUG)
        log = logging.getLogger("alembic.runtime.migration")
        inside, other_done = threading.Event(), threading.Event()

        def other() -> None:
            inside.wait(10)
            log.info("the application's own upgrade")
            other_done.set()

        thread = threading.Thread(target=other)
        thread.start()
        with alembic_at_debug():
            inside.set()
            assert other_done.wait(10)
            log.info("ours")
        log.info("after")
        thread.join()
        assert [(r.getMessage(), r.levelname) for r in caplog.records] == [
            ("the application's own upgrade", "INFO"),
            ("ours", "DEBUG"),
            ("after", "INFO"),
        ]


class TestUpgradeTo0005:
    """Revision 0005 only adds ``deployed_ms``: a round in flight survives the upgrade, a
    replica of release 0004 (whose insert never names the column) keeps making rows beside
    this release, and those rows' deployment is unknown until this release registers them."""

    def test_a_round_in_flight_survives_and_rows_of_release_0004_are_filled_by_ensure(
        self, db_engine, manual_clock
    ):
        TestUpgradeTo0002.upgrade_to(db_engine, "0004")
        t0 = manual_clock.now()
        with db_engine.begin() as conn:  # release 0004 made a row and runs a round under it
            conn.execute(
                _OLD.insert().values(
                    name="old-job",
                    instant=int(t0.timestamp()),
                    attempt=1,
                    state="running",
                    token=42,
                    holder="old",
                    expires_ms=int(t0.timestamp() * 1000) + 15_000,
                )
            )
        lease.migrate(db_engine)  # the new release starts: 0004 -> 0005, live
        assert lease.current_revision(db_engine) == HEAD
        with db_engine.begin() as conn:  # release 0004 registers a job beside it
            conn.execute(
                _OLD.insert().values(
                    name="old-new-job", instant=-1, attempt=1, state="new", token=0
                )
            )
        new = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        rows = new.read(["old-job", "old-new-job"])
        assert (rows["old-job"].state, rows["old-job"].token, rows["old-job"].holder) == (
            lease.LeaseState.RUNNING,
            42,
            "old",
        )
        assert [rows[n].deployed for n in ("old-job", "old-new-job")] == [None, None]
        manual_clock.advance(30)
        new.ensure(["old-new-job", "new-job"])
        rows = new.read(["old-job", "old-new-job", "new-job"])
        later = manual_clock.now()
        assert [rows[n].deployed for n in ("old-job", "old-new-job", "new-job")] == [
            None,  # not registered by this release yet
            later,
            later,
        ]
        assert rows["old-job"].token == 42


class TestUpgradeTo0006:
    """Revision 0006 only adds ``due_s`` and its index: a round in flight survives the
    upgrade, a replica of release 0005 (whose claim never names the column) keeps claiming
    beside this release, and a row it leaves NULL is never found by ``unclaimed`` until
    this release registers or claims it."""

    def test_a_round_in_flight_survives_and_old_claims_work_beside_the_due_column(
        self, db_engine, manual_clock
    ):
        from datetime import timedelta

        t0 = manual_clock.now()
        expires = _upgraded_under_a_round(db_engine, "0005", t0, holder="old")
        assert lease.current_revision(db_engine) == HEAD
        new = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        row = new.read(["old-job"])["old-job"]
        assert (row.state, row.token, row.holder, row.expires_ms, row.due) == (
            lease.LeaseState.RUNNING,
            42,
            "old",
            expires,
            None,
        )
        later = t0 + timedelta(minutes=1)
        # Rows of the old release, never registered by this one: never found.
        manual_clock.advance(60)
        assert new.unclaimed(later) == []

        # The old release ends its round and claims the next instant, naming old columns.
        with db_engine.begin() as conn:
            mine = sa.and_(_OLD.c.name == "old-job", _OLD.c.token == 42)
            conn.execute(
                _OLD.update().where(mine).values(state="done", expires_ms=None, skipped_through=1)
            )
            claimed = conn.execute(
                _OLD.update()
                .where(_OLD.c.name == "old-job", _OLD.c.instant < int(later.timestamp()))
                .values(instant=int(later.timestamp()), state="running", token=7, holder="old")
            )
            assert claimed.rowcount == 1
        # Beside it, this release registers new-job and claims it, writing the column.
        new.ensure(["new-job"], due={"new-job": later})
        assert new.unclaimed(later) == ["new-job"]
        batch = new.claim_batch(
            ["new-job"], later, "new", due={"new-job": later + timedelta(minutes=1)}
        )
        assert batch.names == ("new-job",)
        rows = new.read(["old-job", "new-job"])
        assert (rows["old-job"].instant, rows["old-job"].token, rows["old-job"].due) == (
            later,
            7,
            None,
        )
        assert rows["new-job"].due == later + timedelta(minutes=1)
        assert new.unclaimed(later) == []


class TestUpgradeTo0007:
    """Revision 0007 widens a replica's list of jobs on MariaDB/MySQL (a TEXT there holds
    64 KiB, about 1,300 jobs): a replica registering 10,000 jobs is on record everywhere,
    and a replica's row written before the upgrade is read as it was."""

    @staticmethod
    def replica(jobs: int, now: datetime) -> lease.ReplicaRow:
        return replica_row(now, jobs)

    def test_a_replica_of_ten_thousand_jobs_is_on_record_after_the_upgrade(
        self, db_engine, manual_clock
    ):
        TestUpgradeTo0002.upgrade_to(db_engine, "0006")
        store = lease.LeaseStore(db_engine, clock=manual_clock.now)
        store.record_replica(self.replica(10, manual_clock.now()))  # release 0006's row
        lease.migrate(db_engine)
        assert lease.current_revision(db_engine) == HEAD
        since = int(manual_clock.now().timestamp() * 1000)
        [before] = store.replicas(seen_since_ms=since)
        assert len(before.jobs) == 10
        big = self.replica(10_000, manual_clock.now())
        store.survey(["job-00000"], replica=big)
        [after] = store.replicas(seen_since_ms=since)
        assert after.jobs == big.jobs


class TestUpgradeTo0008:
    """Revision 0008 adds the schedules' tables and touches no existing row: a round in
    flight under release 0007 ends on record after the live upgrade, and schedules can be
    added beside it at once."""

    def test_a_round_in_flight_ends_on_record_and_schedules_come_beside_it(
        self, db_engine, manual_clock
    ):
        from cronjob import schedules

        t0 = manual_clock.now()
        _upgraded_under_a_round(db_engine, "0007", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == HEAD
        schedules.add(db_engine, "report:1", task="report", spec="0 * * * * *")
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        rows = store.read(["old-job", "report:1"])
        assert rows["old-job"].state is lease.LeaseState.DONE
        assert rows["report:1"].instant is None  # a schedule's row, never claimed yet
        with db_engine.connect() as conn:
            [row] = lease.read_schedules(conn)
        assert (row.id, row.task, row.rev) == ("report:1", "report", 1)


class TestUpgradeTo0009:
    """Revision 0009 adds two indexes and changes no row: a round in flight under release
    0008 is seen by the survey after the live upgrade (now through the index of
    unfinished rounds) and ends on record, and its holder is read by the instant's index."""

    def test_a_round_in_flight_is_surveyed_and_ends_on_record_after_the_upgrade(
        self, db_engine, manual_clock
    ):
        t0 = manual_clock.now()
        expires = _upgraded_under_a_round(db_engine, "0008", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == HEAD
        indexes = {ix["name"] for ix in sa.inspect(db_engine).get_indexes("cronjob_lease")}
        assert {"ix_cronjob_lease_unfinished", "ix_cronjob_lease_instant"} <= indexes
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        assert store.holders(t0) == {"old-replica": t0.replace(microsecond=0)}
        held = store.survey(["old-job"])
        assert held.cut_short == []
        assert held.next_expiry is not None
        assert int(held.next_expiry.timestamp() * 1000) == expires
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        assert store.read(["old-job"])["old-job"].state is lease.LeaseState.DONE
        assert store.survey(["old-job"]).next_expiry is None


class TestUpgradeTo0010:
    """Revision 0010 adds the outbox and the once-table and touches no existing row: a
    round in flight under release 0009 ends on record after the live upgrade, and the
    outbox takes a publication beside it at once."""

    def test_a_round_in_flight_ends_on_record_and_the_outbox_works_beside_it(
        self, db_engine, manual_clock
    ):
        t0 = manual_clock.now()
        _upgraded_under_a_round(db_engine, "0009", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == HEAD
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        assert store.read(["old-job"])["old-job"].state is lease.LeaseState.DONE
        with db_engine.begin() as conn:
            _row, new = lease.record_publication(
                conn,
                id="occurrence",
                name="old-job",
                instant=t0,
                target="rq",
                payload={},
                now_ms=0,
                hold_ms=0,
            )
            assert new
            assert lease.outbox_summary(conn).unsent == 1
        token, state = lease.begin_once(
            db_engine, "occurrence", task="t", holder="w", now_ms=0, stale_ms=1
        )
        assert token is not None and state == lease.ONCE_RUNNING


class TestUpgradeTo0011:
    """Revision 0011 adds one nullable column to the schedules and touches no existing
    row: a round in flight under release 0010 ends on record after the live upgrade, a
    schedule 0010 wrote keeps its task's policies (format 1), 0010's own statements on
    the table keep working, and a schedule with policies of its own comes beside them."""

    #: How release 0010 writes and reads a schedule: its columns only.
    INSERT_0010 = (
        "INSERT INTO cronjob_schedule (id, task, spec, at_s, args, start_s, end_s, rev, "
        "removed, format, created_ms, updated_ms) VALUES "
        "(:id, 'report', '0 * * * * *', NULL, '{}', NULL, NULL, 1, 0, 1, 0, 0)"
    )
    SELECT_0010 = (
        "SELECT id, task, spec, at_s, args, start_s, end_s, rev, removed, format, "
        "created_ms, updated_ms FROM cronjob_schedule ORDER BY id"
    )

    def test_a_round_in_flight_and_a_schedule_of_0010_survive_and_policies_come_beside(
        self, db_engine, manual_clock
    ):
        from cronjob import schedules

        t0 = manual_clock.now()
        TestUpgradeTo0002.upgrade_to(db_engine, "0010")
        with db_engine.begin() as conn:
            conn.execute(sa.text(self.INSERT_0010), {"id": "report:old"})
        _upgraded_under_a_round(db_engine, "0010", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == HEAD
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        assert store.read(["old-job"])["old-job"].state is lease.LeaseState.DONE
        old = schedules.get(db_engine, "report:old")
        assert old is not None and (old.spec, old.jitter, old.overlap) == (
            "0 * * * * *",
            None,
            None,
        )
        schedules.add(db_engine, "report:new", task="report", spec="0 * * * * *", jitter=5)
        # Release 0010 beside: its insert and its read still work, and it reads the
        # format that tells it to leave the policied row alone.
        with db_engine.begin() as conn:
            conn.execute(sa.text(self.INSERT_0010), {"id": "report:z"})
            seen = {row.id: row.format for row in conn.execute(sa.text(self.SELECT_0010))}
            [stored] = lease.read_schedules(conn, ids=["report:z"])
        assert seen == {"report:new": 2, "report:old": 1, "report:z": 1}
        assert stored.policies is None


class TestUpgradeTo0012:
    """Revision 0012 adds an index on (holder, instant) and changes no row: a round in
    flight under release 0011 ends on record after the live upgrade, and its holder is
    found by the probe the peers make."""

    def test_a_round_in_flight_is_probed_by_its_holder_and_ends_on_record(
        self, db_engine, manual_clock
    ):
        t0 = manual_clock.now()
        _upgraded_under_a_round(db_engine, "0011", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == HEAD
        indexes = {ix["name"] for ix in sa.inspect(db_engine).get_indexes("cronjob_lease")}
        assert "ix_cronjob_lease_holder_instant" in indexes
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        assert store.holders(t0, among=["old-replica", "other"]) == {
            "old-replica": t0.replace(microsecond=0)
        }
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        assert store.read(["old-job"])["old-job"].state is lease.LeaseState.DONE


class TestUpgradeTo0014:
    """Revision 0014 adds ``spec_ms`` to the lease table and rewrites no row: a round in
    flight under release 0012 ends on record after the live upgrade, its row with no
    change of timing on record; a new spec deployed then is."""

    def test_a_round_in_flight_ends_on_record_and_a_new_spec_is_stamped(
        self, db_engine, manual_clock
    ):
        t0 = manual_clock.now()
        _upgraded_under_a_round(db_engine, "0012", t0, holder="old-replica")
        assert lease.current_revision(db_engine) == HEAD
        columns = {c["name"] for c in sa.inspect(db_engine).get_columns("cronjob_lease")}
        assert "spec_ms" in columns
        store = lease.LeaseStore(db_engine, clock=manual_clock.now, claim_ahead=None)
        assert store.read(["old-job"])["old-job"].spec_changed is None
        manual_clock.advance(5)
        assert store.finish("old-job", 42, ended=manual_clock.now())
        store.ensure(["old-job"], specs={"old-job": "0 0 * * * *"})
        assert store.read(["old-job"])["old-job"].spec_changed is None, "no spec before"
        manual_clock.advance(5)
        store.ensure(["old-job"], specs={"old-job": "0 */5 * * * *"})
        row = store.read(["old-job"])["old-job"]
        assert (row.state, row.spec_changed) == (lease.LeaseState.DONE, manual_clock.now())
