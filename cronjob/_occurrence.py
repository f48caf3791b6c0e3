"""An instant's occurrence id: the one name every replica gives the round of a job at an
instant, so that what the round hands on (a message to a worker fleet) carries the same
id however often it is sent.

The id may carry an application's name (``app``), so that two applications with a
same-named job on one broker or one Redis give their occurrences different ids. The
application comes from ``Scheduler(app=...)`` or ``$CRONJOB_APP`` (`resolve_app`); the
empty name, the default, gives the ids of the releases before it.
"""

from __future__ import annotations

import os
import re
import uuid
from datetime import UTC, datetime
from typing import Final

__all__ = ["APP_ENV", "OCCURRENCE_NAMESPACE", "check_app", "occurrence_id", "resolve_app"]

#: The UUID5 namespace of occurrence ids. Fixed for good: changing it would give every
#: instant a new id, and a worker's deduplication would run an instant twice.
OCCURRENCE_NAMESPACE: Final = uuid.UUID("a35ed7d8-cdc6-4241-b16b-24fbb283ec04")
#: The environment variable that names the application when none is given.
APP_ENV: Final = "CRONJOB_APP"

# No ':' in an app: "<app>:<name>" then splits one way only, whatever the name holds.
_APP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_app(app: object) -> str:
    """``app`` if it is a valid application name: empty, or 1 to 63 letters, digits,
    ``.``, ``_`` and ``-``, starting with a letter or a digit.

    Raises:
        ValueError: ``app`` is not such a string.
    """
    if not isinstance(app, str) or (app and _APP.fullmatch(app) is None):
        raise ValueError(
            f"app must be empty or 1 to 63 letters, digits, '.', '_' or '-' starting with "
            f"a letter or a digit, got {app!r}"
        )
    return app


def resolve_app(app: str | None = None) -> str:
    """The application's name: ``app``, else ``$CRONJOB_APP``, else ``""``.

    Raises:
        ValueError: the name is not valid (`check_app`).
    """
    return check_app(os.environ.get(APP_ENV, "") if app is None else app)


def occurrence_id(name: str, instant: datetime, *, app: str = "") -> str:
    """The occurrence id of the round of job (or schedule) ``name`` at ``instant``.

    A UUID5, in its text form, of ``"<name>@<instant>"`` in `OCCURRENCE_NAMESPACE`
    (``"<app>:<name>@<instant>"`` when ``app`` is not empty), the instant written in UTC
    as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``. It depends on nothing else, so every replica, and
    a round's first run, its second run and its catch-up, give the same value; another
    system can compute it the same way. With ``app=""`` it is the value of the releases
    that had no ``app``.

    Raises:
        TypeError: ``name`` is not a string or ``instant`` not a datetime.
        ValueError: ``instant`` is naive, or ``app`` is not a valid name (`check_app`).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {name!r}")
    if not isinstance(instant, datetime):
        raise TypeError(f"instant must be a datetime, got {instant!r}")
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"instant {instant.isoformat()} is naive; give it a zone")
    check_app(app)
    stamp = instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    key = f"{name}@{stamp}" if not app else f"{app}:{name}@{stamp}"
    return str(uuid.uuid5(OCCURRENCE_NAMESPACE, key))
