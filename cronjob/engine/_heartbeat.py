"""Heartbeat pings: a job's ``heartbeat=`` URL told of each round's start and end.

The URL is pinged in one of two forms, chosen by the URL itself:

- **Healthchecks-style** (Healthchecks.io, and services that copied it): ``<url>/start``
  as a round starts, ``<url>`` as it succeeds, ``<url>/fail`` as it fails (a query
  string stays where it is, after the path).
- **Sentry Crons' check-in URL** (``https://<ingest>/api/<project>/cron/<slug>/<key>/``
  with a ``status`` query parameter): the same URL with ``status=in_progress``, ``ok`` or
  ``error``.

Each ping is one ``GET`` with `urllib.request` (no dependency), sent from the scheduler's
hooks thread (see `cronjob.engine._failures`), never from a round's or the dispatcher's:
a slow or unreachable endpoint delays neither a round nor its record. Connecting and
waiting for the answer are each bounded by `PING_TIMEOUT` (urllib's socket timeout,
real seconds: the network's time is real); a ping that fails, answers an HTTP error or
times out is logged as a warning and not retried. The proxies of the environment
(``https_proxy``, ``no_proxy``) apply, as for any urllib request.

The job's URL is never logged whole: its path is the check's key (whoever holds it can
ping), so log lines and the replicas' record name the host only.
"""

from __future__ import annotations

import http.client
import logging
import urllib.parse
import urllib.request
from typing import Final, Literal

from .._version import __version__

__all__ = ["PING_TIMEOUT", "Event", "ping", "ping_url"]

log = logging.getLogger("cronjob")

#: Real seconds a ping may take to connect, and then to be answered.
PING_TIMEOUT: Final = 5.0

#: What a ping tells: a round started, succeeded, or failed.
Event = Literal["start", "success", "fail"]

#: Sentry Crons' word for each event (its check-in ``status``).
_SENTRY: Final[dict[str, str]] = {"start": "in_progress", "success": "ok", "fail": "error"}


def ping_url(url: str, event: Event) -> str:
    """The URL to ping for ``event`` of a job whose ``heartbeat`` is ``url``.

    A URL with a ``status`` query parameter (Sentry Crons' check-in form) has it set
    to ``in_progress``, ``ok`` or ``error``; any other gets Healthchecks' ``/start``,
    nothing, or ``/fail`` after its path.
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if any(key == "status" for key, _ in query):
        status = _SENTRY[event]
        query = [(key, status if key == "status" else value) for key, value in query]
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    if event == "success":
        return url
    return urllib.parse.urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{event}"))


def ping(job: str, url: str, event: Event, *, timeout: float | None = None) -> bool:
    """Ping job ``job``'s heartbeat ``url`` for ``event``; ``True`` if it answered 2xx/3xx.

    ``timeout`` bounds the connection and the wait for the answer, each (real seconds;
    ``None``: `PING_TIMEOUT`). Never raises for the network's or the endpoint's
    failures: they are logged (with the URL's host only) and ``False`` is returned.
    """
    if timeout is None:
        timeout = PING_TIMEOUT
    target = ping_url(url, event)
    host = urllib.parse.urlsplit(url).hostname
    request = urllib.request.Request(target, headers={"User-Agent": f"cronjob/{__version__}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = response.status
    except (OSError, ValueError, http.client.HTTPException) as exc:  # HTTPError: OSError
        log.warning("job %r: its heartbeat ping (%s) to %s failed: %s", job, event, host, exc)
        return False
    log.debug("job %r: heartbeat ping (%s) to %s answered %s", job, event, host, status)
    return True
