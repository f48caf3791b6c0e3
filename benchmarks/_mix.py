"""The job mixes of the fleet benchmark (``bench_fleet``): which jobs, on which cron specs,
and the instants each one is due in a window.

Every job is a cron spec of six fields (seconds first, UTC) that fires once every
``period`` seconds at ``offset`` into it: its instants are the epoch seconds ``t`` with
``t % period == offset`` (UTC has no leap seconds in epoch time, so a day is 86,400 s).
The replica process (``benchmarks/workers/fleet_jobs.py``) registers the specs; the
runner counts the instants from the same ``(period, offset)``, without cronjob's own
schedule code, so a schedule bug would show as misses.

Mixes:

- ``realistic``: 70 % every minute, 20 % every 5 minutes, 8 % hourly, 2 % daily, spread
  over the seconds (and minutes, hours) as a fleet of hand-written specs would be: the
  jobs of each kind are dealt one per second in turn, so a second holds about
  ``0.7 J / 60`` every-minute jobs;
- ``every-minute``: every job every minute, dealt one per second in turn (``J / 60``
  due each second);
- ``same-second``: every job every minute at second 0, the worst case (all ``J`` due
  at one instant, none in the other 59 seconds).

Pure functions; no database.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIXES", "Job", "due_in", "due_per_instant", "mix", "names_of"]

MINUTE, FIVE, HOUR, DAY = 60, 300, 3600, 86_400

#: The realistic mix: (period, share of the jobs), in the order jobs are numbered.
REALISTIC = ((MINUTE, 0.70), (FIVE, 0.20), (HOUR, 0.08), (DAY, 0.02))

MIXES = ("realistic", "every-minute", "same-second")


@dataclass(frozen=True)
class Job:
    """One job of a mix: its name, its cron spec, and when it fires (``period``, ``offset``)."""

    name: str
    spec: str
    period: int
    offset: int


def names_of(jobs: int) -> list[str]:
    """The names of ``jobs`` jobs: ``job-000000`` … (fixed width, sorted as numbered)."""
    return [f"job-{i:06d}" for i in range(jobs)]


def _spec(period: int, offset: int) -> str:
    second, minute, hour = offset % 60, offset // 60 % 60, offset // 3600
    if period == MINUTE:
        return f"{second} * * * * *"
    if period == FIVE:
        return f"{second} {minute}-59/5 * * * *"
    if period == HOUR:
        return f"{second} {minute} * * * *"
    if period == DAY:
        return f"{second} {minute} {hour} * * *"
    raise ValueError(f"no cron spec for a period of {period} s")


def _offset(period: int, k: int) -> int:
    """The ``k``-th job of a kind: one per second in turn, then one per minute (within
    its period), so the kind's jobs spread over the whole period, seconds first."""
    if period == MINUTE:
        return k % 60
    return (k % 60) + 60 * (k // 60 % (period // 60))


def mix(name: str, jobs: int) -> list[Job]:
    """The ``jobs`` jobs of mix ``name`` (one of :data:`MIXES`), numbered in order.

    Raises:
        ValueError: an unknown mix.
    """
    names = names_of(jobs)
    if name == "same-second":
        return [Job(n, _spec(MINUTE, 0), MINUTE, 0) for n in names]
    if name == "every-minute":
        return [Job(n, _spec(MINUTE, i % 60), MINUTE, i % 60) for i, n in enumerate(names)]
    if name != "realistic":
        raise ValueError(f"unknown mix {name!r}: one of {', '.join(MIXES)}")
    result: list[Job] = []
    start = 0
    for index, (period, share) in enumerate(REALISTIC):
        # The last kind takes what rounding left, so the kinds add up to ``jobs``.
        end = jobs if index == len(REALISTIC) - 1 else start + round(jobs * share)
        for k, n in enumerate(names[start:end]):
            offset = _offset(period, k)
            result.append(Job(n, _spec(period, offset), period, offset))
        start = end
    return result


def due_in(job: Job, start: int, end: int) -> list[int]:
    """The instants (epoch seconds) of ``job`` in ``[start, end)``."""
    first = start + (job.offset - start) % job.period
    return list(range(first, end, job.period)) if first < end else []


def due_per_instant(jobs: list[Job], start: int, end: int) -> dict[int, int]:
    """How many of ``jobs`` are due at each instant of ``[start, end)`` that has any."""
    counts: dict[int, int] = {}
    for job in jobs:
        for instant in due_in(job, start, end):
            counts[instant] = counts.get(instant, 0) + 1
    return counts
