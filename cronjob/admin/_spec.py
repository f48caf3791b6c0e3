"""The schedules of the specs on record, as the status reads them: parsed once per spec,
their next instant and current period (cached: jobs share specs and moments), and a
span as an operator reads it."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from .._exceptions import ScheduleError
from .._schedule import Schedule


@functools.lru_cache(maxsize=65536)
def next_instant(schedule: Schedule, now: datetime) -> datetime | None:
    """``schedule.next(now)``, once per schedule and moment (jobs share both)."""
    return schedule.next(now)


@functools.lru_cache(maxsize=4096)
def period(schedule: Schedule, now: datetime) -> timedelta | None:
    """The current period: from the latest instant at or before ``now`` to the next."""
    latest = schedule.prev(now + timedelta(seconds=1))
    following = None if latest is None else schedule.next(latest)
    return None if latest is None or following is None else following - latest


@functools.lru_cache(maxsize=4096)
def schedule_of(spec: str | None) -> Schedule | None:
    """The schedule of ``spec`` (parsed once per spec: jobs share specs), or ``None``."""
    if spec is None:
        return None
    try:
        return Schedule(spec)
    except ScheduleError:
        return None  # a spec this release cannot parse (a newer one's): no next instant


def human(span: timedelta) -> str:
    """``2h1m``, ``90s`` -> ``1m30s``: the units that are not zero, largest first."""
    seconds = int(span.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
