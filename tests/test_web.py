"""The status page's data: real rounds on each database, read through the WSGI and ASGI apps.

Replicas are schedulers on one fake clock; the apps are called in-process, as a server
would call them, mounted under a prefix. What a real browser shows is
tests/test_web_browser.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

import cronjob
from cronjob import Registry, Scheduler, admin, web
from cronjob.testing import FakeClock
from tests._helpers import wsgi_call

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
#: What the failing job raises: markup that must show as text, never run.
MESSAGE = '<script>alert("owned")</script> & <b>bold</b>'


def report(ctx: cronjob.Round) -> None:
    ctx.wait(30)


def invoices(ctx: cronjob.Round) -> None:
    raise RuntimeError(MESSAGE)


@dataclass
class Page:
    status: int
    headers: dict[str, str]
    text: str


@pytest.fixture
def deployment(db_url: str, clock: FakeClock) -> Iterator[str]:
    """Two replicas that ran two hours of rounds and were just restarted (so both are
    seen now: on a fake clock an idle replica refreshes its record only as it starts)."""
    registry = Registry()
    registry.register(report, "0 0 * * * *", "report")
    registry.register(invoices, "0 30 * * * *", "invoices")
    for _deploy in range(2):
        with contextlib.ExitStack() as stack:
            for replica in ("web-1", "web-2"):
                stack.enter_context(
                    Scheduler(db_url, registry=registry, clock=clock, replica_id=replica)
                )
            if _deploy == 1:
                clock.advance(0)  # their records written
                yield db_url
                return
            clock.advance(2 * 3600 + 60)  # report 10:00, 11:00; invoices 09:30, 10:30


def wsgi_get(app: web.WSGIApp, path: str, query: str = "", *, method: str = "GET") -> Page:
    status, headers, body = wsgi_call(app, path, query, method=method, script_name="/ops/cron")
    return Page(int(status.split()[0]), dict(headers), body)


def asgi_get(app: web.ASGIApp, path: str, query: str = "") -> Page:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "root_path": "/ops/cron",
        "path": "/ops/cron" + path,  # Starlette's Mount keeps the whole path
        "query_string": query.encode(),
        "headers": [],
    }
    asyncio.run(app(scope, receive, send))
    start, body = sent
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return Page(start["status"], headers, body["body"].decode())


def text_of(markup: str) -> str:
    """What a reader sees: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


class TestJobsPage:
    def test_it_lists_every_job_with_its_last_outcome_and_the_live_replicas(
        self, deployment, clock
    ):
        page = wsgi_get(web.wsgi_app(deployment, clock=clock), "/")
        assert page.status == 200
        assert page.headers["Content-Type"] == "text/html; charset=utf-8"
        shown = " ".join(text_of(page.text).split())
        assert "2 jobs, 1 problem" in shown
        assert "report 0 0 * * * * 2026-03-02 12:00:00 idle succeeded 2026-03-02 11:00:30" in shown
        assert "invoices 0 30 * * * * 2026-03-02 11:30:00 idle failed 2026-03-02 10:30:00" in shown
        assert "invoices: failing: 2 rounds in a row failed" in shown
        assert "web-1" in shown and "web-2" in shown

    def test_a_paused_job_shows_paused_not_a_next_instant(self, deployment, clock):
        admin.pause(deployment, "report", by="ops", now=clock.now())
        page = wsgi_get(web.wsgi_app(deployment, clock=clock), "/")
        shown = " ".join(text_of(page.text).split())
        assert "report 0 0 * * * * paused paused by ops since 2026-03-02 11:01:00" in shown
        assert "12:00:00" not in shown  # its next instant, which does not run
        assert "invoices 0 30 * * * * 2026-03-02 11:30:00 idle" in shown
        job = wsgi_get(web.wsgi_app(deployment, clock=clock), "/job", "name=report")
        facts = " ".join(text_of(job.text).split())
        assert "Next instant (UTC) paused" in facts

    def test_links_stay_under_the_mount_path(self, deployment, clock):
        page = wsgi_get(web.wsgi_app(deployment, clock=clock), "/")
        assert '<a href="/ops/cron/job?name=report">report</a>' in page.text
        assert '<a href="/ops/cron/">cronjob status</a>' in page.text

    def test_the_asgi_app_shows_the_same_page_under_its_root_path(self, deployment, clock):
        page = asgi_get(web.asgi_app(deployment, clock=clock), "/")
        assert page.status == 200
        assert page.text == wsgi_get(web.wsgi_app(deployment, clock=clock), "/").text

    def test_it_is_readable_on_a_phone_with_nothing_loaded_from_elsewhere(self, deployment, clock):
        page = wsgi_get(web.wsgi_app(deployment, clock=clock), "/")
        assert '<meta name=viewport content="width=device-width, initial-scale=1">' in page.text
        assert "@media (max-width: 40rem)" in page.text
        assert not re.search(r"<script|<link|<img|src=|@import|url\(", page.text)
        assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")


class TestJobPage:
    def test_it_shows_the_jobs_recent_rounds_newest_first(self, deployment, clock):
        page = asgi_get(web.asgi_app(deployment, clock=clock), "/job", "name=report")
        assert page.status == 200
        shown = " ".join(text_of(page.text).split())
        first = shown.index("2026-03-02 11:00:00 1")
        second = shown.index("2026-03-02 10:00:00 1")
        assert first < second
        assert shown.count("succeeded") >= 2 and "30.0s" in shown

    def test_an_exception_message_holding_markup_shows_as_text(self, deployment, clock):
        page = wsgi_get(web.wsgi_app(deployment, clock=clock), "/job", "name=invoices")
        assert page.status == 200
        assert "<script>" not in page.text and "<b>bold" not in page.text
        assert html.escape(MESSAGE) in page.text
        assert f"RuntimeError: {MESSAGE}" in text_of(page.text)

    def test_failed_only_lists_the_failures(self, deployment, clock):
        app = web.wsgi_app(deployment, clock=clock)
        page = wsgi_get(app, "/job", "name=report&failed=1")
        assert "Recent failed rounds" in page.text
        assert "No rounds on record." in page.text
        assert 'href="/ops/cron/job?name=report"' in page.text  # back to every round

    def test_an_unknown_job_is_404_in_one_line(self, deployment, clock):
        page = wsgi_get(web.wsgi_app(deployment, clock=clock), "/job", "name=%3Cnope%3E")
        assert page.status == 404
        assert "no job named &#x27;&lt;nope&gt;&#x27; is on record" in page.text


class TestReadOnly:
    def test_it_refuses_to_be_written_to(self, deployment, clock):
        page = wsgi_get(web.wsgi_app(deployment, clock=clock), "/", method="POST")
        assert page.status == 405
        assert page.headers["Allow"] == "GET, HEAD"

    def test_head_sends_the_headers_alone(self, deployment, clock):
        page = wsgi_get(web.wsgi_app(deployment, clock=clock), "/", method="HEAD")
        assert page.status == 200 and page.text == ""
        assert int(page.headers["Content-Length"]) > 1000

    def test_another_path_is_404(self, deployment, clock):
        assert wsgi_get(web.wsgi_app(deployment, clock=clock), "/admin").status == 404

    @pytest.mark.blank_database
    def test_a_database_without_tables_says_so_and_is_left_as_it_was(self, db_url):
        page = wsgi_get(web.wsgi_app(db_url), "/")
        assert page.status == 503
        assert "no cronjob tables" in page.text

    def test_an_async_engine_is_refused_at_once(self):
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine("sqlite+aiosqlite://")
        with pytest.raises(TypeError, match="a database URL or a sync Engine"):
            web.wsgi_app(engine)  # type: ignore[arg-type]


class TestServe:
    def test_cronjob_status_serve_serves_the_page_until_stopped(self, tmp_path, clock):
        url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
        registry = Registry()
        registry.register(report, "0 0 * * * *", "report")
        with Scheduler(url, registry=registry, clock=clock, replica_id="web-1"):
            clock.advance(3600 + 60)
        command = [sys.executable, "-m", "cronjob", "status", "--serve", "127.0.0.1:0"]
        process = subprocess.Popen(
            [*command, "--database-url", url], stderr=subprocess.PIPE, text=True
        )
        try:
            assert process.stderr is not None
            line = process.stderr.readline()  # blocks until it listens (or dies)
            [address] = re.findall(r"http://127\.0\.0\.1:\d+/", line)
            with urllib.request.urlopen(address, timeout=30) as response:
                assert response.status == 200
                assert ">report</a>" in response.read().decode()
        finally:
            process.terminate()
            process.wait(timeout=30)

    def test_a_bad_address_is_one_line_and_exit_2(self, capsys):
        from cronjob.admin._cli import main

        assert main(["status", "--serve", "localhost"]) == 2
        assert "must be HOST:PORT, like 127.0.0.1:8321, got 'localhost'" in capsys.readouterr().err
