"""`cronjob.contrib.django.schedules` on a real Django project (tests/django_project):
its tests (``schedules_tests``) run under Django's test runner on its test database,
SQLite and PostgreSQL, in a process of their own (Django's settings are per process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import POSTGRES_URL, _reachable
from tests.test_django import django

#: The tests of tests/django_project/schedules_tests.py.
TESTS = 10


def test_on_sqlite(tmp_path):
    done = django("test", "schedules_tests", "-v", "2", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"Ran {TESTS} tests" in done.stderr
    assert "OK (skipped=1)" in done.stderr  # the PostgreSQL test, and only it


@pytest.mark.postgres
def test_on_postgresql(tmp_path):
    _reachable(POSTGRES_URL, "PostgreSQL")
    done = django("test", "schedules_tests", "-v", "2", tmp_path=tmp_path, db="postgres")
    assert done.returncode == 0, done.stderr
    assert f"Ran {TESTS} tests" in done.stderr
    assert "OK (skipped=1)" in done.stderr  # the SQLite test, and only it


def test_importing_it_imports_no_django_until_a_call():
    code = (
        "import sys, cronjob.contrib.django.schedules as s, cronjob.schedules; "
        "assert 'django' not in sys.modules, sorted(m for m in sys.modules if 'django' in m)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
