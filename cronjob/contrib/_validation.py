"""What a worker checks before it runs an occurrence: what every target's worker shares.

A message that names an occurrence is a claim: this schedule, at this instant, with this
id. It is checked, before anything runs, in the order below; each check has its
disposition (the stream worker applies them all, the ``once`` wrappers of Celery, RQ
and Dramatiq the identity, obsolete and firing checks):

1. Structure (`check_structure`, stream entries): the fields are there, ``source`` is
   `SOURCE`, ``scheduled_at`` is RFC 3339 UTC to the whole second with ``Z``, ``args``
   a JSON object. Identity (`check_identity`): the id recomputed from the app, the
   schedule and the instant is the message's. Either failing: invalid.
2. Obsolete (`resolve`): no registered job and no schedule row names the schedule (it
   was removed, or never there). The caller acknowledges it as terminal, unless the
   occurrence was admitted already (its pinned descriptor governs it then).
3. Firing (`check_firing`): the instant is a firing of the schedule's current spec in
   its zone (or a one-off's instant), within its bounds. Failing: invalid.

This is integrity, not provenance: the checks establish that a claim is consistent,
never who made it. A failed check raises [InvalidOccurrence][cronjob.contrib.InvalidOccurrence]
with a reason a dead letter carries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import lease

from .._exceptions import CronjobError, ScheduleError
from .._occurrence import occurrence_id
from .._schedule import parse

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .._registry import Registry

__all__ = [
    "LIVE_WITHIN",
    "SOURCE",
    "Claim",
    "InvalidOccurrence",
    "check_firing",
    "check_identity",
    "check_structure",
    "format_instant",
    "resolve",
]

#: The ``source`` of every entry cronjob publishes.
SOURCE: Final = "cronjob.schedule"
#: A replica seen within these seconds is live: the jobs it registers name schedules.
LIVE_WITHIN: Final = 60.0

_RFC3339_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_REQUIRED = ("source", "app", "schedule", "occurrence_id", "scheduled_at", "args")


class InvalidOccurrence(CronjobError, ValueError):
    """Raised when a message's claim of an occurrence does not check out (its structure,
    its id, or its instant is no firing of its schedule); ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """What a message says it is: an occurrence of ``schedule`` at ``instant``.

    Attributes:
        app: The application's name ("" for none).
        schedule: The job's or data schedule's name.
        occurrence_id: The id it carries.
        instant: The scheduled instant, aware UTC, a whole second.
        args: The arguments (a data schedule's; ``{}`` for a registered job).
        traceparent: The round's W3C trace context, if it carried one.
    """

    app: str
    schedule: str
    occurrence_id: str
    instant: datetime
    args: Mapping[str, Any]
    traceparent: str | None = None


def format_instant(instant: datetime) -> str:
    """``instant`` in RFC 3339, UTC, whole second, with ``Z`` (``2026-09-29T03:00:00Z``).

    Raises:
        ValueError: ``instant`` is naive or has a fraction of a second.
    """
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"instant {instant.isoformat()} is naive; give it a zone")
    if instant.microsecond:
        raise ValueError(f"instant {instant.isoformat()} has a fraction of a second")
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(fields: Mapping[str, object], key: str) -> str:
    value = fields.get(key)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def check_structure(fields: Mapping[str, object]) -> Claim:
    """Read a stream entry's fields (text or bytes) as a claim; the id is not checked.

    Raises:
        InvalidOccurrence: a field is missing or empty (``app`` may be empty),
            ``source`` is not `SOURCE`, ``scheduled_at`` is not RFC 3339 UTC to the whole
            second with ``Z`` (a fractional second is refused, not rounded), or ``args``
            is not a JSON object.
    """
    missing = [key for key in _REQUIRED if key not in fields]
    if missing:
        raise InvalidOccurrence(f"missing field(s): {', '.join(missing)}")
    text = {key: _text(fields, key) for key in _REQUIRED}
    empty = [key for key in ("schedule", "occurrence_id") if not text[key]]
    if empty:
        raise InvalidOccurrence(f"empty field(s): {', '.join(empty)}")
    if text["source"] != SOURCE:
        raise InvalidOccurrence(f"source is {text['source']!r}, not {SOURCE!r}")
    stamp = text["scheduled_at"]
    if not _RFC3339_Z.fullmatch(stamp):
        raise InvalidOccurrence(
            f"scheduled_at {stamp!r} is not RFC 3339 UTC to the whole second (YYYY-MM-DDTHH:MM:SSZ)"
        )
    try:
        instant = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise InvalidOccurrence(f"scheduled_at {stamp!r} is no date and time") from None
    try:
        args = json.loads(text["args"])
    except ValueError:
        args = None
    if not isinstance(args, dict):
        raise InvalidOccurrence(f"args {text['args'][:80]!r} is not a JSON object")
    traceparent = _text(fields, "traceparent") or None
    return Claim(
        app=text["app"],
        schedule=text["schedule"],
        occurrence_id=text["occurrence_id"],
        instant=instant,
        args=args,
        traceparent=traceparent,
    )


def check_identity(app: str, schedule: str, instant: datetime, given_id: str) -> None:
    """Check that ``given_id`` is the occurrence id of (``app``, ``schedule``, ``instant``).

    Raises:
        InvalidOccurrence: it is not (or ``app`` is no valid application name).
    """
    try:
        expected = occurrence_id(schedule, instant, app=app)
    except ValueError as exc:
        raise InvalidOccurrence(str(exc)) from None
    if given_id != expected:
        raise InvalidOccurrence(
            f"occurrence_id {given_id!r} is not the id of {schedule!r} at "
            f"{instant.isoformat()} (app {app!r}): {expected}"
        )


def resolve(
    engine: Engine | None,
    schedule: str,
    *,
    registry: Registry | None,
    now: datetime,
) -> lease.Definition | None:
    """What names ``schedule`` now; ``None``: nothing (obsolete unless admitted).

    The worker's own registry first (a job of that name), then the lease database:
    the schedule row (not removed), else a job of that name registered by a replica seen
    within `LIVE_WITHIN` seconds of ``now``.

    Raises:
        lease.LeaseError: the database could not be read.
    """
    if registry is not None:
        for job in registry.jobs:
            if job.name == schedule:
                return lease.Definition(name=schedule, task=schedule, spec=job.schedule.spec)
    if engine is None:
        return None
    since = round((now.timestamp() - LIVE_WITHIN) * 1000)
    return lease.definition(engine, schedule, live_since_ms=since)


def check_firing(definition: lease.Definition, instant: datetime) -> None:
    """Check that ``instant`` is a firing of ``definition``: an instant of its spec (in
    its zone, DST included) or a one-off's instant, within its bounds.

    Raises:
        InvalidOccurrence: it is not, or the spec on record no longer parses.
    """
    name = definition.name
    if definition.start is not None and instant < definition.start:
        raise InvalidOccurrence(f"{instant.isoformat()} is before {name!r} starts")
    if definition.end is not None and instant > definition.end:
        raise InvalidOccurrence(f"{instant.isoformat()} is after {name!r} ends")
    if definition.spec is None:
        if definition.at is None or definition.at != instant:
            raise InvalidOccurrence(f"{instant.isoformat()} is not the instant of {name!r}")
        return
    try:
        schedule = parse(definition.spec)
    except ScheduleError as exc:
        raise InvalidOccurrence(f"the spec of {name!r} does not parse: {exc}") from None
    if schedule.next(instant - timedelta(seconds=1)) != instant:
        raise InvalidOccurrence(
            f"{instant.isoformat()} is not a firing of {name!r} ({definition.spec})"
        )
