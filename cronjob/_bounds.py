"""The schedules of schedules made of data: a spec within a start and an end, and a
one-off instant. Both answer ``next`` and ``prev`` as [Schedule][cronjob.Schedule] does,
so the scheduler runs them as it runs a registered job's."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ._schedule import Schedule, parse

__all__ = ["EARLIEST_INSTANT", "LATEST_INSTANT", "Bounded", "OneOff", "at_spec", "timing"]

_TICK = timedelta(microseconds=1)
#: The first instant a schedule made of data may name (``at``, ``start``, ``end``).
EARLIEST_INSTANT = datetime(1000, 1, 1, tzinfo=UTC)
#: The first instant past those a schedule made of data may name. Between the two, an
#: instant plus or minus the longest duration an option holds (`MAX_DURATION`: 100
#: years) stays within `datetime`'s range, years 1 to 9999, and so does its reading on
#: any zone's wall clock.
LATEST_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)


def at_spec(at: datetime) -> str:
    """The text a one-off schedule shows as its spec (``@at 2027-01-05T08:00:00Z``)."""
    return "@at " + at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Bounded(Schedule):
    """A spec's instants from ``start`` (included) to ``end`` (included)."""

    start: datetime | None = None
    end: datetime | None = None

    def __repr__(self) -> str:
        return f"Bounded({self.spec!r}, start={self.start!r}, end={self.end!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Bounded):
            return NotImplemented
        return (self.spec, self.start, self.end) == (other.spec, other.start, other.end)

    def __hash__(self) -> int:
        return hash((self.spec, self.start, self.end))

    def __reduce__(self) -> Any:
        return (Bounded, (self.spec, self.start, self.end))

    def next(self, after: datetime) -> datetime | None:
        if self.start is not None and after < self.start:
            after = self.start - _TICK  # the first instant at or after the start
        instant = Schedule.next(self, after)
        if instant is None or (self.end is not None and instant > self.end):
            return None
        return instant

    def prev(self, before: datetime) -> datetime | None:
        if self.end is not None and before > self.end:
            before = self.end + _TICK  # the last instant at or before the end
        instant = Schedule.prev(self, before)
        if instant is None or (self.start is not None and instant < self.start):
            return None
        return instant


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class OneOff(Schedule):
    """One instant, ``at`` (whole seconds, UTC); its ``spec`` is `at_spec`'s text."""

    at: datetime = field(default=datetime(1970, 1, 1, tzinfo=UTC))

    def __post_init__(self) -> None:
        assign = object.__setattr__  # frozen: this is its constructor
        assign(self, "zone", None)
        assign(self, "is_every", False)
        assign(self, "period", None)
        assign(self, "fixed_time", True)

    def __repr__(self) -> str:
        return f"OneOff({self.at.isoformat()})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OneOff):
            return NotImplemented
        return self.at == other.at

    def __hash__(self) -> int:
        return hash(self.at)

    def __reduce__(self) -> Any:
        return (OneOff, (self.spec, self.at))

    def next(self, after: datetime) -> datetime | None:
        return self.at if after < self.at else None

    def prev(self, before: datetime) -> datetime | None:
        return self.at if self.at < before else None

    def on_transition(self, instant: datetime) -> bool:
        return False

    def _dst_mark(self, instant: datetime) -> None:
        return None


def timing(
    spec: str | None,
    at: datetime | None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> Schedule:
    """The schedule of a schedule made of data: ``at``'s one instant, or ``spec``'s
    instants within ``start`` and ``end``.

    Raises:
        ScheduleError: ``spec`` does not parse (see [parse][cronjob.parse]).
    """
    if at is not None:
        at = at.astimezone(UTC).replace(microsecond=0)
        return OneOff(at_spec(at), at)
    assert spec is not None
    if start is None and end is None:
        return parse(spec)
    parse(spec)  # refused with parse's own message
    return Bounded(spec, start, end)
