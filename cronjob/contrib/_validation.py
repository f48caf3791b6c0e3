"""What a worker checks before it runs an occurrence: what every target's worker shares.

A message that names an occurrence is a claim: this schedule, at this instant, with this
id. It is checked, before anything runs, in the order below; each check has its
disposition (the stream worker applies them all, the ``once`` wrappers of Celery, RQ
and Dramatiq the identity, obsolete and firing checks):

1. Structure (`check_structure`, stream entries): the fields are there, ``source`` is
   `SOURCE`, ``scheduled_at`` is RFC 3339 UTC to the whole second with ``Z`` (a manual
   round's may carry its fraction: its instant is the moment it was asked for), ``args``
   a JSON object. Identity (`check_identity`): the id recomputed from the app, the
   schedule and the instant is the message's. Either failing: invalid.
2. Obsolete (`resolve`): no registered job and no schedule row names the schedule (it
   was removed, or never there). The caller acknowledges it as terminal, unless the
   occurrence was admitted already (its pinned descriptor governs it then).
3. Firing (`check_firing`): the instant is a firing of the schedule's current spec in
   its zone (or a one-off's instant), within its bounds. Failing: invalid. A manual
   round's (``trigger`` `MANUAL`: ``cronjob trigger``) instant is the moment it was
   asked for, no firing: the check is skipped for it (the identity check is not).

Every message carries its round's trigger (`TRIGGERS`): a stream entry in the optional
field ``trigger``, a Celery message in the header ``cronjob_trigger``, a Dramatiq
message in the option ``cronjob_trigger``, an RQ job in ``meta["cronjob"]["trigger"]``.
It is left out for a scheduled round, so a message without it (queued by an earlier
release) is a scheduled one. `check_claim` applies checks 2 and 3 to a claim.

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
    "MANUAL",
    "SCHEDULED",
    "SOURCE",
    "TRIGGERS",
    "Claim",
    "InvalidOccurrence",
    "check_claim",
    "check_firing",
    "check_identity",
    "check_structure",
    "claim_of",
    "resolve",
]

#: The ``source`` of every entry cronjob publishes.
SOURCE: Final = "cronjob.schedule"
#: Kept for earlier callers: the replicas' records name schedules whatever their age
#: (a replica that stops takes its record off; a fake clock's replica is "seen" in its
#: own time), so no liveness bound applies any more.
LIVE_WITHIN: Final = 60.0
#: The trigger of a round on its schedule: the default, left out of every message.
SCHEDULED: Final = "schedule"
#: The trigger of a round an operator asked for (``cronjob trigger``): its instant is
#: the request's moment, no firing.
MANUAL: Final = "manual"
#: The triggers a message may carry (``cronjob._round.Trigger``'s values).
TRIGGERS: Final = frozenset({SCHEDULED, MANUAL, "backfill"})

_RFC3339_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
#: A manual round's instant (the moment it was asked for) keeps its fraction.
_RFC3339_Z_FRACTION = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")
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
        trigger: What started the round (one of `TRIGGERS`; `SCHEDULED` when the
            message does not say).
    """

    app: str
    schedule: str
    occurrence_id: str
    instant: datetime
    args: Mapping[str, Any]
    traceparent: str | None = None
    trigger: str = SCHEDULED


def _trigger(value: object) -> str:
    """``value`` as a trigger: `SCHEDULED` when missing or empty.

    Raises:
        InvalidOccurrence: it is not one of `TRIGGERS`.
    """
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if value is None or value == "":
        return SCHEDULED
    if not isinstance(value, str) or value not in TRIGGERS:
        raise InvalidOccurrence(f"trigger {value!r} is not one of {', '.join(sorted(TRIGGERS))}")
    return value


def claim_of(
    *,
    app: object,
    schedule: object,
    instant: object,
    occurrence_id: str,
    trigger: object = None,
) -> Claim | None:
    """The claim a task system's message makes (Celery's headers, Dramatiq's options,
    RQ's meta), or ``None`` when it carries no schedule name or instant: a message
    cronjob did not publish, which is run by its id alone, unchecked.

    Raises:
        InvalidOccurrence: the instant is not RFC 3339 with an offset, the app not a
            string, or the trigger not one of `TRIGGERS`.
    """
    if not schedule or not instant:
        return None
    if not isinstance(schedule, str) or not isinstance(instant, str):
        raise InvalidOccurrence(f"schedule {schedule!r} or instant {instant!r} is no text")
    if app is not None and not isinstance(app, str):
        raise InvalidOccurrence(f"app {app!r} is no text")
    try:
        when = datetime.fromisoformat(instant.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidOccurrence(f"instant {instant!r} is no RFC 3339 date and time") from None
    if when.tzinfo is None:
        raise InvalidOccurrence(f"instant {instant!r} has no offset")
    return Claim(
        app=app or "",
        schedule=schedule,
        occurrence_id=occurrence_id,
        instant=when.astimezone(UTC),
        args={},
        trigger=_trigger(trigger),
    )


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
            second with ``Z`` (a fractional second is refused, not rounded, but for an
            entry whose ``trigger`` is `MANUAL`), or ``args``
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
    trigger = _trigger(fields.get("trigger"))
    if trigger == MANUAL:
        if not _RFC3339_Z_FRACTION.fullmatch(stamp):
            raise InvalidOccurrence(
                f"scheduled_at {stamp!r} is not RFC 3339 UTC with Z (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)"
            )
    elif not _RFC3339_Z.fullmatch(stamp):
        raise InvalidOccurrence(
            f"scheduled_at {stamp!r} is not RFC 3339 UTC to the whole second (YYYY-MM-DDTHH:MM:SSZ)"
        )
    try:
        instant = datetime.fromisoformat(stamp).astimezone(UTC)
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
        trigger=trigger,
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
    the schedule row (not removed), else a job of that name that a replica's record
    lists, whatever the replica's last sign of life (``now`` is not used for it: a
    replica on a fake clock is seen in its own time, and one that stops takes its record
    off).

    Raises:
        lease.LeaseError: the database could not be read.
    """
    if registry is not None:
        for job in registry.jobs:
            if job.name == schedule:
                return lease.Definition(name=schedule, task=schedule, spec=job.schedule.spec)
    if engine is None:
        return None
    return lease.definition(engine, schedule)


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


def check_claim(
    engine: Engine | None,
    claim: Claim,
    *,
    registry: Registry | None,
    now: datetime,
) -> lease.Definition | None:
    """Checks 2 and 3 of a claim whose identity checked out and that was never admitted:
    what names its schedule, or ``None`` (obsolete: acknowledge it as terminal); the
    firing check is skipped for a `MANUAL` round.

    Raises:
        InvalidOccurrence: its instant is no firing of the schedule's current spec.
        lease.LeaseError: the database could not be read.
    """
    definition = resolve(engine, claim.schedule, registry=registry, now=now)
    if definition is not None and claim.trigger != MANUAL:
        check_firing(definition, claim.instant)
    return definition
