"""The admin of schedules (`cronjob.contrib.django.admin`) on a real Django project
(tests/django_project with ``admin_settings``): its tests (``admin_tests``) run under
Django's test runner on SQLite, PostgreSQL and MariaDB, in a process of their own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._process import run_python
from tests.conftest import MYSQL_URL, POSTGRES_URL, _reachable
from tests.test_django import PROJECT, django_env

#: The tests of tests/django_project/admin_tests.py.
TESTS = 13


def run_admin_tests(tmp_path, db):
    env = {**django_env(tmp_path, db), "DJANGO_SETTINGS_MODULE": "admin_settings"}
    return run_python(
        "-m", "django", "test", "admin_tests", "-v", "2", cwd=tmp_path, env=env, timeout=300
    )


def test_on_sqlite(tmp_path):
    done = run_admin_tests(tmp_path, "sqlite")
    assert done.returncode == 0, done.stderr
    assert f"Ran {TESTS} tests" in done.stderr


@pytest.mark.postgres
def test_on_postgresql(tmp_path):
    _reachable(POSTGRES_URL, "PostgreSQL")
    done = run_admin_tests(tmp_path, "postgres")
    assert done.returncode == 0, done.stderr
    assert f"Ran {TESTS} tests" in done.stderr


@pytest.mark.mysql
def test_on_mariadb(tmp_path):
    _reachable(MYSQL_URL, "MariaDB/MySQL")
    done = run_admin_tests(tmp_path, "mysql")
    assert done.returncode == 0, done.stderr
    assert f"Ran {TESTS} tests" in done.stderr


def test_the_projects_migrations_match_its_models(tmp_path):
    """The unmanaged model's migration is shipped: ``makemigrations --check`` finds none
    to make (a project's own check would fail otherwise)."""
    env = {**django_env(tmp_path), "DJANGO_SETTINGS_MODULE": "admin_settings"}
    done = run_python(
        "-m", "django", "makemigrations", "cronjob", "--check", "--dry-run", cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_installing_the_app_without_the_admin_imports_no_admin(tmp_path):
    code = (
        "import sys, django; django.setup(); "
        "assert 'cronjob.contrib.django.admin' not in sys.modules; "
        "assert 'django.contrib.admin' not in sys.modules"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=django_env(tmp_path),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert PROJECT.exists()
