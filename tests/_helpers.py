"""Plain helpers the test modules share (fixtures live in ``conftest.py``); the
benchmarks use some too, so nothing here needs pytest at run time."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from wsgiref.util import setup_testing_defaults

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import NullPool

import cronjob
import lease
from cronjob import admin, web
from cronjob.testing import FakeClock

if TYPE_CHECKING:
    import pytest

Noted = TypeVar("Noted")


class JobBodies(Generic[Noted]):
    """Job bodies that note each round they run in :attr:`seen`, under a lock (rounds run
    on worker threads). A module's subclass says what it keeps of a round in
    :meth:`_noted` (or overrides :meth:`_record` altogether)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        #: What :meth:`_noted` kept of each round, in the order they started.
        self.seen: list[Noted] = []

    def _noted(self, ctx: cronjob.Round) -> Noted:
        raise NotImplementedError

    def _record(self, ctx: cronjob.Round) -> None:
        with self._lock:
            self.seen.append(self._noted(ctx))

    def lasting(self, seconds: float) -> Callable[[cronjob.Round], None]:
        """A job that works ``seconds`` and stops early, cut short, when cancelled."""

        def job(ctx: cronjob.Round) -> None:
            self._record(ctx)
            if ctx.wait(seconds):
                ctx.check()

        return job

    def stubborn(self, seconds: float) -> Callable[[cronjob.Round], None]:
        """A job that works ``seconds`` and ignores its cancellation."""

        def job(ctx: cronjob.Round) -> None:
            self._record(ctx)
            self.clock.sleep(seconds)

        return job


def run_then_stop(
    replicas: Callable[..., cronjob.Scheduler], registry: cronjob.Registry, seconds: float
) -> None:
    """Start a replica ``"first"`` with ``registry``, let ``seconds`` pass on its clock,
    stop it."""
    scheduler = replicas(registry, "first")
    scheduler.clock.advance(seconds)
    scheduler.stop()


def refuse_thread_starts(monkeypatch: pytest.MonkeyPatch, prefix: str) -> list[bool]:
    """While ``[0]`` of the list returned is true, starting a thread whose name starts
    with ``prefix`` fails as the OS limit does; other threads start as usual."""
    refusing = [False]
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if refusing[0] and self.name.startswith(prefix):
            raise RuntimeError("can't start new thread")
        original(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return refusing


@contextmanager
def statements(
    engine: sa.Engine, keep: Callable[[str], bool] = lambda statement: True
) -> Iterator[list[str]]:
    """Collect the statements sent on ``engine`` while the block runs (those ``keep``
    keeps), in the order they were sent."""
    sent: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if keep(statement):
            sent.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", before)


def wsgi_call(
    app: web.WSGIApp, path: str, query: str = "", *, method: str = "GET", script_name: str = ""
) -> tuple[str, list[tuple[str, str]], str]:
    """Call ``app`` as a WSGI server would for one request without a body, mounted at
    ``script_name``: its status line, headers and body (text)."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": script_name,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "wsgi.input": io.BytesIO(),
    }
    setup_testing_defaults(environ)
    started: list[Any] = []
    body = b"".join(app(environ, lambda status, headers: started.extend([status, headers])))
    status, headers = started
    return status, headers, body.decode()


class SweepingClock(FakeClock):
    """A fake clock on which the sweep runs every 15 s, as on the system clock, and with
    it the refresh of each replica's record: a fake clock otherwise skips the sweeps that
    nothing could have changed (see ``engine/_sweep.py``), and a replica would look gone
    after a minute."""

    @property
    def in_process(self) -> bool:
        return False


def replica_row(now: Any, jobs: int, spec: str = "0 * * * * *") -> lease.ReplicaRow:
    """Replica ``r1`` as its sweep puts it on record at ``now``, with ``jobs`` leased jobs
    of ``spec`` named ``job-00000``, ``job-00001``…"""
    return lease.ReplicaRow(
        holder="r1",
        host="h",
        pid=1,
        version="v",
        started=now,
        seen=now,
        jobs={f"job-{i:05}": (spec, True) for i in range(jobs)},
    )


def run_sql(url: str, *sql: str) -> None:
    """Run ``sql`` (statements of the test's own: a grant, a trigger) in one transaction on
    a short-lived engine."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for statement in sql:
                conn.execute(sa.text(statement))
    finally:
        engine.dispose()


@contextmanager
def nightly_scheduler(url: str) -> Iterator[threading.Event]:
    """Replica ``a`` on the system clock with one job, ``nightly`` (03:00, so no schedule
    runs it in a test), once the first sweep is over (it runs as the scheduler starts, the
    next one 15 s later); yields the event a round of ``nightly`` sets."""
    started = threading.Event()
    registry = cronjob.Registry()
    registry.register(lambda ctx: started.set(), "0 0 3 * * *", "nightly")
    with cronjob.Scheduler(url, registry=registry, replica_id="a") as scheduler:
        assert scheduler.ready
        deadline = time.monotonic() + 10
        while not admin.status(url).replicas:  # its first sweep is over
            assert time.monotonic() < deadline, "the first sweep did not come"
            time.sleep(0.01)
        yield started
