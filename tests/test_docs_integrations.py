"""Each integration page (docs/integrations/) runs with exactly the extras it names.

The page's ``pip install 'cronjob-lease[...]'`` line is read from the page itself; the
wheel is installed with those extras (and the framework the page imports, when it is not
an extra) into a fresh virtualenv, as scripts/wheel_smoke.py does (its helpers build the
wheel, the venvs and the scratch databases), and the page's example runs there against
PostgreSQL. One wheel and one venv per set of extras, built once per session (per xdist
worker: ``xdist_group`` keeps the module's tests together under ``--dist loadgroup``).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from tests.conftest import POSTGRES_URL, _reachable
from tests.test_docs_examples import examples

REPO = Path(__file__).resolve().parents[1]
PAGES = REPO / "docs" / "integrations"
INSTALL = re.compile(r"^pip install 'cronjob-lease\[([a-z,-]+)\]'", re.M)

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.xdist_group("wheel")]


def load_wheel_smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wheel_smoke", REPO / "scripts/wheel_smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


smoke = load_wheel_smoke()


def named_extras(page: str) -> str:
    """The extras the page tells the reader to install (its first ``pip install`` line)."""
    found = INSTALL.search((PAGES / page).read_text())
    assert found, f"{page} names no 'pip install cronjob-lease[...]'"
    return found.group(1)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = smoke.build_wheel(tmp_path_factory.mktemp("wheel"))
    return path


@pytest.fixture(scope="session")
def venv_with(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``venv_with(extras, *others)``: the wheel with ``extras`` and ``others`` in a fresh
    venv, one per distinct set for the whole session."""
    made: dict[tuple[str, ...], Path] = {}

    def venv(extras: str, *others: str) -> Path:
        key = (extras, *others)
        if key not in made:
            where = tmp_path_factory.mktemp("venv") / "-".join(key).replace(",", "+")
            made[key] = smoke.install_wheel(wheel, where, extras, *others)
        return made[key]

    return venv


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[str]:
    """A new database of its own on the suite's PostgreSQL server, dropped afterwards."""
    _reachable(POSTGRES_URL, "PostgreSQL")
    with smoke.scratch_database("postgres", tmp_path) as url:
        yield url


def test_each_integration_page_names_its_extras():
    assert named_extras("fastapi.md") == "postgres-async"
    assert named_extras("flask.md") == "flask,postgres"
    assert named_extras("django.md") == "django,postgres"


def test_the_fastapi_example_runs_on_postgresql_with_the_extra_the_page_names(
    venv_with, postgres, tmp_path
):
    """The async job's ``ctx.transaction_async()`` needs the async extra: psycopg's async
    mode and greenlet. FastAPI, and httpx for its test client, are the application's."""
    venv = venv_with(named_extras("fastapi.md"), "fastapi", "httpx")
    [(code, expected)] = examples(PAGES / "fastapi.md")
    code, swapped = re.subn(r"^url = .*$", f"url = {postgres!r}", code, flags=re.M)
    assert swapped == 1
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


def test_the_flask_example_runs_its_scheduler_on_postgresql_with_the_extras_the_page_names(
    venv_with, postgres, tmp_path
):
    """The page's app module, its database swapped for a scratch one, under the page's
    ``flask --app myapp cronjob run``: the per-second smoke job runs, SIGTERM drains."""
    page = (PAGES / "flask.md").read_text()
    assert "flask --app myapp cronjob run" in page
    venv = venv_with(named_extras("flask.md"))
    [(code, _)] = examples(PAGES / "flask.md")
    code, swapped = re.subn(r'"postgresql\+psycopg://app@db/app"', repr(postgres), code)
    assert swapped == 1
    (tmp_path / "myapp.py").write_text(code)
    (tmp_path / "smoke_jobs.py").write_text(smoke.JOBS)
    flask = str(venv / "bin" / "flask")
    smoke.run("flask", [flask, "--app", "myapp", "cronjob", "run", "smoke_jobs"], tmp_path)


def test_the_django_example_project_runs_on_postgresql_with_the_extras_the_page_names(
    venv_with, postgres, tmp_path
):
    """The page's project (examples/django_project), its ``DATABASES`` on a scratch
    PostgreSQL database: Django migrates, the page's commands run, the scheduler runs."""
    venv = venv_with(named_extras("django.md"))
    python = str(venv / "bin" / "python")
    project = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "django_project", project)
    url = sa.make_url(postgres)
    settings = project / "mysite" / "settings.py"
    settings.write_text(
        settings.read_text()
        + textwrap.dedent(
            f"""
            DATABASES["default"] = {{
                "ENGINE": "django.db.backends.postgresql",
                "NAME": {url.database!r},
                "USER": {url.username!r},
                "PASSWORD": {url.password or ""!r},
                "HOST": {url.host!r},
                "PORT": {str(url.port or "")!r},
            }}
            """
        )
    )

    def manage(*args: str) -> str:
        done = subprocess.run(
            [python, "manage.py", *args], cwd=project, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    manage("migrate", "--no-input")
    page = (PAGES / "django.md").read_text()
    assert "python manage.py cronjob next '0 0 3 * * *' -n 3" in page
    instants = manage("cronjob", "next", "0 0 3 * * *", "-n", "3").splitlines()[1:]
    assert len(instants) == 3 and all(i.endswith("T03:00:00+00:00") for i in instants)
    (project / "smoke_jobs.py").write_text(smoke.JOBS)
    smoke.run("django", [python, "manage.py", "cronjob", "run", "smoke_jobs"], project)
