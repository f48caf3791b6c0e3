"""cronjob.contrib.django against a real Django project (tests/django_project).

Django's settings are configured once per process, so the project runs in processes of
its own: Django's test runner on its test database (SQLite, PostgreSQL) for the fenced
ORM transactions (tests/django_project/ledger/tests.py), and ``python -m django cronjob``
for the command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from django.core.exceptions import ImproperlyConfigured

import lease
from cronjob.contrib.django._database import url_from_settings
from tests._process import lease_names, run_python, run_until_started
from tests.conftest import POSTGRES_URL, _reachable

PROJECT = Path(__file__).resolve().parent / "django_project"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django_project"


def django(*args: str, tmp_path: Path, db: str = "sqlite", apps: str = "", timeout: float = 120):
    return run_python(
        "-m", "django", *args, cwd=tmp_path, env=django_env(tmp_path, db, apps), timeout=timeout
    )


def django_env(tmp_path: Path, db: str = "sqlite", apps: str = "") -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "settings",
        "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]),
        "CRONJOB_TEST_DJANGO_DB": db,
        "CRONJOB_TEST_DJANGO_DIR": str(tmp_path),
        "CRONJOB_TEST_DJANGO_APPS": apps,
    }


class TestOnDjangosTestDatabase:
    def test_fenced_orm_transactions_on_sqlite(self, tmp_path):
        done = django("test", "ledger", tmp_path=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Ran 8 tests" in done.stderr

    @pytest.mark.postgres
    def test_fenced_orm_transactions_on_postgresql(self, tmp_path):
        _reachable(POSTGRES_URL, "PostgreSQL")
        done = django("test", "ledger", tmp_path=tmp_path, db="postgres")
        assert done.returncode == 0, done.stderr
        assert "Ran 8 tests" in done.stderr
        assert "skipped" not in done.stderr  # the check before commit ran too


class TestCommand:
    def test_next_runs_through_manage_py(self, tmp_path):
        done = django(
            "cronjob",
            "next",
            "@daily",
            "-n",
            "1",
            "--after",
            "2026-03-02T08:00:00Z",
            tmp_path=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[1] == "  2026-03-03T00:00:00+00:00"

    def test_run_needs_no_module_and_uses_djangos_database(self, tmp_path):
        status, log = run_until_started(
            [sys.executable, "-m", "django", "cronjob", "run"],
            cwd=tmp_path,
            env=django_env(tmp_path),
        )
        assert status == 0, log
        assert "1 leased job(s)" in log  # ledger-hourly, from ledger/cronjobs.py
        assert "SIGTERM received: draining" in log
        assert lease_names(tmp_path / "app.sqlite") == ["ledger-hourly"]
        assert not (tmp_path / "cronjob.sqlite").exists()

    def test_a_database_url_given_on_the_command_line_wins(self, tmp_path):
        other = tmp_path / "other.sqlite"
        status, log = run_until_started(
            [
                sys.executable,
                "-m",
                "django",
                "cronjob",
                "run",
                "--database-url",
                f"sqlite:///{other}",
            ],
            cwd=tmp_path,
            env=django_env(tmp_path),
        )
        assert status == 0, log
        assert other.exists() and not (tmp_path / "app.sqlite").exists()

    def test_a_job_module_that_raises_fails_the_start_naming_app_and_job(self, tmp_path):
        done = django("cronjob", "run", tmp_path=tmp_path, apps="broken")
        assert done.returncode != 0
        assert done.stderr.strip().splitlines()[-1] == (
            "django.core.exceptions.ImproperlyConfigured: cronjob: app 'broken': importing "
            "'broken.cronjobs' failed: ScheduleError: job 'feb-30': '0 0 0 30 2 *' never "
            "fires: day-of-month 30 never occurs in February"
        )


class TestDatabaseUrl:
    def test_postgresql_settings_become_a_psycopg_url(self):
        config = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "app",
            "USER": "app",
            "PASSWORD": "s3cret/@",
            "HOST": "db.internal",
            "PORT": "5433",
            "OPTIONS": {"sslmode": "require", "isolation_level": 2},
        }
        url = sa.make_url(url_from_settings(config, "postgresql", "default"))
        assert url.drivername == "postgresql+psycopg"
        assert url.password == "s3cret/@"
        assert (url.host, url.port, url.database) == ("db.internal", 5433, "app")
        assert dict(url.query) == {"sslmode": "require"}  # Django's own option left out

    def test_disabled_server_side_cursors_say_a_transaction_pooler_is_in_between(self):
        """Django's setting for PgBouncer in transaction mode becomes ``pooler``."""
        config = {"NAME": "app", "HOST": "pgbouncer", "DISABLE_SERVER_SIDE_CURSORS": True}
        url = url_from_settings(config, "postgresql", "default")
        assert url == "postgresql+psycopg://pgbouncer/app?pooler=transaction"
        assert lease.behind_transaction_pooler(url)

    def test_a_unix_socket_is_the_host_query_parameter(self):
        config = {"NAME": "app", "HOST": "/var/run/postgresql", "USER": "app"}
        url = url_from_settings(config, "postgresql", "default")
        assert url == "postgresql+psycopg://app@/app?host=%2Fvar%2Frun%2Fpostgresql"

    def test_mysql_settings_become_a_pymysql_url(self):
        config = {
            "NAME": "app",
            "USER": "root",
            "HOST": "127.0.0.1",
            "PORT": 3306,
            "OPTIONS": {"charset": "utf8mb4", "init_command": "SET x=1"},
        }
        url = url_from_settings(config, "mysql", "default")
        assert url == "mysql+pymysql://root@127.0.0.1:3306/app?charset=utf8mb4"

    def test_sqlite_settings_become_a_file_url(self):
        url = url_from_settings({"NAME": "/srv/app/db.sqlite3"}, "sqlite", "default")
        assert url == "sqlite:////srv/app/db.sqlite3"

    @pytest.mark.parametrize(
        ("config", "vendor", "message"),
        [
            (
                {"ENGINE": "django.db.backends.oracle", "NAME": "app"},
                "oracle",
                "cronjob: DATABASES['default'] uses 'django.db.backends.oracle', a backend "
                "the lease table cannot live in (PostgreSQL, MariaDB/MySQL and SQLite can); "
                "set CRONJOB_DATABASE to a primary's alias or CRONJOB_DATABASE_URL to a URL",
            ),
            (
                {"NAME": "app", "PASSWORD": "s3cret", "TEST": {"MIRROR": "primary"}},
                "postgresql",
                "cronjob: DATABASES['default'] is a read replica of 'primary': the lease "
                "table is written on every claim and needs a primary; set CRONJOB_DATABASE "
                "to a primary's alias or CRONJOB_DATABASE_URL to a URL",
            ),
            (
                {"NAME": ":memory:"},
                "sqlite",
                "cronjob: DATABASES['default'] is an in-memory SQLite database, which no "
                "other connection can share; name a file, or set CRONJOB_DATABASE to a "
                "primary's alias or CRONJOB_DATABASE_URL to a URL",
            ),
        ],
        ids=["unsupported backend", "read replica", "in memory"],
    )
    def test_a_database_the_lease_table_cannot_live_in_is_one_line(self, config, vendor, message):
        with pytest.raises(ImproperlyConfigured) as caught:
            url_from_settings(config, vendor, "default")
        assert str(caught.value) == message
        assert "s3cret" not in str(caught.value)

    def test_the_command_says_it_in_one_line_with_status_2(self, tmp_path):
        (tmp_path / "replica_settings.py").write_text(
            "from settings import *\n"
            "DATABASES['default']['TEST'] = {'MIRROR': 'primary'}\n"
            "DATABASES['primary'] = dict(DATABASES['default'], TEST={})\n"
        )
        env = {**django_env(tmp_path), "DJANGO_SETTINGS_MODULE": "replica_settings"}
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
        done = subprocess.run(
            [sys.executable, "-m", "django", "cronjob", "run"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [
            "CommandError: cronjob: DATABASES['default'] is a read replica of 'primary': the "
            "lease table is written on every claim and needs a primary; set CRONJOB_DATABASE "
            "to a primary's alias or CRONJOB_DATABASE_URL to a URL"
        ]


class TestExampleProject:
    def test_it_migrates_and_runs_its_scheduler_on_its_database(self, tmp_path):
        database = tmp_path / "db.sqlite3"
        env = {"EXAMPLE_DB": str(database)}
        manage = [sys.executable, str(EXAMPLE / "manage.py")]
        for check in (["makemigrations", "--check", "--dry-run"], ["migrate", "-v", "0"]):
            done = subprocess.run(
                [*manage, *check],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=tmp_path,
                env={**os.environ, **env},
            )
            assert done.returncode == 0, done.stderr
        status, log = run_until_started([*manage, "cronjob", "run"], cwd=tmp_path, env=env)
        assert status == 0, log
        assert lease_names(database) == ["close-stale-orders"]
