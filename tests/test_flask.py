"""cronjob.contrib.flask with a real Flask application and Flask's CLI runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from flask import Flask

from cronjob.contrib.flask import Cronjob
from tests._process import lease_names, run_until_started

REPO = Path(__file__).resolve().parents[1]


def make_app(**config) -> Flask:
    app = Flask("test_app")
    app.config.update(config)
    Cronjob(app)
    return app


class TestCommand:
    def test_flask_cronjob_next_is_the_cronjob_command(self):
        result = (
            make_app()
            .test_cli_runner()
            .invoke(
                args=["cronjob", "next", "@daily", "-n", "1", "--after", "2026-03-02T08:00:00Z"]
            )
        )
        assert result.exit_code == 0, result.output
        assert result.output.splitlines()[1] == "  2026-03-03T00:00:00+00:00"

    def test_its_help_is_the_cronjob_commands_under_its_own_name(self):
        result = make_app().test_cli_runner().invoke(args=["cronjob", "run", "--help"])
        assert result.exit_code == 0
        assert result.output.startswith("usage: flask cronjob run [-h] [--database-url URL]")

    def test_bad_input_exits_2(self):
        result = make_app().test_cli_runner().invoke(args=["cronjob", "next", "0 * * * *"])
        assert result.exit_code == 2

    def test_run_uses_the_configured_database_and_needs_no_module(self, tmp_path):
        database = tmp_path / "app.sqlite"
        status, log = run_until_started(
            [sys.executable, "-m", "flask", "--app", "examples.flask_app", "cronjob", "run"],
            cwd=tmp_path,
            env={"PYTHONPATH": str(REPO), "FLASK_CRONJOB_DATABASE_URL": f"sqlite:///{database}"},
        )
        assert status == 0, log
        assert "1 leased job(s)" in log
        assert lease_names(database) == ["flask-digest"]


class TestConfiguration:
    def test_the_url_is_cronjobs_own_key_first(self):
        app = make_app(CRONJOB_DATABASE_URL="sqlite:///a.sqlite", SQLALCHEMY_DATABASE_URI="x")
        assert app.extensions["cronjob"].database_url(app) == "sqlite:///a.sqlite"

    def test_then_flask_sqlalchemys_database(self):
        app = make_app(SQLALCHEMY_DATABASE_URI="postgresql+psycopg://app@db/app")
        assert app.extensions["cronjob"].database_url(app) == "postgresql+psycopg://app@db/app"

    def test_then_the_schedulers_own_default(self):
        app = make_app()
        assert app.extensions["cronjob"].database_url(app) is None

    def test_a_job_module_that_raises_fails_the_apps_creation(self, tmp_path, monkeypatch):
        (tmp_path / "bad_jobs.py").write_text(
            "import cronjob\ncronjob.Registry().register(print, '0 0 0 30 2 *', 'feb-30')\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        with pytest.raises(RuntimeError) as caught:
            make_app(CRONJOB_IMPORTS=["bad_jobs"])
        assert str(caught.value) == (
            "cronjob: importing 'bad_jobs' (CRONJOB_IMPORTS) failed: ScheduleError: job "
            "'feb-30': '0 0 0 30 2 *' never fires: day-of-month 30 never occurs in February"
        )

    def test_the_scheduler_it_builds_runs_on_the_configured_database(self, tmp_path):
        url = f"sqlite:///{tmp_path / 'app.sqlite'}"
        app = make_app(CRONJOB_DATABASE_URL=url)
        scheduler = app.extensions["cronjob"].scheduler(app, replica_id="web-1")
        assert scheduler._database == url
        assert scheduler.replica_id == "web-1"
