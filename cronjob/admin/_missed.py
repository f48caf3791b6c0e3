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
  instant: the rule skips it — except for a hand-off (below);
- **paused**: the job was paused at that instant (the pause and resume notes, and a
  pause in force);
- **outside start/end**: a schedule made of data has no instant outside its bounds.

- **skipped by its policy**: a catch-up passed it over on purpose and said so in the
  history (``catch_up="latest"`` runs the most recent of the instants owed,
  ``catch_up="none"`` none, an instant past ``catch_up_window`` is not run: see
  ``cronjob.engine._skipped``): counted apart (`JobStatus.skipped`), no problem.

A **hand-off** (a job that hands its instants to a task queue, `cronjob.contrib.handoff`:
a job or schedule with rows in the outbox, ``cronjob_outbox``, sent within the day or not
sent) owes each instant its own publication: an earlier instant's publication in flight,
or its replica that died holding the lease, accounts for no later instant. So for a
hand-off, an instant is also accounted for by its **outbox row** (the occurrence on
record: sent, unsent, or resolved obsolete), and an overrun accounts for nothing: an
instant that fell while a round held the lease, with no outbox row and no round on
record, is missed. A hand-off is told by its rows alone: one whose every instant of the
day went unrecorded, with no row unsent either, is counted as any job (see
docs/decisions.md).

What is left did not run because no replica ran the job then and no catch-up has decided
on it yet — all down, all restarting, or the database unreachable; for a hand-off, also
because a round held its lease then and no replica recorded it. A job whose replicas
are all down right now is counted too: that is the alarm's purpose. An operator who
knows why acknowledges them (`acknowledge`, ``cronjob missed NAME --ack``): those up to
the acknowledged instant stay on record (`JobStatus.missed_acknowledged`) and stop
counting as missed. A retired job (removed from the code, while some replica is live), a
per-instance job (no state on record) and a removed schedule are not.

Cost: one statement counts every job's instants on record for the day (`lease.Tally`),
and one every hand-off's instants in the outbox; a job whose count (for a hand-off, the
larger of the two) reaches its schedule's is done. Only the jobs that fall short (an
overrun, a pause, a miss) or were deployed or retimed within the day have their day's
rows read, in one statement per 500 jobs — and for the hand-offs among them, their day's
outbox instants, in one more statement per 500.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa

import lease

from .._jitter import jitter_delay
from . import _scheduled
from ._base import store_on
from ._job import Acknowledgement, JobStatus
from ._spec import schedule_of

if TYPE_CHECKING:
    from .._schedule import Schedule

__all__ = [
    "MISSED_GRACE",
    "MISSED_WINDOW",
    "Missed",
    "missed",
    "progress",
    "shown",
]

#: How far back `status` looks for missed instants.
MISSED_WINDOW: Final = timedelta(days=1)
#: How long after its instant an instant may still be claimed (a replica's claim is
#: sent at the instant; a sweep's second run, 15 s on): not counted missed before.
MISSED_GRACE: Final = timedelta(seconds=60)
WINDOW_MS: Final = round(MISSED_WINDOW.total_seconds() * 1000)
#: The most instants of one schedule looked at within the window (a schedule every
#: second has 86,400 a day).
INSTANTS_LIMIT: Final = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Missed:
    """One job's instants of the last day that no round ran, as `missed` tells them."""

    #: Nothing ran or accounted for them, nor acknowledged them: a problem.
    missed: int = 0
    #: A catch-up policy passed them over on purpose (a note in the history).
    skipped: int = 0
    #: An operator acknowledged them.
    acknowledged: int = 0
    #: The job's latest acknowledgement, if one was made within the last day or reaches
    #: past it.
    acknowledgement: Acknowledgement | None = None


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
    found: Missed | None,
    backfills: Mapping[str, tuple[int, datetime | None]],
    cancelled: Mapping[str, lease.BackfillCancellation],
) -> JobStatus:
    """``job`` with its missed instants (a problem: `status` exits non-zero), those
    skipped by its policy and those acknowledged (not a problem), its backfill's
    progress and its latest cancellation (not a problem)."""
    if found is None and job.name not in backfills and job.name not in cancelled:
        return job  # the common case: no copy (100,000 jobs in a status)
    found = found or Missed()
    missed = found.missed
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
        skipped=found.skipped,
        missed_acknowledged=found.acknowledged,
        acknowledgement=found.acknowledgement,
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
    *,
    recorded: Mapping[str, int] | None = None,
) -> dict[str, Missed]:
    """Each counted job's missed, skipped and acknowledged instants (see the module
    docstring) and its latest acknowledgement, by name; a job with none of them is left
    out. ``on_record`` is `lease.Tally.on_record` since `MISSED_WINDOW` ago, and
    ``recorded`` `lease.Tally.recorded` since then: its names are the hand-offs (none
    when it is ``None``). The rows of the jobs that fall short are read from
    ``database``."""
    handoffs = recorded or {}
    start, end = now - MISSED_WINDOW, now - MISSED_GRACE
    cache: dict[Schedule, list[datetime]] = {}
    owed: dict[str, list[datetime]] = {}
    acks: dict[str, Acknowledgement] = {}
    for job in jobs:
        row, plan = rows.get(job.name), plans.get(job.name)
        if row is None or job.per_instance or job.activity.value == "retired":
            continue
        if row.acked_through is not None and (
            row.acked_through > start or (row.acked is not None and row.acked > start)
        ):
            acks[job.name] = Acknowledgement(
                through=row.acked_through, at=row.acked, by=row.acked_by, reason=row.ack_reason
            )
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
        counted = max(on_record.get(job.name, 0), handoffs.get(job.name, 0))
        if len(due) > counted or since > start:
            owed[job.name] = due
    found = {name: Missed(acknowledgement=ack) for name, ack in acks.items()}
    if not owed:
        return found
    handed = [name for name in owed if name in handoffs]
    with store_on(database) as store:
        tally = lease.Tally(store)
        spans = tally.spans(owed, since_ms=_ms(start))
        outbox = tally.recorded_instants(handed, since_ms=_ms(start)) if handed else {}
    for name, due in owed.items():
        missed, skipped, acked = _unaccounted(
            due, spans.get(name, []), rows[name], start, now, recorded=outbox.get(name)
        )
        if missed or skipped or acked:
            found[name] = Missed(
                missed=missed, skipped=skipped, acknowledged=acked, acknowledgement=acks.get(name)
            )
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
    *,
    recorded: set[int] | None = None,
) -> tuple[int, int, int]:
    """Of ``due``, how many nothing ran or accounted for: missed, skipped by a catch-up
    policy, acknowledged (see the module docstring). ``recorded``: a hand-off's instants
    with an outbox row (epoch ms), which account for them, while no overrun does;
    ``None``: not a hand-off."""
    overruns = recorded is None  # a hand-off's instant is its own, whatever holds the lease
    ran = {span.instant_s for span in spans if span.why not in lease.NOT_SCHEDULED}
    covered: list[tuple[int, int]] = []  # (from ms, to ms): held by a round, or paused
    passed: list[tuple[int, int]] = []  # (first, last instant, ms): skipped by a policy
    paused_at: int | None = None
    for span in spans:  # oldest end first
        if span.why == lease.SKIP_NOTE:
            passed.append((span.started_ms, span.instant_s * 1000))
        elif span.why == lease.ACK_NOTE:
            continue  # on the row (``acked_through``)
        elif span.why == "pause":
            paused_at = span.ended_ms
        elif span.why == "resume":
            covered.append((_ms(start) if paused_at is None else paused_at, span.ended_ms))
            paused_at = None
        elif overruns:
            covered.append((span.started_ms, span.ended_ms))
    if row.paused is not None or paused_at is not None:
        covered.append((_ms(row.paused) if row.paused else paused_at or 0, _ms(now)))
    held = row.expires_ms is not None and row.expires_ms > _ms(now)
    if overruns and held and row.last_start:
        covered.append((_ms(row.last_start), _ms(now)))  # a round holds the lease now
    covered.sort()
    starts = [a for a, _ in covered]
    reach: list[int] = []  # the latest end among the spans that began by each one
    for _, b in covered:
        reach.append(max(b, reach[-1]) if reach else b)
    missed = skipped = acked = 0
    for instant in due:
        if int(instant.timestamp()) in ran or instant == row.instant:
            continue
        if recorded and _ms(instant) in recorded:
            continue  # a hand-off's occurrence on record
        at = _ms(instant)
        i = bisect.bisect_right(starts, at)
        if i and reach[i - 1] >= at:
            continue  # overrun by a round, or paused
        if any(first <= at <= last for first, last in passed):
            skipped += 1
        elif row.acked_through is not None and instant <= row.acked_through:
            acked += 1
        else:
            missed += 1
    return missed, skipped, acked
