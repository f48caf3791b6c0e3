"""Compute a schedule's instants: [parse][cronjob.parse], [Schedule][cronjob.Schedule] and
the DST rule.

`cronjob._grammar` reads the spec (six cron fields, a descriptor or ``@every``,
an optional ``CRON_TZ=`` zone) into value sets; this module walks them. The instants
are computed here, not by croniter's iterator, whose handling of daylight-saving time
has a long history of bugs: the UTC path is integer calendar arithmetic
(`cronjob._calendar`), ``@every`` counts multiples of its period since the epoch,
and zones follow the rule in [Schedule][cronjob.Schedule] (ISC/Debian cron's).
"""

from __future__ import annotations

import enum
import functools
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

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
from ._grammar import SpecParts, parse_spec

__all__ = ["DstMark", "Schedule", "parse"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Epoch seconds no datetime has (year 1 is about -6.2e10): the memo's "nothing asked yet".
_NO_SECOND = -(1 << 62)

# Wall values are searched up to the end of year 10000: with a positive offset, a wall
# time early in year 10000 is still an instant of year 9999.
_LAST_WALL_YEAR = 10_000

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


def parse(spec: str) -> Schedule:
    """Parse a schedule spec.

    Args:
        spec: Six cron fields, seconds first (``"0 30 9 * * 1-5"``); a calendar
            descriptor (``"@daily"``); or ``"@every <Go duration>"`` (``"@every 1h30m"``).
            A cron expression or calendar descriptor may be prefixed with
            ``"CRON_TZ=<IANA zone> "`` or ``"TZ=<IANA zone> "``.

    Returns:
        The immutable [Schedule][cronjob.Schedule].

    Raises:
        ScheduleError: The spec does not parse, names ``Local`` or an unknown zone, puts
            a zone on ``@every``, has an ``@every`` period that is not a whole number of
            seconds of at least one, or never fires (``"0 0 0 30 2 *"``). The message
            names the bad value and how to fix it.
        TypeError: ``spec`` is not a string.
    """
    if type(spec) is str:
        return _kept_schedule(spec)
    return Schedule(spec)


@functools.lru_cache(maxsize=4096)
def _kept_schedule(spec: str) -> Schedule:
    """The [Schedule][cronjob.Schedule] of ``spec``, one for the jobs that share a spec (the last
    4,096 specs): it is immutable, and a replica of 100,000 jobs on a few specs kept
    100,000 equal ones (~110 bytes each). A refused spec is never kept."""
    return Schedule(spec)


@functools.lru_cache(maxsize=4096)
def _kept_parts(spec: str) -> SpecParts:
    """`parse_spec`, its answers kept for the last 4,096 specs: an application
    registers thousands of jobs on a few specs, and a parse (~0.1 ms) was most of a
    registration (100,000 jobs on 60 specs: 12.8 s to register, 2.2 s kept). A refused
    spec is never kept: it raises again each time. Called with a plain ``str`` only, so
    that a subclass's own hash and equality never reach the cache."""
    return parse_spec(spec)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Schedule:
    """When a job runs: a parsed spec that computes its instants.

    Build one with [parse][cronjob.parse] (or ``Schedule(spec)``, the same thing). Two schedules
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
    # The last question asked of next() and of prev(), with its answer, as one tuple
    # (replaced whole: safe to read from any thread). A schedule is shared by every job
    # on its spec (see parse), and the jobs due at one instant ask it the same question:
    # 1,667 jobs of a spec due at one second compute their next instant once.
    _last_next: tuple[int, datetime | None] = field(init=False)
    _last_prev: tuple[int, datetime | None] = field(init=False)

    def __post_init__(self) -> None:
        spec = self.spec
        parts = _kept_parts(str(spec)) if isinstance(spec, str) else parse_spec(spec)
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
        assign(self, "_last_next", (_NO_SECOND, None))
        assign(self, "_last_prev", (_NO_SECOND, None))

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
        start = _floor_seconds(after, "after") + 1
        return self._answer("_last_next", start, self._first_at_or_after)

    def prev(self, before: datetime) -> datetime | None:
        """Return the last instant strictly before ``before``.

        It is derived from [next][cronjob.Schedule.next] by bisection, so the two always agree:
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
        limit = floor if fraction else floor - 1
        return self._answer("_last_prev", limit, self._last_at_or_before)

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

    def _answer(self, memo: str, second: int, find: Callable[[int], int | None]) -> datetime | None:
        """``find(second)`` as an instant, kept in the attribute ``memo`` with ``second``
        (the last question asked): asked again, the kept answer."""
        last: tuple[int, datetime | None] = getattr(self, memo)
        if last[0] == second:
            return last[1]
        found = find(second)
        instant = None if found is None else _EPOCH + timedelta(seconds=found)
        object.__setattr__(self, memo, (second, instant))  # frozen: the memo only
        return instant

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
        """Classify ``instant`` against the zone's transitions (see
        [on_transition][cronjob.Schedule.on_transition])."""
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
