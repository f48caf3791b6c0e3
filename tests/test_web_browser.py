"""The status page in a real browser: headless Chromium (Debian's) loads it from a server.

Replicas run real rounds on a fake clock and an SQLite file; the standard library's server
serves :func:`cronjob.web.wsgi_app` on a free port; Chromium loads the page and the test
reads the DOM it built and its screenshot. Without Chromium the tests skip, except under
CI (``CI=true``), where they fail: ``.ci/run`` installs it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

import cronjob
from cronjob import Registry, Scheduler, web
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
#: A phone's screen, in CSS pixels.
PHONE = (390, 844)
#: The test's own script: how wide the page laid out, on the body for --dump-dom.
MEASURE = (
    b"<script>document.body.dataset.widths = [document.documentElement.scrollWidth, "
    b"document.documentElement.clientWidth].join();"
    # Each table's laid-out width and its box's, and how far right each header ends.
    b"document.body.dataset.tables = [...document.querySelectorAll('table')].map("
    b"t => t.scrollWidth + '/' + t.parentElement.clientWidth).join(' ');"
    b"document.body.dataset.headers = [...document.querySelectorAll('th')].map("
    b"h => h.textContent + '@' + Math.ceil(h.getBoundingClientRect().right)).join('|');"
    b"</script>"
)
#: A laptop's screen, in CSS pixels.
LAPTOP = (1280, 800)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; under CI it must be (.ci/run installs it)")
        pytest.skip(message)
    return found


def browse(chromium: str, url: str, *args: str, size: tuple[int, int] = PHONE) -> str:
    """Run headless Chromium on ``url`` with ``args``; its standard output."""
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",  # root in a container: Chromium's sandbox needs namespaces
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            f"--window-size={size[0]},{size[1]}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):
        pass


@contextlib.contextmanager
def served(app: web.WSGIApp) -> Iterator[str]:
    """Serve ``app`` under /ops/cron on a free port of 127.0.0.1: the page's URL."""

    def mounted(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/ops/cron"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not here"]
        environ["SCRIPT_NAME"], environ["PATH_INFO"] = "/ops/cron", path[len("/ops/cron") :]
        if "measure=1" not in environ.get("QUERY_STRING", ""):
            return app(environ, start_response)
        return measured(environ, start_response)

    def measured(environ, start_response):
        """The page with a script of the test's own that notes how wide it laid out
        (the page's policy, which forbids any script, is dropped for it)."""
        replied = []
        body = b"".join(app(environ, lambda status, headers: replied.extend([status, headers])))
        body = body.replace(b"</body>", MEASURE + b"</body>")
        status, headers = replied
        dropped = ("Content-Security-Policy", "Content-Length")
        kept = [(k, v) for k, v in headers if k not in dropped]
        start_response(status, [*kept, ("Content-Length", str(len(body)))])
        return [body]

    server: WSGIServer = make_server("127.0.0.1", 0, mounted, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/ops/cron/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def nightly(ctx: cronjob.Round) -> None:
    ctx.wait(95)


def invoices(ctx: cronjob.Round) -> None:
    raise ConnectionError("<script>document.title='owned'</script> SMTP refused")


@pytest.fixture
def page_url(tmp_path: Path) -> Iterator[str]:
    """A page over real rounds: two replicas, a job that succeeds, one that fails."""
    url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
    clock = FakeClock(START)
    registry = Registry()
    registry.register(nightly, "0 0 * * * *", "refresh-report")
    registry.register(invoices, "0 30 * * * *", "send-invoices")
    with (
        Scheduler(url, registry=registry, clock=clock, replica_id="web-1"),
        Scheduler(url, registry=registry, clock=clock, replica_id="web-2"),
    ):
        clock.advance(2 * 3600 + 120)
    with (
        Scheduler(url, registry=registry, clock=clock, replica_id="web-1"),
        Scheduler(url, registry=registry, clock=clock, replica_id="web-2"),
    ):
        clock.advance(0)
        with served(web.wsgi_app(url, clock=clock)) as page:
            yield page


def test_the_browser_shows_the_jobs_their_problem_and_the_replicas(chromium, page_url):
    dom = browse(chromium, page_url, "--dump-dom")
    assert "<title>cronjob status</title>" in dom
    assert ">refresh-report</a>" in dom and ">send-invoices</a>" in dom
    assert "send-invoices: failing: 2 rounds in a row failed" in dom
    assert ">web-1<" in dom and ">web-2<" in dom


def test_the_browser_shows_an_error_holding_markup_as_text_and_runs_nothing(chromium, page_url):
    dom = browse(chromium, page_url + "job?name=send-invoices", "--dump-dom")
    assert "<title>cronjob: send-invoices</title>" in dom  # no script renamed it
    assert "<script" not in dom
    assert "&lt;script&gt;document.title='owned'&lt;/script&gt; SMTP refused" in dom


def test_the_page_fits_a_phone_screen(chromium, page_url, tmp_path):
    """Nothing is wider than a phone's screen: the tables' rows become cards."""
    shot = tmp_path / "phone.png"
    browse(chromium, page_url, f"--screenshot={shot}")
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(header[16:20], "big") == PHONE[0]
    for path in ("", "job?name=send-invoices"):
        dom = browse(
            chromium, page_url + path + ("&" if "?" in path else "?") + "measure=1", "--dump-dom"
        )
        [(laid_out, screen)] = re.findall(r'data-widths="(\d+),(\d+)"', dom)
        # Headless Chromium may widen a window to 500 px when it only dumps the DOM:
        # still a phone's layout (under 40rem), and nothing may be wider than it.
        assert int(screen) <= 640, path
        assert int(laid_out) <= int(screen), path


def tenant_sync(ctx: cronjob.Round) -> None:
    pass


@pytest.fixture
def busy_page_url(tmp_path: Path) -> Iterator[str]:
    """A page as an operator of a busy deployment sees it: schedules made of data (a Task
    column), jobs with several policies (a Policies column), a job running, one paused
    with a reason, failures and missed instants."""
    from cronjob import admin, schedules

    url = f"sqlite:///{tmp_path / 'busy.sqlite'}"
    clock = FakeClock(START)
    registry = Registry()
    registry.register(
        nightly,
        "0 0 * * * *",
        "refresh-quarterly-revenue-report",
        timeout=3600,
        retries=3,
        retry_backoff=30,
        start_deadline=120,
        overlap="buffer_one",
        catch_up="all",
        catch_up_window=6 * 3600,
        jitter=30,
    )
    registry.register(invoices, "0 30 * * * *", "send-invoices", pause_after_failures=5)
    registry.register_task(tenant_sync, "tenant-sync", timeout=600, retries=2)
    with (
        Scheduler(url, registry=registry, clock=clock, replica_id="web-replica-1.example.internal"),
        Scheduler(url, registry=registry, clock=clock, replica_id="web-replica-2.example.internal"),
    ):
        for n in range(3):
            schedules.add(url, f"tenant-{n:04d}-eu-west", task="tenant-sync", spec="0 */5 * * * *")
        clock.advance(2 * 3600 + 120)
        admin.pause(
            url,
            "send-invoices",
            by="oncall@example.com",
            reason="SMTP provider down",
            now=clock.now(),
        )
    with (
        Scheduler(url, registry=registry, clock=clock, replica_id="web-replica-1.example.internal"),
        Scheduler(url, registry=registry, clock=clock, replica_id="web-replica-2.example.internal"),
    ):
        clock.advance(0)  # their records written
        with served(web.wsgi_app(url, clock=clock)) as page:
            yield page


def test_the_jobs_table_fits_a_laptop_screen_with_every_column_in_view(
    chromium, busy_page_url, tmp_path
):
    """At 1280 px the jobs table needs no sideways scroll: its last column (Policies) and
    the Missed column are on screen, and so is every table's."""
    shot = tmp_path / "laptop.png"
    browse(chromium, busy_page_url, f"--screenshot={shot}", size=LAPTOP)
    header = shot.read_bytes()[:24]
    assert int.from_bytes(header[16:20], "big") == LAPTOP[0]
    dom = browse(chromium, busy_page_url + "?measure=1", "--dump-dom", size=LAPTOP)
    [(laid_out, screen)] = re.findall(r'data-widths="(\d+),(\d+)"', dom)
    assert int(screen) >= 1200  # the laptop's layout, not a phone's
    assert int(laid_out) <= int(screen)
    [tables] = re.findall(r'data-tables="([^"]*)"', dom)
    for table in tables.split():
        wide, box = map(int, table.split("/"))
        assert wide <= box, tables
    [headers] = re.findall(r'data-headers="([^"]*)"', dom)
    ends = dict(h.rsplit("@", 1) for h in headers.split("|"))
    assert {"Task", "Missed", "Policies"} <= set(ends)
    assert all(int(end) <= int(screen) for end in ends.values()), ends
