"""Calendar arithmetic and time-zone transitions for evaluating schedules.

Instants are whole seconds since the Unix epoch (UTC), as plain ``int``. A *wall* value is
the same count read off a local clock: ``wall = instant + utcoffset``. Working in integers
keeps the hot path of [cronjob.Schedule.next][] free of datetime objects and lets the
arithmetic run past the edges of `datetime.datetime` (a wall time in year 0 or
10000 near the ends of the range) without overflow.

`zoneinfo` answers "what is the offset at this instant" but does not list its
transitions, so `transitions_in_year` finds them by probing once a day and
bisecting to the second where the offset changes, and caches the result per zone and
UTC year. Probing daily assumes a zone never changes its offset twice within one day,
which holds for every zone in the tz database.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from datetime import datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

__all__ = [
    "MAX_INSTANT",
    "MIN_INSTANT",
    "SECONDS_PER_DAY",
    "Segment",
    "Transition",
    "civil_from_days",
    "days_from_civil",
    "days_in_month",
    "next_transition",
    "offset_at",
    "segment_at",
    "transitions_in_year",
    "year_of",
]

SECONDS_PER_DAY = 86_400

#: 0001-01-01T00:00:00Z, the first instant a `datetime.datetime` can hold.
MIN_INSTANT = -62_135_596_800
#: 9999-12-31T23:59:59Z, the last whole second a `datetime.datetime` can hold.
MAX_INSTANT = 253_402_300_799

# zoneinfo converts through datetime, which overflows when the local reading of an
# instant leaves years 1..9999; keep probes two days inside the range. The offset so
# close to the ends is the zone's local mean time or its last rule either way.
_PROBE_MIN = MIN_INSTANT + 2 * SECONDS_PER_DAY
_PROBE_MAX = MAX_INSTANT - 2 * SECONDS_PER_DAY

_EPOCH_NAIVE = datetime(1970, 1, 1)

_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Return the number of days from 1970-01-01 to the given proleptic Gregorian date.

    Valid for any integer year (negative, zero, beyond 9999); ``month`` is 1-12 and
    ``day`` 1-31. This is Howard Hinnant's ``days_from_civil``: it counts in 400-year
    eras with March as the first month, so the leap day falls at the end of the year.
    """
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """Return ``(year, month, day)`` for a day count from 1970-01-01; inverse of the above."""
    days += 719_468
    era = days // 146_097
    day_of_era = days - era * 146_097
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + (3 if shifted_month < 10 else -9)
    return year_of_era + era * 400 + (month <= 2), month, day


def days_in_month(year: int, month: int) -> int:
    """Return the number of days in ``month`` of ``year`` (proleptic Gregorian)."""
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return 29
    return _DAYS_IN_MONTH[month]


def year_of(instant: int) -> int:
    """Return the UTC calendar year that contains ``instant``."""
    return civil_from_days(instant // SECONDS_PER_DAY)[0]


def _year_start(year: int) -> int:
    return days_from_civil(year, 1, 1) * SECONDS_PER_DAY


def offset_at(zone: ZoneInfo, instant: int) -> int:
    """Return the UTC offset of ``zone`` at ``instant``, in whole seconds east of UTC."""
    clamped = min(max(instant, _PROBE_MIN), _PROBE_MAX)
    # fromutc() rather than datetime.fromtimestamp(): the latter goes through the C
    # library's gmtime(), which refuses instants before 1970 on some platforms.
    utc_reading = _EPOCH_NAIVE + timedelta(seconds=clamped)
    offset = zone.fromutc(utc_reading.replace(tzinfo=zone)).utcoffset()
    # ZoneInfo always answers for an aware datetime it produced itself.
    assert offset is not None
    return offset.days * SECONDS_PER_DAY + offset.seconds


class Transition(NamedTuple):
    """A change of a zone's UTC offset: from ``at`` on, ``after`` applies instead of ``before``.

    ``after > before`` skips the wall times ``[at + before, at + after)`` (spring forward);
    ``after < before`` shows the wall times ``[at + after, at + before)`` a second time,
    during the instants ``[at, at + before - after)`` (fall back).
    """

    at: int
    before: int
    after: int


class Segment(NamedTuple):
    """A stretch of instants ``[start.at or earlier, end)`` with one UTC offset.

    ``start`` is the latest real transition at or before the instant asked about (looked
    for in its UTC year and the one before), or ``None``. ``end`` is the next transition,
    or the start of the next UTC year when the year holds no further one; a schedule
    then simply carries on in the next segment with the same offset.
    """

    start: Transition | None
    offset: int
    end: int


@functools.lru_cache(maxsize=4096)
def transitions_in_year(zone: ZoneInfo, year: int) -> tuple[Transition, ...]:
    """Return the transitions of ``zone`` whose instant lies in UTC year ``year``, in order.

    The offset is probed once a day; wherever two probes disagree the change is
    bisected to the exact second. Cached: a process evaluates a handful of zones over
    a handful of years.
    """
    low, high = _year_start(year), _year_start(year + 1)
    probes = [low - 1, *range(low, high, SECONDS_PER_DAY), high - 1]
    found: list[Transition] = []
    previous = offset_at(zone, probes[0])
    for left, right in itertools.pairwise(probes):
        current = offset_at(zone, right)
        if current != previous:
            # The first instant in (left, right] whose offset differs from `previous`.
            lo, hi = left, right
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if offset_at(zone, mid) == previous:
                    lo = mid
                else:
                    hi = mid
            found.append(Transition(hi, previous, current))
        previous = current
    return tuple(found)


def _ats(transitions: tuple[Transition, ...]) -> list[int]:
    return [transition.at for transition in transitions]


def segment_at(zone: ZoneInfo, instant: int) -> Segment:
    """Return the constant-offset `Segment` of ``zone`` that contains ``instant``."""
    year = year_of(instant)
    this_year = transitions_in_year(zone, year)
    index = bisect.bisect_right(_ats(this_year), instant)
    end = this_year[index].at if index < len(this_year) else _year_start(year + 1)
    if index > 0:
        start = this_year[index - 1]
        return Segment(start, start.after, end)
    last_year = transitions_in_year(zone, year - 1)
    if last_year:
        return Segment(last_year[-1], last_year[-1].after, end)
    return Segment(None, offset_at(zone, instant), end)


def next_transition(zone: ZoneInfo, instant: int) -> Transition | None:
    """Return the first transition of ``zone`` strictly after ``instant``, looking a year ahead."""
    year = year_of(instant)
    for candidate_year in (year, year + 1):
        for transition in transitions_in_year(zone, candidate_year):
            if transition.at > instant:
                return transition
    return None
