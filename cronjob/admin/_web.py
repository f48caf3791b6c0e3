"""The status page, as a WSGI or an ASGI app an application mounts where it chooses.

It shows what [cronjob.admin][] reads — the jobs on record, one job's recent rounds,
the live replicas — and changes nothing: it answers ``GET`` and ``HEAD`` only, runs no
script and loads no asset, and every value on it is escaped. Put it behind the
application's own authentication: it shows job names, replicas and error messages.

::

    from cronjob import web

    # Flask / any WSGI:  DispatcherMiddleware(app, {"/cronjob": web.wsgi_app(url)})
    # Starlette/FastAPI: app.mount("/cronjob", web.asgi_app(url))

Pages, under the mount path (``SCRIPT_NAME`` in WSGI, ``root_path`` in ASGI, which the
links follow): ``/`` the jobs and replicas; ``/job?name=NAME`` a job and its latest rounds
(``&failed=1``: failures only). A database without the tables, or at another revision,
gets a page that says which (status 503); an unknown job, 404.

``cronjob status --serve HOST:PORT`` serves it with the standard library's server
([serve][cronjob.web.serve]).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import parse_qs

import sqlalchemy as sa

import lease

from .. import admin
from .._clock import Clock
from ..engine import resolve_database
from . import _page

__all__ = ["asgi_app", "serve", "wsgi_app"]

#: Rounds shown on a job's page.
ROUNDS_SHOWN: Final = 50

#: Sent with every page: nothing on it may run a script or load anything from elsewhere.
HEADERS: Final = (
    ("Content-Type", "text/html; charset=utf-8"),
    ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)

_REASONS: Final = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = HEADERS


class _Pages:
    """What both apps answer: a request's method, path and query to a reply."""

    def __init__(self, database: str | sa.Engine | None, clock: Clock | None) -> None:
        resolved = resolve_database(database)
        if not isinstance(resolved, str | sa.Engine):
            raise TypeError("the status page reads a database URL or a sync Engine")
        self._database: str | sa.Engine = resolved
        self._clock = clock

    def reply(self, method: str, path: str, query: str, prefix: str) -> _Reply:
        prefix = prefix.rstrip("/")
        if method not in ("GET", "HEAD"):
            page = _page.error_page("read only", "This page only reads: GET or HEAD.", prefix)
            return _Reply(405, page.encode(), (*HEADERS, ("Allow", "GET, HEAD")))
        try:
            if path in ("", "/"):
                return _Reply(200, self._jobs(prefix).encode())
            if path == "/job":
                params = parse_qs(query, keep_blank_values=True)
                name = params.get("name", [""])[0]
                failed = params.get("failed", [""])[0] not in ("", "0")
                return _Reply(200, self._job(name, failed, prefix).encode())
        except admin.UnknownJob as exc:
            return _Reply(404, _page.error_page("unknown job", str(exc), prefix).encode())
        except admin.StatusError as exc:
            return _Reply(503, _page.error_page("no status", str(exc), prefix).encode())
        except lease.LeaseError as exc:
            message = f"the database could not be read: {exc}"
            return _Reply(503, _page.error_page("no status", message, prefix).encode())
        page = _page.error_page("not found", f"No page at {path}.", prefix)
        return _Reply(404, page.encode())

    def _jobs(self, prefix: str) -> str:
        return _page.jobs_page(admin.status(self._database, now=self._now()), prefix)

    def _job(self, name: str, failed: bool, prefix: str) -> str:
        report = admin.status(self._database, now=self._now())
        found = [job for job in report.jobs if job.name == name]
        if not found:
            raise admin.UnknownJob(f"no job named {name!r} is on record")
        rounds = admin.history(self._database, name, limit=ROUNDS_SHOWN, failed=failed)
        return _page.job_page(found[0], rounds, prefix, failed=failed, checked_at=report.checked_at)

    def _now(self) -> datetime | None:
        return None if self._clock is None else self._clock.now()


def wsgi_app(database: str | sa.Engine | None = None, *, clock: Clock | None = None) -> WSGIApp:
    """The status page as a WSGI application.

    Args:
        database: the database the replicas share: a URL or a sync ``Engine`` (not
            disposed); by default ``$CRONJOB_DATABASE_URL``, else the embedded SQLite file.
        clock: "now" for next instants, staleness and liveness; by default the database's
            clock (a [FakeClock][cronjob.testing.FakeClock] in tests).

    Links follow the ``SCRIPT_NAME`` the page is mounted at.
    """
    pages = _Pages(database, clock)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        # PEP 3333: PATH_INFO is the request's bytes decoded as latin-1.
        path = environ.get("PATH_INFO", "").encode("latin-1", "replace").decode("utf-8", "replace")
        method = environ.get("REQUEST_METHOD", "GET")
        reply = pages.reply(
            method, path, environ.get("QUERY_STRING", ""), environ.get("SCRIPT_NAME", "")
        )
        status = f"{reply.status} {_REASONS[reply.status]}"
        headers = [*reply.headers, ("Content-Length", str(len(reply.body)))]
        start_response(status, headers)
        return [b""] if method == "HEAD" else [reply.body]

    return app


def asgi_app(database: str | sa.Engine | None = None, *, clock: Clock | None = None) -> ASGIApp:
    """The status page as an ASGI application (arguments as [wsgi_app][cronjob.web.wsgi_app]).

    The database is read in a worker thread, so the application's loop keeps serving.
    Links follow the scope's ``root_path``; a ``path`` that includes it (as Starlette's
    ``Mount`` and recent servers give it) is read below it. Lifespan events are
    acknowledged, so it may also run as an application of its own.
    """
    pages = _Pages(database, clock)

    async def app(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        root = scope.get("root_path", "")
        path = scope.get("path", "")
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root) :]
        query = scope.get("query_string", b"").decode("latin-1")
        method = scope.get("method", "GET")
        reply = await asyncio.to_thread(pages.reply, method, path, query, root)
        headers = [*reply.headers, ("Content-Length", str(len(reply.body)))]
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
            }
        )
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else reply.body})

    return app


def serve(
    database: str | sa.Engine | None,
    host: str,
    port: int,
    *,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the page at ``http://host:port/`` with the standard library's server, until
    interrupted. ``ready`` is told the address once it listens."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request on stderr is noise for a quick look

    with make_server(host, port, wsgi_app(database), handler_class=Quiet) as server:
        if ready is not None:
            ready(f"http://{host}:{server.server_port}/")
        server.serve_forever()
