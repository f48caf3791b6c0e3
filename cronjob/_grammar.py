"""Read a schedule spec's text into the value sets [Schedule][cronjob.Schedule] walks.

A spec is six cron fields, seconds first (``second minute hour day-of-month month
day-of-week``), a calendar descriptor (``@daily``) or ``@every <Go duration>``; a cron
expression or calendar descriptor may carry a ``CRON_TZ=<IANA zone>`` (or ``TZ=``)
prefix naming the wall clock it is read on. Without one it is read in UTC.

The grammar is robfig/cron's, the Go library the original package uses. croniter expands
the field sets, behind a screen that refuses the syntax croniter accepts and robfig/cron
does not (``L``, ``W``, ``#``, ``H``, ``R``, a year field, backwards ranges) and rewrites
the one form croniter reads differently (``5-5`` is minute 5, not every minute).

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

import re
from fractions import Fraction
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._calendar import days_in_month
from ._exceptions import ScheduleError

__all__ = ["SpecParts", "parse_spec"]

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


class SpecParts(NamedTuple):
    """A parsed spec: its zone and ``@every`` period, or its sorted field values."""

    zone: ZoneInfo | None
    period: int | None
    fixed_time: bool
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    day_masks: tuple[int, ...]


def parse_spec(spec: str) -> SpecParts:
    """Return the parts of ``spec``; raise [ScheduleError][cronjob.ScheduleError]
    (``TypeError`` for a non-string) naming the bad value, as [cronjob.parse][]
    documents."""
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


def _parse_descriptor(spec: str, words: list[str], zone: ZoneInfo | None, prefix: str) -> SpecParts:
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
        return SpecParts(zone, period, False, (), (), (), (), ())
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

    The value is exact (a `Fraction`): Go goes through floats for
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


def _parse_fields(spec: str, words: list[str], zone: ZoneInfo | None, prefix: str) -> SpecParts:
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
    return SpecParts(
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
