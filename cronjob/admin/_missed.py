"""The missed instants `status` counts (`JobStatus.missed`), and a backfill's progress.

**Missed**: an instant of a leased job's schedule is missed when it lies within the last
day (`MISSED_WINDOW`), came more than `MISSED_GRACE` ago (its claim had time to be
sent) — with a ``jitter``, more than that grace after the round's delayed start (the
same delay every replica draws: before it the round may still start) —, came strictly
after the job was deployed (its lease row's first write,
``deployed_ms``; a schedule made of data: its creation too, and a changed timing
redeploys it) and after its timing last changed (``spec_ms``: a registered job's spec
deployed in place of another, a data schedule's spec, instant or start/end changed —
the instants of the schedule as it was are not the current one's), and nothing ran or
accounted for it:

- **ran**: the history has a round of that instant that a schedule, a catch-up, a
  second run, a retry or a backfill ran — whatever its outcome: failed, timed out,
  given up, missed its start deadline (each is on record, and alerts of its own);
- or the lease row's latest claim is that instant (its round runs now, or is re-run);
- **overrun**: a round of the job (any, a manual one too) held the lease at that
  instant: the rule skips it;
- **paused**: the job was paused at that instant (the pause and resume notes, and a
  pause in force);
- **outside start/end**: a schedule made of data has no instant outside its bounds.

What is left did not run because no replica ran the job then — all down, all restarting,
or the database unreachable (its instant was not caught up: the catch-up runs the latest
only). A job whose replicas are all down right now is counted too: that is the alarm's
purpose. A retired job (removed from the code, while some replica is live), a
per-instance job (no state on record) and a removed schedule are not.

Cost: one statement counts every job's instants on record for the day (`lease.Tally`); a
job whose count reaches its schedule's is done. Only the jobs that fall short (an overrun,
a pause, a miss) or were deployed or retimed within the day have their day's rows read,
in one statement per 500 jobs.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa

import lease

from .._jitter import jitter_delay
from . import _scheduled
from ._base import store_on
from ._job import JobStatus
from ._spec import schedule_of

if TYPE_CHECKING:
    from .._schedule import Schedule

__all__ = ["MISSED_GRACE", "MISSED_WINDOW", "missed", "progress", "shown"]

#: How far back `status` looks for missed instants.
MISSED_WINDOW: Final = timedelta(days=1)
#: How long after its instant an instant may still be claimed (a replica's claim is
#: sent at the instant; a sweep's second run, 15 s on): not counted missed before.
MISSED_GRACE: Final = timedelta(seconds=60)
WINDOW_MS: Final = round(MISSED_WINDOW.total_seconds() * 1000)
#: The most instants of one schedule looked at within the window (a schedule every
#: second has 86,400 a day).
INSTANTS_LIMIT: Final = 100_000
_NOTES: Final = ("pause", "resume")


def progress(
    rows: Sequence[lease.TriggerRow],
) -> tuple[list[lease.TriggerRow], dict[str, tuple[int, datetime | None]]]:
    """Split the open requests: those for a round now, and per job its backfill's
    instants queued and the one running (or ``None``)."""
    requests: list[lease.TriggerRow] = []
    backfills: dict[str, tuple[int, datetime | None]] = {}
    for row in rows:
        if not row.backfill:
            requests.append(row)
            continue
        queued, running = backfills.get(row.name, (0, None))
        if row.state is lease.TriggerState.QUEUED:
            queued += 1
        else:
            running = row.instant
        backfills[row.name] = (queued, running)
    return requests, backfills


def shown(
    job: JobStatus,
    missed: int,
    backfills: Mapping[str, tuple[int, datetime | None]],
    cancelled: Mapping[str, lease.BackfillCancellation],
) -> JobStatus:
    """``job`` with its missed instants (a problem: `status` exits non-zero), its
    backfill's progress and its latest cancellation (not a problem)."""
    if not missed and job.name not in backfills and job.name not in cancelled:
        return job  # the common case: no copy (100,000 jobs in a status)
    queued, running = backfills.get(job.name, (0, None))
    stop = cancelled.get(job.name)
    problems = job.problems
    if missed:
        problems += (
            f"missed: {missed} instant{'s' if missed != 1 else ''} of the last day did not run",
        )
    return dataclasses.replace(
        job,
        missed=missed,
        problems=problems,
        backfill_queued=queued,
        backfilling=running,
        backfill_cancelled=None if stop is None else stop.at,
        backfill_cancelled_by=None if stop is None else stop.by,
        backfill_cancelled_instants=0 if stop is None else stop.instants,
    )


def missed(
    database: str | sa.Engine,
    jobs: Sequence[JobStatus],
    rows: Mapping[str, lease.LeaseRow],
    plans: Mapping[str, lease.ScheduleRow | None],
    on_record: Mapping[str, int],
    now: datetime,
) -> dict[str, int]:
    """Each counted job's missed instants (see the module docstring), by name; a job
    with none is left out. ``on_record`` is `lease.Tally.on_record` since `MISSED_WINDOW`
    ago; the rows of the jobs that fall short are read from ``database``."""
    start, end = now - MISSED_WINDOW, now - MISSED_GRACE
    cache: dict[Schedule, list[datetime]] = {}
    owed: dict[str, list[datetime]] = {}
    for job in jobs:
        row, plan = rows.get(job.name), plans.get(job.name)
        if row is None or job.per_instance or job.activity.value == "retired":
            continue
        if plan is not None and plan.removed:
            continue
        schedule = _scheduled.timing_of(plan) if plan is not None else schedule_of(job.spec)
        if schedule is None:
            continue
        if schedule not in cache:
            cache[schedule] = _instants(schedule, start, end)
        # Only the schedule as it has been since its latest change is counted.
        since = max(
            start,
            row.deployed or start,
            row.spec_changed or start,
            plan.created if plan is not None else start,
        )
        due = cache[schedule][bisect.bisect_right(cache[schedule], since) :]
        jitter = job.policies.get("jitter")
        if isinstance(jitter, int | float) and jitter > 0:
            due = _started_by(job.name, due, schedule, timedelta(seconds=jitter), end)
        # The day's rounds on record count the old schedule's too: after a change (or a
        # deployment) within the day, the count cannot tell, so the rows are read.
        if len(due) > on_record.get(job.name, 0) or since > start:
            owed[job.name] = due
    if not owed:
        return {}
    with store_on(database) as store:
        spans = lease.Tally(store).spans(owed, since_ms=_ms(start))
    found = {}
    for name, due in owed.items():
        count = _unaccounted(due, spans.get(name, []), rows[name], start, now)
        if count:
            found[name] = count
    return found


def _instants(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """``schedule``'s instants in ``(start, end]``, oldest first."""
    found: list[datetime] = []
    at = schedule.next(start)
    while at is not None and at <= end and len(found) < INSTANTS_LIMIT:
        found.append(at)
        at = schedule.next(at)
    return found


def _started_by(
    name: str, due: list[datetime], schedule: Schedule, jitter: timedelta, end: datetime
) -> list[datetime]:
    """Of ``due`` (ascending, none after ``end``), those whose round of job ``name``, with
    its ``jitter``, was to start by ``end`` (now less the grace): an instant whose delayed
    start (`cronjob._jitter.jitter_delay`, as the replicas draw it) is later may still
    start, and is not missed yet. Only the instants within ``jitter`` of ``end`` are
    drawn for."""
    cut = bisect.bisect_right(due, end - jitter)
    tail = [at for at in due[cut:] if at + jitter_delay(name, at, jitter, schedule.next(at)) <= end]
    return due if len(tail) == len(due) - cut else due[:cut] + tail


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _unaccounted(
    due: list[datetime],
    spans: list[lease.RoundSpan],
    row: lease.LeaseRow,
    start: datetime,
    now: datetime,
) -> int:
    """How many of ``due`` nothing ran or accounted for (see the module docstring)."""
    ran = {span.instant_s for span in spans if span.why not in lease.NOT_SCHEDULED}
    covered: list[tuple[int, int]] = []  # (from ms, to ms): held by a round, or paused
    paused_at: int | None = None
    for span in spans:  # oldest end first
        if span.why == "pause":
            paused_at = span.ended_ms
        elif span.why == "resume":
            covered.append((_ms(start) if paused_at is None else paused_at, span.ended_ms))
            paused_at = None
        else:
            covered.append((span.started_ms, span.ended_ms))
    if row.paused is not None or paused_at is not None:
        covered.append((_ms(row.paused) if row.paused else paused_at or 0, _ms(now)))
    if row.expires_ms is not None and row.expires_ms > _ms(now) and row.last_start:
        covered.append((_ms(row.last_start), _ms(now)))  # a round holds the lease now
    covered.sort()
    starts = [a for a, _ in covered]
    reach: list[int] = []  # the latest end among the spans that began by each one
    for _, b in covered:
        reach.append(max(b, reach[-1]) if reach else b)
    count = 0
    for instant in due:
        if int(instant.timestamp()) in ran or instant == row.instant:
            continue
        at = _ms(instant)
        i = bisect.bisect_right(starts, at)
        if i and reach[i - 1] >= at:
            continue  # overrun by a round, or paused
        count += 1
    return count
