"""Parse schedule specs and compute their instants.

A spec is six cron fields, seconds first (``second minute hour day-of-month month
day-of-week``), a calendar descriptor (``@daily``) or ``@every <Go duration>``; a cron
expression or calendar descriptor may carry a ``CRON_TZ=<IANA zone>`` (or ``TZ=``)
prefix naming the wall clock it is read on. Without one it is read in UTC.

The grammar is robfig/cron's, the Go library the original package uses. croniter expands
the field sets, behind a screen that refuses the syntax croniter accepts and robfig/cron
does not (``L``, ``W``, ``#``, ``H``, ``R``, a year field, backwards ranges) and rewrites
the one form croniter reads differently (``5-5`` is minute 5, not every minute). The
instants themselves are computed here, not by croniter's iterator, whose handling of
daylight-saving time has a long history of bugs: the UTC path is integer calendar
arithmetic, and zones follow the rule in :class:`Schedule` (ISC/Debian cron's).

Where the grammars differ, the decisions are:

* A day field is unrestricted when one of its list elements is ``*`` or ``?`` without a
  step above 1, as in robfig/cron, the parser of the Go package this library follows:
  so ``*/2`` in day-of-month is restricted, and with a restricted weekday the OR rule
  applies (``0 0 0 */2 * FRI``: odd days, and Fridays). Vixie cron would AND them.
* ``?`` is allowed in the day fields only (robfig/cron takes it anywhere).
* Day-of-week ``7`` is Sunday, as in Vixie cron (robfig/cron refuses it).
* A backwards range (``22-2``, ``FRI-MON``) is refused, as robfig/cron does; croniter
  would wrap it around.
* Descriptors are case-insensitive (robfig/cron: lower case only). Zone prefixes are not.
* An ``@every`` period is exact: ``1.5h`` is 5400 s; ``1500ms`` is refused as
  fractional rather than truncated; longer than Go's ~292-year maximum is refused.
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._calendar import (
    MAX_INSTANT,
    MIN_INSTANT,
    SECONDS_PER_DAY,
    civil_from_days,
    days_from_civil,
    days_in_month,
    next_transition,
    segment_at,
)
from ._exceptions import ScheduleError

__all__ = ["DstMark", "Schedule", "parse"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Wall values are searched up to the end of year 10000: with a positive offset, a wall
# time early in year 10000 is still an instant of year 9999.
_LAST_WALL_YEAR = 10_000

_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_MONTH_FULL_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_WEEKDAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


class _Field(NamedTuple):
    name: str
    low: int
    high: int
    names: dict[str, int]
    #: Position of this field in croniter's expansion (minute, hour, dom, month, dow, second).
    croniter_index: int
    #: How the valid values are described in error messages.
    allowed: str


_FIELDS = (
    _Field("second", 0, 59, {}, 5, "0-59"),
    _Field("minute", 0, 59, {}, 0, "0-59"),
    _Field("hour", 0, 23, {}, 1, "0-23"),
    _Field("day-of-month", 1, 31, {}, 2, "1-31"),
    _Field(
        "month",
        1,
        12,
        {name: number for number, name in enumerate(_MONTH_NAMES, start=1)},
        3,
        "1-12 or JAN-DEC",
    ),
    _Field(
        "day-of-week",
        0,
        7,
        {name: number for number, name in enumerate(_WEEKDAY_NAMES)},
        4,
        "0-7 (0 and 7 are Sunday) or SUN-SAT",
    ),
)
_DAY_OF_MONTH, _DAY_OF_WEEK = 3, 5

# Calendar descriptors, as the six-field expressions they stand for (robfig/cron's).
_DESCRIPTORS = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}
_DESCRIPTOR_LIST = "@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"

_ZONE_PREFIXES = ("CRON_TZ=", "TZ=")
_DIGITS = re.compile(r"[0-9]+")
_NAME = re.compile(r"[A-Za-z]+")

# croniter's extensions, recognised only to say what they are when refusing them.
_EXTENSIONS = (
    (re.compile(r"#"), "'#' (nth weekday of the month)"),
    (re.compile(r"^[0-9]*W$|^W[0-9]+$|^LW$", re.IGNORECASE), "'W' (nearest weekday)"),
    (re.compile(r"^L$|^[0-9]+L$|^L-[0-9]+$", re.IGNORECASE), "'L' (last day)"),
    (re.compile(r"^H", re.IGNORECASE), "'H' (hashed value)"),
    (re.compile(r"^R$", re.IGNORECASE), "'R' (random value)"),
)

# Go's time.ParseDuration units, in nanoseconds ("µs" is U+00B5, "μs" U+03BC).
_GO_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_GO_COMPONENT = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_GO_MAX_NANOSECONDS = 2**63 - 1  # a Go time.Duration is an int64 of nanoseconds
_NANOSECONDS_PER_SECOND = 1_000_000_000
_DURATION_EXAMPLES = "write a Go duration such as '90s', '5m' or '1h30m'"

# Bits 1..n set: the days that exist in a month of n days.
_MONTH_DAYS_MASK = tuple((1 << (n + 1)) - 2 for n in range(32))


class DstMark(enum.Enum):
    """How an instant of a zoned schedule relates to a daylight-saving transition."""

    #: A local time in a skipped interval, fired at the first instant after the gap.
    SKIPPED = "skipped"
    #: An instant in the first pass of a repeated interval of local time.
    FIRST_PASS = "first pass"
    #: An instant in the second pass of a repeated interval (wildcard specs only).
    SECOND_PASS = "second pass"


class _Parts(NamedTuple):
    zone: ZoneInfo | None
    period: int | None
    fixed_time: bool
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    day_masks: tuple[int, ...]


def parse(spec: str) -> Schedule:
    """Parse a schedule spec.

    Args:
        spec: Six cron fields, seconds first (``"0 30 9 * * 1-5"``); a calendar
            descriptor (``"@daily"``); or ``"@every <Go duration>"`` (``"@every 1h30m"``).
            A cron expression or calendar descriptor may be prefixed with
            ``"CRON_TZ=<IANA zone> "`` or ``"TZ=<IANA zone> "``.

    Returns:
        The immutable :class:`Schedule`.

    Raises:
        ScheduleError: The spec does not parse, names ``Local`` or an unknown zone, puts
            a zone on ``@every``, has an ``@every`` period that is not a whole number of
            seconds of at least one, or never fires (``"0 0 0 30 2 *"``). The message
            names the bad value and how to fix it.
        TypeError: ``spec`` is not a string.
    """
    return Schedule(spec)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Schedule:
    """When a job runs: a parsed spec that computes its instants.

    Build one with :func:`parse` (or ``Schedule(spec)``, the same thing). Two schedules
    are equal when their spec text is.

    Every instant is an aware UTC datetime with whole seconds. A zoned spec follows the
    ISC/Debian cron rule across daylight-saving changes:

    * A *fixed-time* spec (none of its second, minute and hour fields starts with ``*``;
      calendar descriptors other than ``@hourly`` included) whose local time falls in a
      skipped interval fires once, at the first instant after the gap; several skipped
      times collapse into that one instant. In a repeated interval it fires only on the
      first pass.
    * A *wildcard* spec follows real time: nothing fires in a gap, and a repeated
      interval fires on both passes, which are distinct instants.

    Attributes:
        spec: The spec exactly as given.
        zone: The zone of a ``CRON_TZ=``/``TZ=`` prefix, or ``None`` without one
            (``CRON_TZ=UTC`` gives ``ZoneInfo("UTC")``; the instants are the same).
        is_every: Whether the spec is ``@every <duration>``.
        period: The ``@every`` period in seconds, ``None`` for other specs.
        fixed_time: Whether the DST rule for fixed-time specs applies (always ``False``
            for ``@every``).
    """

    spec: str
    zone: ZoneInfo | None = field(init=False)
    is_every: bool = field(init=False)
    period: int | None = field(init=False)
    fixed_time: bool = field(init=False)
    _seconds: tuple[int, ...] = field(init=False)
    _minutes: tuple[int, ...] = field(init=False)
    _hours: tuple[int, ...] = field(init=False)
    _months: tuple[int, ...] = field(init=False)
    # Indexed by the cron weekday (0 = Sunday) of a month's 1st: a bit mask of the days
    # 1..31 that match both day fields under the OR/AND rule. Finding the next day is
    # then one mask operation, whatever the weekday of the 1st.
    _day_masks: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        parts = _parse(self.spec)
        assign = object.__setattr__  # the dataclass is frozen; this is its constructor
        assign(self, "zone", parts.zone)
        assign(self, "is_every", parts.period is not None)
        assign(self, "period", parts.period)
        assign(self, "fixed_time", parts.fixed_time)
        assign(self, "_seconds", parts.seconds)
        assign(self, "_minutes", parts.minutes)
        assign(self, "_hours", parts.hours)
        assign(self, "_months", parts.months)
        assign(self, "_day_masks", parts.day_masks)

    def __repr__(self) -> str:
        return f"Schedule({self.spec!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return self.spec == other.spec

    def __hash__(self) -> int:
        return hash(self.spec)

    def __reduce__(self) -> tuple[type[Schedule], tuple[str]]:
        # Rebuild from the text: the parsed parts hold a ZoneInfo and derived tables.
        return (Schedule, (self.spec,))

    def next(self, after: datetime) -> datetime | None:
        """Return the first instant strictly after ``after``.

        Args:
            after: An aware datetime in any zone; a fraction of a second is allowed.

        Returns:
            The instant as an aware UTC datetime with whole seconds, or ``None`` when the
            schedule has no instant up to 9999-12-31T23:59:59Z.

        Raises:
            TypeError: ``after`` is not a datetime.
            ValueError: ``after`` is naive.
        """
        found = self._first_at_or_after(_floor_seconds(after, "after") + 1)
        return None if found is None else _EPOCH + timedelta(seconds=found)

    def prev(self, before: datetime) -> datetime | None:
        """Return the last instant strictly before ``before``.

        It is derived from :meth:`next` by bisection, so the two always agree:
        ``next(prev(t)) >= t`` and ``prev(next(t)) <= t``. It costs a few dozen
        evaluations of ``next``; meant for start-up catch-up and the CLI, not a hot loop.

        Args:
            before: An aware datetime in any zone; a fraction of a second is allowed.

        Returns:
            The instant as an aware UTC datetime with whole seconds, or ``None`` when the
            schedule has no instant from 0001-01-01T00:00:00Z on.

        Raises:
            TypeError: ``before`` is not a datetime.
            ValueError: ``before`` is naive.
        """
        floor, fraction = _split_seconds(before, "before")
        # The last whole second strictly before `before`.
        found = self._last_at_or_before(floor if fraction else floor - 1)
        return None if found is None else _EPOCH + timedelta(seconds=found)

    def on_transition(self, instant: datetime) -> bool:
        """Return whether ``instant`` falls on a daylight-saving transition of the zone.

        True for an instant that a skipped local time was moved to (the first instant
        after a gap, for a fixed-time spec with a local time in the gap) and for an
        instant inside either pass of a repeated interval. Always False for UTC and
        ``@every`` schedules. ``cronjob next`` uses it to mark such instants.

        Raises:
            TypeError: ``instant`` is not a datetime.
            ValueError: ``instant`` is naive.
        """
        return self._dst_mark(instant) is not None

    # -- evaluation ------------------------------------------------------------------

    def _first_at_or_after(self, start: int) -> int | None:
        """Return the first instant at or after ``start`` (epoch seconds), or None."""
        if start > MAX_INSTANT:
            return None
        start = max(start, MIN_INSTANT)
        if self.period is not None:
            # @every: the multiples of the period since the epoch (ceiling division).
            found = -(-start // self.period) * self.period
        elif self.zone is None:
            wall = self._next_wall(start)
            found = MAX_INSTANT + 1 if wall is None else wall
        else:
            return self._first_zoned(self.zone, start)
        return found if found <= MAX_INSTANT else None

    def _last_at_or_before(self, limit: int) -> int | None:
        """Return the last instant at or before ``limit`` (epoch seconds), or None."""
        if limit < MIN_INSTANT:
            return None
        limit = min(limit, MAX_INSTANT)
        if self.period is not None:
            found = limit // self.period * self.period
            return found if found >= MIN_INSTANT else None
        # Widen a window back from `limit` until it holds an instant...
        width = 64
        low: int | None = None
        while low is None:
            start = max(limit - width, MIN_INSTANT)
            first = self._first_at_or_after(start)
            if first is not None and first <= limit:
                low = first
            elif start == MIN_INSTANT:
                return None
            else:
                width *= 4
        # ...then bisect. `low` is always an instant <= limit, and no instant lies in
        # [high, limit]; when they meet, `low` is the last one.
        high = limit + 1
        while high - low > 1:
            middle = (low + high) // 2
            candidate = self._first_at_or_after(middle)
            if candidate is not None and candidate <= limit:
                low = candidate
            else:
                high = middle
        return low

    def _next_wall(self, wall: int) -> int | None:
        """Return the first matching wall time at or after ``wall`` (both as epoch seconds).

        Walks down the fields: month, day, hour, minute, second. A field with no match
        left increments the field above it and resets the ones below, and the overflow
        (month 13, hour 24, ...) is what the next pass of the loop carries over, so no
        case needs its own carry code. None past the end of year 10000.
        """
        months, hours, minutes, seconds = self._months, self._hours, self._minutes, self._seconds
        days, second_of_day = divmod(wall, SECONDS_PER_DAY)
        year, month, day = civil_from_days(days)
        hour, rest = divmod(second_of_day, 3600)
        minute, second = divmod(rest, 60)
        while year <= _LAST_WALL_YEAR:
            index = bisect_left(months, month)
            if index == len(months):
                year, month, day, hour, minute, second = year + 1, months[0], 1, 0, 0, 0
                continue
            if months[index] != month:
                month, day, hour, minute, second = months[index], 1, 0, 0, 0
            first = days_from_civil(year, month, 1)
            # 1970-01-01 was a Thursday, cron weekday 4.
            candidates = (
                self._day_masks[(first + 4) % 7]
                & _MONTH_DAYS_MASK[days_in_month(year, month)]
                & -(1 << day)  # drop the days before `day`
            )
            if not candidates:
                month, day, hour, minute, second = month + 1, 1, 0, 0, 0
                continue
            found_day = (candidates & -candidates).bit_length() - 1
            if found_day != day:
                day, hour, minute, second = found_day, 0, 0, 0
            index = bisect_left(hours, hour)
            if index == len(hours):
                day, hour, minute, second = day + 1, 0, 0, 0
                continue
            if hours[index] != hour:
                hour, minute, second = hours[index], 0, 0
            index = bisect_left(minutes, minute)
            if index == len(minutes):
                hour, minute, second = hour + 1, 0, 0
                continue
            if minutes[index] != minute:
                minute, second = minutes[index], 0
            index = bisect_left(seconds, second)
            if index == len(seconds):
                minute, second = minute + 1, 0
                continue
            return (first + day - 1) * SECONDS_PER_DAY + hour * 3600 + minute * 60 + seconds[index]
        return None

    def _matches_wall_in(self, low: int, high: int) -> bool:
        """Return whether some matching wall time lies in ``[low, high)``."""
        wall = self._next_wall(low)
        return wall is not None and wall < high

    def _first_zoned(self, zone: ZoneInfo, start: int) -> int | None:
        """Return the first instant at or after ``start`` of a spec read on ``zone``.

        Real time is cut into segments of constant UTC offset; inside one, the instants
        are the matching wall times minus the offset. At a segment's start the DST rule
        adds the gap's instant (fixed-time specs) or drops the repeated pass (likewise).
        """
        instant = start
        while instant <= MAX_INSTANT:
            segment = segment_at(zone, instant)
            offset = segment.offset
            search = instant
            transition = segment.start
            if transition is not None and self.fixed_time:
                if transition.after > transition.before:
                    # Spring forward: wall times [at + before, at + after) never show. A
                    # fixed-time spec that names one fires at the first instant after.
                    gap_start = transition.at + transition.before
                    if instant == transition.at and self._matches_wall_in(
                        gap_start, transition.at + transition.after
                    ):
                        return instant
                elif transition.after < transition.before:
                    # Fall back: the first (before - after) seconds of this segment show
                    # wall times already shown; a fixed-time spec fired on that first pass.
                    search = max(search, transition.at + transition.before - transition.after)
            if search < segment.end:
                wall = self._next_wall(search + offset)
                if wall is None:
                    return None
                if wall - offset < segment.end:
                    found = wall - offset
                    return found if found <= MAX_INSTANT else None
            instant = segment.end
        return None

    def _dst_mark(self, instant: datetime) -> DstMark | None:
        """Classify ``instant`` against the zone's transitions (see :meth:`on_transition`)."""
        moment = _floor_seconds(instant, "instant")
        zone = self.zone
        if zone is None or self.period is not None:
            return None
        if not MIN_INSTANT <= moment <= MAX_INSTANT:
            return None
        transition = segment_at(zone, moment).start
        if transition is not None:
            if transition.after < transition.before:
                if moment < transition.at + transition.before - transition.after:
                    return DstMark.SECOND_PASS
            elif (
                transition.after > transition.before
                and moment == transition.at
                and self.fixed_time
                and self._matches_wall_in(
                    transition.at + transition.before, transition.at + transition.after
                )
            ):
                return DstMark.SKIPPED
        upcoming = next_transition(zone, moment)
        if (
            upcoming is not None
            and upcoming.after < upcoming.before
            and moment >= upcoming.at - (upcoming.before - upcoming.after)
        ):
            return DstMark.FIRST_PASS
        return None


# -- conversion of datetimes -----------------------------------------------------------


def _split_seconds(moment: datetime, argument: str) -> tuple[int, int]:
    """Return ``(whole seconds since the epoch, rounded down; microseconds left over)``."""
    if not isinstance(moment, datetime):
        raise TypeError(f"{argument} must be a datetime, not {type(moment).__name__}")
    if moment.utcoffset() is None:
        raise ValueError(
            f"{argument} must be an aware datetime, got the naive {moment.isoformat()}; "
            "attach a zone, e.g. .replace(tzinfo=timezone.utc)"
        )
    delta = moment - _EPOCH  # exact for any aware datetime, even at the ends of the range
    return delta.days * SECONDS_PER_DAY + delta.seconds, delta.microseconds


def _floor_seconds(moment: datetime, argument: str) -> int:
    return _split_seconds(moment, argument)[0]


# -- parsing ---------------------------------------------------------------------------


def _parse(spec: str) -> _Parts:
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a str, not {type(spec).__name__}")
    words = spec.split()
    if not words:
        raise ScheduleError(
            "empty schedule spec: give six cron fields, seconds first (e.g. '0 */5 * * * *'), "
            "or a descriptor such as '@hourly'"
        )
    zone: ZoneInfo | None = None
    prefix = ""
    for key in _ZONE_PREFIXES:
        if words[0].startswith(key):
            prefix, words = words[0], words[1:]
            zone = _load_zone(prefix[len(key) :], key, spec)
            break
    if not words:
        raise ScheduleError(
            f"{spec!r} names a zone but no schedule: write the six cron fields "
            f"or a descriptor after {prefix!r}"
        )
    if words[0].startswith("@"):
        return _parse_descriptor(spec, words, zone, prefix)
    return _parse_fields(spec, words, zone, prefix)


def _load_zone(name: str, key: str, spec: str) -> ZoneInfo:
    if not name:
        raise ScheduleError(
            f"{spec!r} has an empty {key} prefix: name an IANA zone, e.g. '{key}Europe/Berlin'"
        )
    if name.lower() == "local":
        raise ScheduleError(
            f"zone {name!r} in {spec!r} is refused: the replicas of a deployment need not "
            "share a local zone; name an IANA zone such as 'Europe/Berlin'"
        )
    try:
        return ZoneInfo(name)
    # zoneinfo refuses a bad key with ValueError (absolute path, NUL byte), an unknown
    # one with ZoneInfoNotFoundError (a KeyError), and a directory or an over-long name
    # with OSError.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ScheduleError(
            f"unknown time zone {name!r} in {spec!r}: name an IANA zone such as 'Europe/Berlin'"
        ) from exc


def _parse_descriptor(spec: str, words: list[str], zone: ZoneInfo | None, prefix: str) -> _Parts:
    descriptor = words[0].lower()
    if descriptor == "@every":
        if zone is not None:
            raise ScheduleError(
                f"{spec!r} puts a zone on '@every', which follows no wall clock: its "
                f"instants are multiples of the period since the Unix epoch; remove {prefix!r}"
            )
        if len(words) != 2:
            raise ScheduleError(
                f"{spec!r} needs exactly one duration after '@every', e.g. '@every 5m'"
            )
        period = _parse_every_period(words[1], spec)
        return _Parts(zone, period, False, (), (), (), (), ())
    if descriptor in _DESCRIPTORS:
        if len(words) != 1:
            raise ScheduleError(f"descriptor {words[0]!r} in {spec!r} takes no arguments")
        return _parse_fields(spec, _DESCRIPTORS[descriptor].split(), zone, prefix)
    raise ScheduleError(
        f"unknown descriptor {words[0]!r} in {spec!r}: use {_DESCRIPTOR_LIST} "
        "or '@every <duration>'"
    )


def _parse_every_period(text: str, spec: str) -> int:
    """Return the whole seconds of a Go duration, refusing what ``@every`` cannot run."""
    nanoseconds = _parse_go_duration(text, spec)
    if nanoseconds < 0:
        raise ScheduleError(f"{spec!r} has a negative period: it must be at least 1s")
    if nanoseconds == 0:
        raise ScheduleError(f"{spec!r} has a zero period: it must be at least 1s")
    seconds = nanoseconds / _NANOSECONDS_PER_SECOND
    if seconds.denominator != 1:
        shown = _format_fraction(seconds)
        if seconds < 1:
            raise ScheduleError(
                f"{spec!r} has a period of {shown}s, shorter than the 1s resolution of "
                "instants: it must be a whole number of seconds, at least 1s"
            )
        raise ScheduleError(
            f"{spec!r} has a period of {shown}s: it must be a whole number of seconds"
        )
    return int(seconds)


def _parse_go_duration(text: str, spec: str) -> Fraction:
    """Return the nanoseconds of a duration in Go's ``time.ParseDuration`` syntax.

    The value is exact (a :class:`~fractions.Fraction`): Go goes through floats for
    fractional parts, which matters only for durations we refuse anyway as fractional.
    """

    def invalid(reason: str) -> ScheduleError:
        return ScheduleError(
            f"{text!r} in {spec!r} is not a duration ({reason}): {_DURATION_EXAMPLES}"
        )

    body, negative = text, False
    if body[:1] in ("+", "-"):
        negative, body = body[0] == "-", body[1:]
    if body == "0":  # Go's one unitless duration
        return Fraction(0)
    if not body:
        raise invalid("no number")
    total = Fraction(0)
    position = 0
    while position < len(body):
        match = _GO_COMPONENT.match(body, position)
        assert match is not None  # every group may be empty, so it always matches
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
        if not whole and not fraction:
            raise invalid("no number before the unit" if unit else "a lone '.'")
        if not unit:
            raise invalid("missing unit")
        if unit not in _GO_UNITS:
            raise invalid(f"unknown unit {unit!r}; use ns, us, ms, s, m or h")
        # Digits beyond these lengths overflow Go's int64 anyway; refusing them here also
        # keeps int() clear of Python's limit on converting very long digit strings.
        if len(whole) > 20 or len(fraction) > 20:
            raise invalid("too many digits")
        value = Fraction(int(whole or "0"))
        if fraction:
            value += Fraction(int(fraction), 10 ** len(fraction))
        total += value * _GO_UNITS[unit]
        position = match.end()
    if total > _GO_MAX_NANOSECONDS:
        raise invalid("longer than Go's maximum duration, about 292 years")
    return -total if negative else total


def _format_fraction(value: Fraction) -> str:
    whole, rest = divmod(value.numerator, value.denominator)
    digits = ""
    # The value came from decimal digits, so it terminates; cap the length regardless.
    while rest and len(digits) < 30:
        rest *= 10
        digit, rest = divmod(rest, value.denominator)
        digits += str(digit)
    return f"{whole}.{digits}" if digits else str(whole)


def _parse_fields(spec: str, words: list[str], zone: ZoneInfo | None, prefix: str) -> _Parts:
    if len(words) == 5:
        suggestion = " ".join([*([prefix] if prefix else []), "0", *words])
        raise ScheduleError(
            f"{spec!r} has 5 fields, but cron specs here have six, seconds first: "
            f"write {suggestion!r} to fire at second 0"
        )
    if len(words) != 6:
        raise ScheduleError(
            f"{spec!r} has {len(words)} field{'' if len(words) == 1 else 's'}; a cron spec "
            "has six, seconds first: second minute hour day-of-month month day-of-week"
        )
    canonical = [
        _screen_field(spec, spec_field, text)
        for spec_field, text in zip(_FIELDS, words, strict=True)
    ]
    sets = _expand(" ".join(canonical), spec)
    seconds, minutes, hours, days, months, weekdays = sets

    # The day fields are ORed when both are restricted and ANDed otherwise (classic cron);
    # "unrestricted" is robfig/cron's star bit: a '*' or '?' element with no step above 1.
    day_star = _is_star(words[_DAY_OF_MONTH])
    weekday_star = _is_star(words[_DAY_OF_WEEK])
    both_needed = day_star or weekday_star
    _refuse_never_firing(spec, days, months, both_needed)

    masks = []
    for first_weekday in range(7):
        mask = 0
        for day in range(1, 32):
            day_ok = day in days
            weekday_ok = (first_weekday + day - 1) % 7 in weekdays
            if (day_ok and weekday_ok) if both_needed else (day_ok or weekday_ok):
                mask |= 1 << day
        masks.append(mask)

    # Fixed-time (for the DST rule): no time-of-day field starts with '*'.
    fixed_time = not any(text.startswith("*") for text in words[:3])
    return _Parts(
        zone,
        None,
        fixed_time,
        tuple(sorted(seconds)),
        tuple(sorted(minutes)),
        tuple(sorted(hours)),
        tuple(sorted(months)),
        tuple(masks),
    )


def _screen_field(spec: str, spec_field: _Field, text: str) -> str:
    """Validate one field the way robfig/cron reads it; return it in croniter's terms.

    The result has numbers only (names resolved, leading zeros dropped, ``?`` as ``*``,
    a ``*`` inside a list as the whole range), no equal ranges (croniter widens ``5-5``
    to the whole field) and no ``a/n`` (spelt out as ``a-max/n``, the form croniter has
    had bugs with).
    """
    # The last value '*' and a step run to: Saturday for day-of-week, whose 7 is only an
    # alias of Sunday, so that "3/2" is Wednesday and Friday.
    top = 6 if spec_field.name == "day-of-week" else spec_field.high
    tokens = text.split(",")
    # croniter leaves a '*' inside a list ("*,5") unexpanded, so spell it out there; alone
    # it stays '*', which croniter expands much faster than the range.
    whole = "*" if len(tokens) == 1 else f"{spec_field.low}-{top}"
    out = []
    for token in tokens:
        base, slash, step_text = token.partition("/")
        step = ""
        if slash:
            if not _DIGITS.fullmatch(step_text):
                raise _invalid_element(spec, spec_field, token)
            if int(step_text) == 0:
                raise ScheduleError(
                    f"step 0 in {token!r} ({spec_field.name} field of {spec!r}) must be at least 1"
                )
            step = f"/{int(step_text)}"
        if base == "?":
            if spec_field.name not in ("day-of-month", "day-of-week"):
                raise ScheduleError(
                    f"'?' in the {spec_field.name} field of {spec!r} is only allowed in the "
                    "day-of-month and day-of-week fields; use '*'"
                )
            if slash:
                raise _invalid_element(spec, spec_field, token)
            out.append(whole)
            continue
        if base == "*":
            out.append(whole + step)
            continue
        low_text, dash, high_text = base.partition("-")
        low = _field_value(spec, spec_field, low_text, token)
        if not dash:
            # "a/n" is "a-top/n" (robfig/cron); spelt out so croniter never has to guess.
            out.append(f"{low}-{top}{step}" if step and low < top else f"{low}")
            continue
        high = _field_value(spec, spec_field, high_text, token)
        if high < low:
            raise ScheduleError(
                f"range {base!r} in the {spec_field.name} field of {spec!r} runs backwards: "
                f"write it as '{low}-{top},{spec_field.low}-{high}'"
            )
        # An equal range is its one value, step or not (croniter would read "5-5" as the
        # whole field, and "5/n" as a step from 5 to the end).
        out.append(f"{low}" if high == low else f"{low}-{high}{step}")
    return ",".join(out)


def _field_value(spec: str, spec_field: _Field, text: str, token: str) -> int:
    if _DIGITS.fullmatch(text):
        # Compare the text's length first: int() of thousands of digits is refused.
        value = int(text) if len(text) <= 6 else spec_field.high + 1
        if not spec_field.low <= value <= spec_field.high:
            raise ScheduleError(
                f"{spec_field.name} value {text} in {spec!r} is out of range: "
                f"{spec_field.name} must be {spec_field.allowed}"
            )
        return value
    if _NAME.fullmatch(text) and text.upper() in spec_field.names:
        return spec_field.names[text.upper()]
    raise _invalid_element(spec, spec_field, token)


def _invalid_element(spec: str, spec_field: _Field, token: str) -> ScheduleError:
    for pattern, what in _EXTENSIONS:
        if pattern.search(token):
            return ScheduleError(
                f"{token!r} in the {spec_field.name} field of {spec!r} uses {what}, a croniter "
                "extension that robfig/cron, and so cronjob, does not support; "
                "write the values out instead"
            )
    return ScheduleError(
        f"{token!r} in the {spec_field.name} field of {spec!r} is not valid: use *, a value "
        f"({spec_field.allowed}), a range (a-b), a step (*/n, a/n or a-b/n), or a list of those"
    )


def _expand(expression: str, spec: str) -> list[frozenset[int]]:
    """Return the value sets of a screened six-field expression, seconds first.

    This is the one place croniter is called, and so the one place its exceptions are
    translated. The screen in front of it should leave croniter nothing to refuse, so
    anything it raises here is a gap in the screen, reported as the spec's fault.
    """
    from croniter import croniter  # deferred: importing cronjob should stay cheap

    try:
        expanded, nth_weekdays = croniter.expand(expression, second_at_beginning=True)
    # Deliberately broad: croniter raises its own ValueError subclasses and, for
    # input it did not foresee, builtins; none of them may leak past parse().
    except Exception as exc:
        raise ScheduleError(f"{spec!r} is not a valid cron spec: {exc}") from exc
    sets = []
    for spec_field in _FIELDS:
        values = expanded[spec_field.croniter_index]
        if values == ["*"]:
            found = set(range(spec_field.low, spec_field.high + 1))
        elif all(isinstance(value, int) for value in values):
            found = set(values)
        else:
            raise ScheduleError(f"{spec!r} is not a valid cron spec: {values!r} is not a set")
        if spec_field.name == "day-of-week":
            found = {value % 7 for value in found}  # 7 is Sunday too
        sets.append(frozenset(found))
    if nth_weekdays:
        raise ScheduleError(f"{spec!r} is not a valid cron spec: nth weekdays are not supported")
    return sets


def _refuse_never_firing(
    spec: str, days: frozenset[int], months: frozenset[int], both_needed: bool
) -> None:
    """Refuse a spec whose day-of-month never occurs in its months.

    Under the OR rule any weekday of any month will do, so only the AND rule can make a
    spec that never fires. Under it, every (month, day) that exists at all falls on each
    weekday in some year (29 February included), so checking the days against the
    longest length of each month decides it, at once.
    """
    if not both_needed:
        return
    # The longest each month can be: February has its 29th in leap years.
    if any(day <= days_in_month(2000, month) for month in months for day in days):
        return
    shown_days = ",".join(str(day) for day in sorted(days))
    names = [_MONTH_FULL_NAMES[month - 1] for month in sorted(months)]
    shown_months = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    raise ScheduleError(
        f"{spec!r} never fires: day-of-month {shown_days} never occurs in {shown_months}"
    )


def _is_star(field: str) -> bool:
    """Tell whether a (valid) day field is unrestricted, as robfig/cron decides it."""
    for part in field.split(","):
        base, _, step = part.partition("/")
        if base in ("*", "?") and (not step or int(step) <= 1):
            return True
    return False
