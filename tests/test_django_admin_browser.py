"""The admin of schedules in a real browser: headless Chromium (Debian's), driven over the
DevTools protocol, logs in to Django's dev server and adds, lists, edits, pauses and
removes a schedule, and sees a bad spec refused by the form.

``manage.py runserver`` serves tests/django_project (``admin_settings``) on SQLite or a
PostgreSQL database of the test's own. Chromium's command line alone cannot submit a
form, so the test starts it with ``--remote-debugging-port`` and speaks the protocol over
a websocket (`websocket-client`): navigate, run a line of JavaScript that fills and submits
the form, wait for the next page to load, read its DOM. Without Chromium the tests skip,
except under CI (``CI=true``), where they fail: ``.ci/run`` installs it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import lease
from tests._process import run_python
from tests.conftest import POSTGRES_URL, _reachable
from tests.test_django import django_env

websocket = pytest.importorskip("websocket")

PASSWORD = "secret-pass-1"
INSTANT = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; under CI it must be (.ci/run installs it)")
        pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Browser:
    """One page of headless Chromium, driven over the DevTools protocol."""

    def __init__(self, ws_url: str) -> None:
        self._ws = websocket.create_connection(ws_url, timeout=60)
        self._ids = itertools.count(1)
        self.call("Page.enable")

    def close(self) -> None:
        self._ws.close()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send ``method``; its result (events met meanwhile are dropped)."""
        id_ = next(self._ids)
        self._ws.send(json.dumps({"id": id_, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == id_:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    def _loaded(self) -> None:
        while True:
            message = json.loads(self._ws.recv())
            if message.get("method") == "Page.loadEventFired":
                return

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self._loaded()

    def submit(self, script: str) -> None:
        """Run ``script`` (it submits a form), then wait for the next page to load."""
        self.eval(script)
        self._loaded()

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def text(self, selector: str = "body") -> str:
        return str(self.eval(f"document.querySelector({json.dumps(selector)}).innerText"))


def fill(values: dict[str, str], submit: str = "input[type=submit][name=_save]") -> str:
    """JavaScript that sets the fields named in ``values`` and clicks ``submit``."""
    sets = "".join(
        f"document.querySelector('[name=\"{name}\"]').value = {json.dumps(value)};"
        for name, value in values.items()
    )
    return sets + f"document.querySelector({json.dumps(submit)}).click();"


@contextlib.contextmanager
def browser(chromium: str, tmp_path: Path) -> Iterator[Browser]:
    port = free_port()
    process = subprocess.Popen(
        [
            chromium,
            "--headless",
            "--no-sandbox",  # root in a container: Chromium's sandbox needs namespaces
            "--disable-gpu",
            "--no-first-run",
            f"--remote-debugging-port={port}",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/json/version")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
            pages = [t for t in json.load(reply) if t["type"] == "page"]
        page = Browser(pages[0]["webSocketDebuggerUrl"])
        try:
            yield page
        finally:
            page.close()
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def dev_server(tmp_path: Path, db: str, env: dict[str, str], url: str) -> Iterator[str]:
    """``manage.py runserver`` on a migrated database with a superuser; its admin's URL."""
    for args in (
        ["migrate", "--noinput"],
        ["createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com"],
    ):
        done = run_python("-m", "django", *args, cwd=tmp_path, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
    engine = lease.create_engine(url)
    try:
        lease.migrate(engine)
    finally:
        engine.dispose()
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=tmp_path,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "server.log", "w"),  # noqa: SIM115 (closed with the process)
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/admin/login/")
        yield f"http://127.0.0.1:{port}/admin/"
    finally:
        process.terminate()
        process.wait(timeout=30)


def walk_through(page: Browser, admin: str) -> None:
    """Log in; add, list, edit, pause, resume and remove a schedule; a bad spec refused."""
    page.goto(admin)
    page.submit(fill({"username": "ops", "password": PASSWORD}, "input[type=submit]"))
    assert "Site administration" in page.text(), page.text()
    assert "Schedules" in page.text()

    add = f"{admin}cronjob/schedule/add/"
    page.goto(add)
    page.submit(fill({"id": "report:bad", "task": "report", "spec": "0 0 0 30 2 *"}))
    errors = page.text(".field-spec .errorlist")
    assert errors == (
        "schedule 'report:bad': '0 0 0 30 2 *' never fires: day-of-month 30 never "
        "occurs in February"
    ), errors

    page.goto(add)
    page.submit(
        fill(
            {
                "id": "report:tenant-42",
                "task": "tenant-report",
                "spec": "CRON_TZ=Europe/Paris 0 0 9 * * *",
                "args": '{"tenant": 42}',
            }
        )
    )
    assert "was added successfully" in page.text(), page.text()
    row = page.text("#result_list tbody tr")
    assert "report:tenant-42" in row and "tenant-report" in row, row
    assert "Europe/Paris" in row, row
    assert len(re.findall(INSTANT, page.text("td.field-next_instants"))) == 3, row
    assert "report:bad" not in page.text("#result_list")

    page.eval("document.querySelector('#result_list tbody th a').click()")
    page._loaded()
    assert page.eval("document.querySelector('[name=spec]').value") == (
        "CRON_TZ=Europe/Paris 0 0 9 * * *"
    )
    page.submit(fill({"spec": "0 30 7 * * 1-5"}))
    assert "was changed successfully" in page.text(), page.text()
    row = page.text("#result_list tbody tr")
    assert "0 30 7 * * 1-5" in row and "UTC" in row, row
    assert re.search(r"07:30:00Z", page.text("td.field-next_instants")), row

    def act(action: str) -> None:
        page.eval("document.querySelector('#result_list tbody input.action-select').click()")
        page.eval(f"document.querySelector('select[name=action]').value = '{action}'")
        page.submit("document.querySelector('button[name=index]').click()")

    act("pause_schedules")
    assert "Paused 1 schedule(s)." in page.text(), page.text()
    assert page.eval("document.querySelector('td.field-is_paused img').alt") == "True"
    act("resume_schedules")
    assert "Resumed 1 schedule(s)." in page.text(), page.text()
    assert page.eval("document.querySelector('td.field-is_paused img').alt") == "False"

    act("delete_selected")
    assert "Are you sure you want to delete the selected schedule?" in page.text()
    page.submit("document.querySelector('#content form input[type=submit]').click()")
    assert "Successfully deleted 1 schedule" in page.text(), page.text()
    assert "0 schedules" in page.text(), page.text()


def test_the_admin_on_sqlite(chromium, tmp_path):
    env = {
        **django_env(tmp_path),
        "DJANGO_SETTINGS_MODULE": "admin_settings",
        "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
    }
    url = f"sqlite:///{tmp_path / 'app.sqlite'}"
    with dev_server(tmp_path, "sqlite", env, url) as admin, browser(chromium, tmp_path) as page:
        walk_through(page, admin)


@pytest.mark.postgres
def test_the_admin_on_postgresql(chromium, tmp_path):
    _reachable(POSTGRES_URL, "PostgreSQL")
    name = f"test_cronjob_admin_{uuid.uuid4().hex[:12]}"
    server = sa.create_engine(POSTGRES_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    env = {
        **django_env(tmp_path, "postgres"),
        "DJANGO_SETTINGS_MODULE": "admin_settings",
        "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
        "CRONJOB_TEST_DJANGO_PG_NAME": name,
    }
    url = sa.make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    try:
        with (
            dev_server(tmp_path, "postgres", env, url) as admin,
            browser(chromium, tmp_path) as page,
        ):
            walk_through(page, admin)
    finally:
        with server.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.dispose()
