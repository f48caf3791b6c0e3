"""Read a Celery app's ``beat_schedule`` into cronjob jobs (``cronjob beat -A APP``).

Each entry becomes a job named by its key, with a spec of cronjob's grammar:

- ``crontab(...)``: ``0 <minute> <hour> <day_of_month> <month_of_year> <day_of_week>``
  (seconds first, the seconds field 0), read in the app's zone (``timezone``; with no
  ``timezone``, UTC when ``enable_utc``, refused otherwise: Celery would read the
  machine's local zone, which replicas need not share). The fields are written from
  the sets Celery expanded (so ``mon-fri``, ``*/15``, wrapped ranges such as
  ``fri-mon`` and lists all mean what they meant to Celery), a full set as ``*``.
  Both number Sunday 0; Celery's day-of-week has no 7.
- ``timedelta``, a number of seconds, or ``schedule(run_every=...)``: ``@every <n>s``,
  which fires on the multiples of the period since the Unix epoch, where beat counts
  from its own start (or its last run in its schedule file).

Refused at start, naming the entry (`BeatScheduleError`): ``solar``, a schedule class
of the app's own (a subclass too), a crontab restricting both ``day_of_month`` and
``day_of_week`` (Celery runs on the days in both, cron on the days in either, so no
cron spec says it), a period that is not a whole number of seconds, an unknown key,
an option the Celery target does not know, or a bad knob.

The knobs of each entry's hand-off (``retry_within``, ``hold``, ``send_timeout``, see
``cronjob.contrib.handoff``) come from the command's options (``--retry-within`` ...),
for every entry, and from the entry's ``options`` under `KNOB_OPTIONS`' keys
(``cronjob_retry_within`` ...), which win and are taken out of the options: they never
reach ``apply_async``. Unset, a knob is derived (``None``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, timedelta, tzinfo
from typing import Any, Final

from .._handoff import HOLD_SECONDS

__all__ = [
    "BeatEntry",
    "BeatScheduleError",
    "KNOB_OPTIONS",
    "app_zone",
    "entry_knobs",
    "beat_entries",
    "crontab_spec",
    "every_spec",
    "zone_name",
]

#: The keys of a ``beat_schedule`` entry that mean something here (``relative`` is
#: accepted and has no effect: ``@every`` is always on the epoch's multiples).
ENTRY_KEYS = frozenset({"task", "schedule", "args", "kwargs", "options", "relative"})
#: The keys of an entry's ``options`` that set a knob of its hand-off, by knob.
KNOB_OPTIONS: Final = {
    "retry_within": "cronjob_retry_within",
    "hold": "cronjob_hold",
    "send_timeout": "cronjob_send_timeout",
}

# (field name, lowest, highest) of Celery's expanded crontab sets, in cron's order.
_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day_of_month", 1, 31),
    ("month_of_year", 1, 12),
    ("day_of_week", 0, 6),
)


class BeatScheduleError(ValueError):
    """Raised when a ``beat_schedule`` entry cannot be run as a cronjob job; the
    message names the entry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BeatEntry:
    """One ``beat_schedule`` entry, as a job: its name, spec, what it sends (``options``
    without the knobs) and its hand-off's knobs in seconds (``None``: derived)."""

    name: str
    spec: str
    task: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    retry_within: float | None = None
    hold: float | None = None
    send_timeout: float | None = None


def app_zone(app: Any) -> tzinfo | None:
    """The wall clock a Celery app reads its crontabs on; ``None`` for the machine's
    local zone (no ``timezone`` set and ``enable_utc`` off), which cronjob refuses:
    replicas on machines set to different zones would disagree on every instant."""
    if not app.conf.timezone and not app.conf.enable_utc:
        return None
    zone: tzinfo = app.timezone
    return zone


def zone_name(zone: tzinfo | None) -> str | None:
    """The IANA name of a Celery app's zone (`app_zone`); ``None`` for UTC.

    Raises:
        BeatScheduleError: The zone is the machine's local zone, or has no IANA name.
    """
    if zone is None:
        raise BeatScheduleError(
            "the app reads crontabs on the machine's local zone (enable_utc is False and "
            "timezone is unset), which replicas may not share: set timezone, e.g. "
            "app.conf.timezone = 'Europe/Berlin'"
        )
    if zone is UTC:
        return None
    name = getattr(zone, "key", None) or getattr(zone, "zone", None)
    if not isinstance(name, str):
        raise BeatScheduleError(f"the app's time zone {zone!r} has no IANA name: set timezone")
    return None if name in ("UTC", "Etc/UTC") else name


def crontab_spec(entry: str, schedule: Any, zone: str | None) -> str:
    """The six-field spec (seconds first) that fires when Celery's ``crontab`` does.

    Args:
        entry: The entry's name, for the error message.
        schedule: A ``celery.schedules.crontab``.
        zone: The IANA zone the crontab is read in; ``None`` for UTC.

    Raises:
        BeatScheduleError: Both ``day_of_month`` and ``day_of_week`` are restricted.
    """
    fields = [_field(set(getattr(schedule, name)), low, high) for name, low, high in _FIELDS]
    if fields[2] != "*" and fields[4] != "*":
        raise BeatScheduleError(
            f"beat entry {entry!r}: crontab restricts both day_of_month "
            f"({fields[2]}) and day_of_week ({fields[4]}); Celery runs on days in both, "
            "cron on days in either, so no cron spec says it: make it two entries, or "
            "keep one of the two and check the other in the task"
        )
    spec = "0 " + " ".join(fields)
    return spec if zone is None else f"CRON_TZ={zone} {spec}"


def _field(values: set[int], low: int, high: int) -> str:
    """A cron field for ``values``: ``*``, ``*/step``, ``a-b``, or a list of those."""
    ordered = sorted(values)
    if ordered == list(range(low, high + 1)):
        return "*"
    if len(ordered) > 2 and ordered[0] == low:
        step = ordered[1] - ordered[0]
        if ordered == list(range(low, high + 1, step)):
            return f"*/{step}"
    parts: list[str] = []
    start = previous = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if value is not None:
            start = previous = value
    return ",".join(parts)


def every_spec(entry: str, period: timedelta | float) -> str:
    """``@every <n>s`` for a period of whole seconds.

    Raises:
        BeatScheduleError: The period is not a positive whole number of seconds.
    """
    seconds = period.total_seconds() if isinstance(period, timedelta) else float(period)
    if seconds <= 0 or seconds != int(seconds):
        raise BeatScheduleError(
            f"beat entry {entry!r}: the period {seconds:g} s is not a positive whole "
            "number of seconds, which @every needs"
        )
    return f"@every {int(seconds)}s"


def entry_knobs(
    entry: str, options: dict[str, Any], defaults: Mapping[str, float | None]
) -> dict[str, float | None]:
    """The knobs of an entry's hand-off: ``defaults`` (the command's options, by knob),
    overridden by those its ``options`` set under `KNOB_OPTIONS`' keys, which are
    popped from ``options``.

    Raises:
        BeatScheduleError: A knob that is not a number of seconds (> 0; ``retry_within``
            >= 0), or a ``send_timeout`` not below the hold (given, or `HOLD_SECONDS`).
    """
    found: dict[str, float | None] = {}
    for knob, key in KNOB_OPTIONS.items():
        given, where = defaults.get(knob), knob
        if key in options:
            given, where = options.pop(key), f"options[{key!r}]"
        if given is None:
            found[knob] = None
            continue
        least = ">= 0" if knob == "retry_within" else "> 0"
        if (
            isinstance(given, bool)
            or not isinstance(given, int | float)
            or not math.isfinite(given)
            or not (given >= 0 if knob == "retry_within" else given > 0)
        ):
            raise BeatScheduleError(
                f"beat entry {entry!r}: {where} must be a number of seconds {least}, not {given!r}"
            )
        found[knob] = float(given)
    hold, send_timeout = found["hold"], found["send_timeout"]
    hold = HOLD_SECONDS if hold is None else hold
    if send_timeout is not None and send_timeout >= hold:
        raise BeatScheduleError(
            f"beat entry {entry!r}: send_timeout ({send_timeout:g} s) must be below the "
            f"hold ({hold:g} s)"
        )
    return found


def beat_entries(
    beat_schedule: Mapping[str, Any],
    zone: tzinfo | None,
    *,
    retry_within: float | None = None,
    hold: float | None = None,
    send_timeout: float | None = None,
) -> list[BeatEntry]:
    """Read every entry of ``beat_schedule`` (``app.conf.beat_schedule``).

    Args:
        beat_schedule: The entries by name.
        zone: The crontabs' wall clock, `app_zone` (``None``: the machine's, refused).
        retry_within: The knob of every entry that does not set its own; ``None``:
            derived (see `entry_knobs`).
        hold: As ``retry_within``.
        send_timeout: As ``retry_within``.

    Raises:
        BeatScheduleError: The first entry that cannot run, named (see the module).
    """
    defaults = {"retry_within": retry_within, "hold": hold, "send_timeout": send_timeout}
    from celery.schedules import crontab, schedule, solar

    entries = []
    zone_text: str | None = None
    zone_read = False
    for name, raw in beat_schedule.items():
        if not isinstance(raw, Mapping):
            raise BeatScheduleError(f"beat entry {name!r} is not a mapping: {raw!r}")
        unknown = sorted(set(raw) - ENTRY_KEYS)
        if unknown:
            raise BeatScheduleError(
                f"beat entry {name!r}: unknown key {unknown[0]!r}; "
                f"the keys are {', '.join(sorted(ENTRY_KEYS))}"
            )
        task = raw.get("task")
        if not isinstance(task, str) or not task:
            raise BeatScheduleError(f"beat entry {name!r}: 'task' must name a task, not {task!r}")
        when: Any = raw.get("schedule")
        if type(when) is crontab:
            if not zone_read:
                try:
                    zone_text, zone_read = zone_name(zone), True
                except BeatScheduleError as exc:
                    raise BeatScheduleError(f"beat entry {name!r}: {exc}") from None
            spec = crontab_spec(name, when, zone_text)
        elif isinstance(when, timedelta | int | float) and not isinstance(when, bool):
            spec = every_spec(name, when)
        elif type(when) is schedule:
            spec = every_spec(name, when.run_every)
        elif isinstance(when, solar):
            raise BeatScheduleError(
                f"beat entry {name!r}: solar schedules have no cron spec "
                "(cronjob has no sunrise or sunset)"
            )
        else:
            raise BeatScheduleError(
                f"beat entry {name!r}: schedule {when!r} is not a crontab, a timedelta "
                "or a number of seconds (custom schedule classes cannot be read)"
            )
        args = raw.get("args") or ()
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise BeatScheduleError(f"beat entry {name!r}: args must be a list, not {args!r}")
        kwargs = raw.get("kwargs") or {}
        options = raw.get("options") or {}
        for key, value in (("kwargs", kwargs), ("options", options)):
            if not isinstance(value, Mapping):
                raise BeatScheduleError(f"beat entry {name!r}: {key} must be a dict, not {value!r}")
        options = dict(options)  # a copy: the knobs are popped, the app's entry stays
        knob = entry_knobs(name, options, defaults)
        entries.append(
            BeatEntry(
                name=name,
                spec=spec,
                task=task,
                args=tuple(args),
                kwargs=dict(kwargs),
                options=options,
                retry_within=knob["retry_within"],
                hold=knob["hold"],
                send_timeout=knob["send_timeout"],
            )
        )
    return entries
