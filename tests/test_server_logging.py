"""cronjob's log lines under real uvicorn and gunicorn processes, as
docs/integrations/fastapi.md says.

The servers' default logging configures their own loggers only, so the scheduler's INFO
lines vanish; the page's ``logging.json`` (read from the page itself, so the two cannot drift)
or ``cronjob.lifespan(log_level="INFO")`` shows them, with a time and a level. Each test
starts a server, waits (in real time, bounded) for its start-up to complete, stops it with
SIGTERM and reads what it wrote.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import cronjob
from tests._process import Watched, watched

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "integrations" / "fastapi.md"
#: Real seconds a process is given to start or to stop.
TIMEOUT = 60.0

#: A line of the page's format: ``2026-03-02 09:00:00,113 INFO    cronjob: …``.
STAMP = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO    cronjob: "
STARTED = re.compile(
    STAMP + r"scheduler \S+ started: 1 leased job\(s\), 0 per-instance job\(s\), 0 task\(s\), "
    r"database ",
    re.M,
)
STOPPED = re.compile(STAMP + r"scheduler \S+ stopped$", re.M)

APP = """
import cronjob
from fastapi import FastAPI

registry = cronjob.Registry()
registry.register(lambda ctx: None, "0 0 0 1 1 *", "new-year")
app = FastAPI(lifespan=cronjob.lifespan({url!r}, registry=registry{options}))
"""


def page_config() -> dict[str, object]:
    """The ``logging.json`` of the page: its one ```json block."""
    [block] = re.findall(r"^```json\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    config: dict[str, object] = json.loads(block)
    return config


def wait_for(run: Watched, text: str) -> None:
    """Wait until ``text`` appears in the output, or the process ends, or the timeout."""
    deadline = time.monotonic() + TIMEOUT
    while text not in run.output and run.process.poll() is None:
        assert time.monotonic() < deadline, run.output
        time.sleep(0.05)
    assert text in run.output, run.output


def gunicorn_conf() -> str:
    """The page's ``gunicorn.conf.py``: its one ```py block."""
    [block] = re.findall(r"^```py\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    return str(block)


def serve(
    tmp_path: Path, *, config: bool, options: str = "", server: str = "uvicorn"
) -> tuple[str, str]:
    """Run the app under ``server`` (uvicorn, or gunicorn with uvicorn's worker) until its
    start-up completes, then SIGTERM it: (what it wrote until then, what it wrote in all).
    With ``config``, the server is given the page's configuration."""
    url = f"sqlite:///{tmp_path / 'app.sqlite'}"
    (tmp_path / "served_app.py").write_text(textwrap.dedent(APP.format(url=url, options=options)))
    if config:
        (tmp_path / "logging.json").write_text(json.dumps(page_config()))
    if server == "uvicorn":
        argv = [sys.executable, "-m", "uvicorn", "served_app:app", "--host", "127.0.0.1"]
        argv += ["--port", "0", "--app-dir", str(tmp_path)]
        if config:
            argv += ["--log-config", str(tmp_path / "logging.json")]
    else:
        argv = [sys.executable, "-m", "gunicorn", "served_app:app", "-b", "127.0.0.1:0"]
        argv += ["-k", "uvicorn.workers.UvicornWorker", "--chdir", str(tmp_path)]
        if config:
            (tmp_path / "gunicorn.conf.py").write_text(gunicorn_conf())
            argv += ["-c", str(tmp_path / "gunicorn.conf.py")]
    # HOME: where gunicorn (27) puts its control socket, not the real home.
    with watched(argv, cwd=tmp_path, env={"HOME": str(tmp_path)}) as run:
        wait_for(run, "Application startup complete.")
        started = run.output
        run.process.send_signal(signal.SIGTERM)
        # A clean shutdown: uvicorn (0.30 and later) then ends by the signal it was sent.
        assert run.process.wait(timeout=TIMEOUT) in (0, -signal.SIGTERM), run.output
    # The block has waited for the reader thread to read the output to its end.
    assert "Application shutdown complete." in run.output, run.output
    return started, run.output


@pytest.mark.slow
@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
def test_the_pages_logging_json_shows_the_started_and_stopped_lines_once(tmp_path, server):
    started, output = serve(tmp_path, config=True, server=server)
    assert len(STARTED.findall(started)) == 1, started
    assert len(STOPPED.findall(output)) == 1, output
    # The server's own lines take the same format, once (none lost, none doubled).
    uvicorn = STAMP.replace("cronjob", r"uvicorn\.error") + "Application startup complete"
    assert len(re.findall(uvicorn, output, re.M)) == 1, output
    if server == "gunicorn":
        gunicorn = STAMP.replace("cronjob", r"gunicorn\.error") + "Booting worker"
        assert len(re.findall(gunicorn, output, re.M)) == 1, output


@pytest.mark.slow
@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
def test_lifespan_log_level_shows_them_without_a_logging_config(tmp_path, server):
    started, output = serve(tmp_path, config=False, options=', log_level="INFO"', server=server)
    assert STARTED.search(started), started
    assert STOPPED.search(output), output


@pytest.mark.slow
@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
def test_without_either_the_server_drops_them(tmp_path, server):
    """The problem the page solves: the servers' default logging has no root handler."""
    started, output = serve(tmp_path, config=False, server=server)
    assert "Application startup complete." in started
    assert " started: " not in output and " stopped" not in output


class TestLogLevelOption:
    """`lifespan(log_level=...)` in this process, where logging is configured (pytest's
    handlers are on the root logger): the application's handlers get the lines."""

    def test_a_configured_application_keeps_its_handlers_and_the_levels_come_back(
        self, tmp_path, caplog, monkeypatch
    ):
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 0 0 1 1 *", "new-year")
        url = f"sqlite:///{tmp_path / 'app.sqlite'}"
        app = FastAPI(lifespan=cronjob.lifespan(url, registry=registry, log_level="info"))
        loggers = [logging.getLogger(name) for name in ("cronjob", "lease", "execctx")]
        before = [(logger.level, list(logger.handlers)) for logger in loggers]
        monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)  # Python's default
        with TestClient(app):
            assert [logger.level for logger in loggers] == [logging.INFO] * 3
            assert [logger.handlers for logger in loggers] == [h for _, h in before]
        assert [(logger.level, logger.handlers) for logger in loggers] == before
        lines = [r.getMessage() for r in caplog.records if r.name == "cronjob"]
        assert any(re.match(r"scheduler \S+ started: 1 leased job", line) for line in lines)
        assert any(re.match(r"scheduler \S+ stopped$", line) for line in lines)

    @pytest.mark.parametrize(
        ("level", "message"),
        [
            ("LOUD", r"^log_level 'LOUD' is not a logging level \(CRITICAL, "),
            (-1, r"^log_level must be >= 0, not -1$"),
            (True, r"^log_level must be a level name or number, not True$"),
        ],
    )
    def test_a_bad_level_is_refused_at_the_call(self, level, message):
        with pytest.raises(ValueError, match=message):
            cronjob.lifespan("sqlite://", log_level=level)


DJANGO_PAGE = REPO / "docs" / "integrations" / "django.md"

SCHEDULER = """
import logging.config
import sys

import cronjob

logging.config.dictConfig({config!r})
if {root_handler!r}:  # as manage.py cronjob run does: cronjob run's own root handler
    from cronjob.admin._run import _configure_logging

    _configure_logging()
registry = cronjob.Registry()
registry.register(lambda ctx: None, "0 0 0 1 1 *", "new-year")
with cronjob.Scheduler(sys.argv[1], registry=registry):
    pass
"""


def django_logging() -> dict[str, object]:
    """The ``LOGGING`` of the Django page's ``settings.py`` block."""
    [block] = [
        body
        for body in re.findall(r"^```python\n(.*?)^```", DJANGO_PAGE.read_text(), re.S | re.M)
        if "LOGGING = " in body
    ]
    namespace: dict[str, object] = {}
    exec(block, namespace)
    logging_config = namespace["LOGGING"]
    assert isinstance(logging_config, dict)
    return logging_config


@pytest.mark.parametrize(
    ("page", "root_handler"),
    [("django", False), ("django", True), ("fastapi", True)],
    ids=["django-web-worker", "django-manage-py-run", "logging-json-manage-py-run"],
)
def test_the_pages_configs_show_each_line_once(tmp_path, page, root_handler):
    """In a web worker, and in ``manage.py cronjob run`` (which adds a root handler only
    where none is configured), the lines of the pages' configurations appear once."""
    config = django_logging() if page == "django" else page_config()
    code = SCHEDULER.format(config=config, root_handler=root_handler)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), f"sqlite:///{tmp_path / 'app.sqlite'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert len(STARTED.findall(done.stderr)) == 1, done.stderr
    assert len(STOPPED.findall(done.stderr)) == 1, done.stderr
