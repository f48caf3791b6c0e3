"""What the scheduler did, read from the database the replicas share; and the pause.

Everything here reads the tables the replicas keep current (``cronjob_lease``,
``cronjob_round``, ``cronjob_replica``, see [lease][]) and needs no application module:
a job's spec is on record, so its next instant is computed from it. Only
[pause][cronjob.admin.pause], [resume][cronjob.admin.resume] and their ``_all`` forms,
[trigger][cronjob.admin.trigger] and `forget` write (the pause on the lease row, a note in
the history; a request for a round now; the deletion of a retired job's record), see
`cronjob.admin._control`, `cronjob.admin._trigger` and `cronjob.admin._forget`. Nothing
migrates: a database without the tables, or at an older revision, is an error that says
which ([TablesMissing][cronjob.admin.TablesMissing],
[SchemaOutdated][cronjob.admin.SchemaOutdated]).

Times are aware UTC datetimes. "Now" is the database's clock unless given: the same clock
the leases and the replicas' ``last_seen`` are kept on.

::

    from cronjob import admin

    report = admin.status("postgresql+psycopg://app@db/app")
    for job in report.jobs:
        print(job.name, job.last_outcome, job.consecutive_failures, job.problems)
    for record in admin.history("postgresql+psycopg://app@db/app", "send-invoices", limit=5):
        print(record.instant, record.outcome, record.error)
    admin.pause("postgresql+psycopg://app@db/app", "send-invoices", reason="API down")
    request = admin.trigger("postgresql+psycopg://app@db/app", "send-invoices", force=True)
    print(admin.wait("postgresql+psycopg://app@db/app", request, timeout=60))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import sqlalchemy as sa

import lease

from .._records import Outcome
from .._schedule import Schedule
from . import _missed, _scheduled
from ._base import REPLICA_LIVE_SECONDS
from ._base import as_enum as _enum
from ._base import at_ms as _at
from ._base import aware as _aware
from ._base import store_on as _store
from ._base import to_ms as _ms
from ._job import Activity, JobStatus
from ._outbox import OutboxStatus, read_outbox
from ._spec import human as _human
from ._spec import next_instant as _next
from ._spec import period as _period
from ._spec import schedule_of as _schedule
from ._trigger import RequestState, RequestStatus, request_status

__all__ = [
    "Activity",
    "JobStatus",
    "ReplicaStatus",
    "Status",
    "status",
]

#: The slack on top of two periods before a job without a successful end counts as
#: stale: a sweep (15 s), a lease's time-to-live (15 s), and the re-run's own start.
STALE_SLACK_SECONDS: Final = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaStatus:
    """One live replica."""

    id: str
    host: str
    pid: int
    version: str
    started: datetime
    last_seen: datetime
    #: The names it registered.
    jobs: tuple[str, ...]
    #: The tasks it registered: it runs their schedules made of data.
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    """Every job on record and the live replicas, as of ``checked_at``."""

    checked_at: datetime
    jobs: tuple[JobStatus, ...]
    replicas: tuple[ReplicaStatus, ...]
    #: The occurrences handed to a task system and not yet accepted.
    outbox: OutboxStatus = dataclasses.field(default_factory=OutboxStatus)

    @property
    def healthy(self) -> bool:
        """No job is failing, stale, registered with specs that disagree, or a schedule
        whose task no live replica registers (a retired job never is)."""
        return not any(job.problems for job in self.jobs)

    @property
    def retired(self) -> tuple[JobStatus, ...]:
        """The jobs on record that no live replica registers, while some replica is live
        (`Activity.RETIRED`), in the order of the jobs."""
        return tuple(job for job in self.jobs if job.activity is Activity.RETIRED)

    @property
    def problems(self) -> tuple[str, ...]:
        """Every job's problems, ``"name: problem"``, in the order of the jobs."""
        return tuple(f"{job.name}: {problem}" for job in self.jobs for problem in job.problems)


def status(database: str | sa.Engine, *, now: datetime | None = None) -> Status:
    """Read every job's state and the live replicas.

    A job on record that no live replica registers, while at least one replica is live,
    is retired (`Activity.RETIRED`): it has no next
    instant and no problem. A replica is live when its record was refreshed within
    `REPLICA_LIVE_SECONDS`; the one read of the
    live replicas' records that lists them tells which jobs they register. With no live
    replica (all of them restarting), nothing is retired: the jobs show as they are.

    A schedule made of data (see `cronjob.schedules`; the table is read once, in one
    query) is shown under its id with its task (`JobStatus.task`), its spec (or
    ``@at <instant>``) and its next instant within its start and end; it is never
    retired. While some replica is live and none registers its task, it has the problem
    ``no replica runs task T``. A removed schedule's lease row is hidden, unless a round
    of it still holds its lease: then it shows running, without a next instant, until
    the round ends.

    Args:
        database: a URL, or an engine (not disposed).
        now: "now" for next instants, liveness and staleness; the database's clock by
            default.

    Raises:
        TablesMissing, SchemaOutdated, SchemaNewer: the tables cannot be read as this
            release reads them; nothing was changed.
        lease.DatabaseUnavailable, lease.DatabaseError: the database failed a statement.
    """
    with _store(database) as store:
        now_ms = store.now_ms() if now is None else _ms(_aware(now, "now"))
        rows = store.read_all()
        replicas = store.replicas(seen_since_ms=now_ms - round(REPLICA_LIVE_SECONDS * 1000))
        open_requests, backfills = _missed.progress(lease.Triggers(store).read())
        tally = lease.Tally(store)
        on_record = tally.on_record(since_ms=now_ms - _missed.WINDOW_MS)
        recorded = tally.recorded(since_ms=now_ms - _missed.WINDOW_MS)
        stopped = lease.Backfills(store).cancelled(since_ms=now_ms - _missed.WINDOW_MS)
        # Every schedule made of data, tombstones too: one query, joined by name below.
        plans = {plan.id: plan for plan in _scheduled.read(store, removed=True, args=False)}
        outbox = read_outbox(store)
    checked_at = _at(now_ms)
    asked: dict[str, list[RequestStatus]] = {}
    live = {replica.holder for replica in replicas}
    for found in open_requests:
        request = request_status(found, checked_at)
        # A per-instance round whose replica is gone ended with it (no lease tells).
        if request.open and (request.replica is None or request.replica in live):
            asked.setdefault(request.job, []).append(request)
    registered: dict[str, dict[str, tuple[str, bool]]] = {}  # name -> replica -> (spec, leased)
    policies: dict[str, Mapping[str, object]] = {}
    runners: dict[str, list[str]] = {}  # task -> the live replicas that register it
    # The replica that started last wins: during a deploy, the release rolling out.
    for replica in sorted(replicas, key=lambda r: (r.started, r.holder)):
        for name, (spec, leased) in replica.jobs.items():
            registered.setdefault(name, {})[replica.holder] = (spec, leased)
            policies[name] = replica.policies.get(name, {})
        for task in replica.tasks:
            policies[task] = replica.policies.get(task, {})
            runners.setdefault(task, []).append(replica.holder)
    # A removed schedule's row is no job: hidden, unless a round of it holds its lease.
    gone = {
        name
        for name, plan in plans.items()
        if plan.removed and not _held(rows.get(name), now_ms) and name not in registered
    }
    live_plans = {name for name, plan in plans.items() if not plan.removed}
    # Each name shown, with its schedule if it is one: a name a live replica registers
    # as a job is that job, whatever the table says.
    shown = {
        name: None if name in registered else plans.get(name)
        for name in sorted((set(rows) | set(registered) | set(asked) | live_plans) - gone)
    }
    jobs = [
        _job_status(
            name,
            rows.get(name),
            registered.get(name, {}),
            replicas,
            checked_at,
            tuple(asked.get(name, ())),
            _scheduled.policies_of(plan, policies.get(name if plan is None else plan.task, {})),
            # On record (a lease row) and registered by none of the live replicas.
            retired=bool(replicas) and name in rows and name not in registered,
            plan=plan,
            runners=runners,
        )
        for name, plan in shown.items()
    ]
    late = _missed.missed(database, jobs, rows, shown, on_record, checked_at, recorded=recorded)
    return Status(
        checked_at=checked_at,
        outbox=outbox,
        jobs=tuple(_missed.shown(job, late.get(job.name), backfills, stopped) for job in jobs),
        replicas=tuple(
            ReplicaStatus(
                id=r.holder,
                host=r.host,
                pid=r.pid,
                version=r.version,
                started=r.started,
                last_seen=r.seen,
                jobs=tuple(sorted(r.jobs)),
                tasks=tuple(sorted(r.tasks)),
            )
            for r in sorted(replicas, key=lambda r: r.holder)
        ),
    )


# -- helpers -----------------------------------------------------------------------------


def _job_status(
    name: str,
    row: lease.LeaseRow | None,
    registered: dict[str, tuple[str, bool]],
    replicas: list[lease.ReplicaRow],
    now: datetime,
    requests: tuple[RequestStatus, ...] = (),
    policies: Mapping[str, object] | None = None,
    *,
    retired: bool = False,
    plan: lease.ScheduleRow | None = None,
    runners: Mapping[str, list[str]] | None = None,
) -> JobStatus:
    problems: list[str] = []
    unrun = False  # a live schedule whose task no live replica registers
    started_after: datetime | None = None
    spec: str | None
    if plan is not None:
        # A schedule made of data: its timing is its row's; the replicas running it are
        # those that register its task. Never retired: it is data, not removed code.
        spec, specs, per_instance, retired = _scheduled.shown_spec(plan), set(), False, False
        schedule = _scheduled.timing_of(plan)
        runs = (runners or {}).get(plan.task, ())
        registered = {holder: (spec, True) for holder in runs}
        unrun = bool(replicas) and not runs and not plan.removed
        if unrun:
            problems.append(_scheduled.no_replica(plan.task))
        started_after = plan.created  # a schedule added late is not stale since before
    else:
        specs = {spec for spec, _ in registered.values()}
        spec = row.spec if row is not None and row.spec is not None else None
        if spec is None and specs:
            spec = min(specs)
        if spec is not None:
            specs.add(spec)
        # A per-instance job's row exists only once it was paused: the replicas' word wins.
        per_instance = bool(registered) and not any(leased for _, leased in registered.values())
        schedule = _schedule(spec)
    if len(specs) > 1:
        problems.append("replicas registered different specs: " + ", ".join(sorted(specs)))
    # Held: a scheduled round, or a manual one (which leaves the row's state alone).
    running = row is not None and row.expires_ms is not None and row.expires_ms > _ms(now)
    # Retired: no live replica runs it, on purpose (a rename, a removal): not a problem.
    retired = retired and not running
    outcome = None if row is None else _enum(Outcome, row.last_outcome)
    failures = 0 if row is None else row.failures
    if failures and not retired:
        # The latest counted failure; an attempt being retried or a missed deadline
        # since leaves the count as it was, so it is not named here.
        counted = (Outcome.FAILED, Outcome.GAVE_UP, Outcome.TIMED_OUT)
        what = outcome if outcome in counted else "failed"
        problems.append(f"failing: {failures} round{'s' if failures != 1 else ''} in a row {what}")
    # A paused job is not run on purpose: shown as paused, never as stale.
    paused = row is not None and row.paused is not None
    quiet = paused or per_instance or retired or unrun or (plan is not None and plan.removed)
    stale = None if quiet else _stale(schedule, row, registered, replicas, now, started_after)
    if stale is not None:
        problems.append(stale)
    for request in requests:
        if request.state is RequestState.PENDING and not registered and not (retired or unrun):
            expires = request.requested + timedelta(seconds=lease.REQUEST_TTL)
            problems.append(
                f"a round requested by {request.requested_by} is pending, but no live replica "
                f"registers the job: it expires at {expires:%Y-%m-%d %H:%M:%S} UTC"
            )
    duration = None
    if row is not None and row.last_end is not None and row.last_start is not None:
        duration = row.last_end - row.last_start if row.last_end >= row.last_start else None
    skipped = None
    if row is not None and row.skipped_through is not None and schedule is not None:
        # The round that ended then: the row's instant, or the one before a later claim.
        ended = row.instant
        if ended is None or ended > row.skipped_through:
            ended = row.prev_instant
        overrun = None if ended is None else _next(schedule, ended)
        if overrun is not None and overrun <= row.skipped_through:
            skipped = row.skipped_through
    return JobStatus(
        name=name,
        spec=spec,
        zone=None if schedule is None or schedule.zone is None else schedule.zone.key,
        per_instance=per_instance,
        next_instant=(
            None
            if schedule is None or paused or retired or (plan is not None and plan.removed)
            else _next(schedule, now)
        ),
        activity=(
            Activity.RUNNING
            if running
            else Activity.RETIRED
            if retired
            else Activity.PAUSED
            if row is not None and row.paused is not None
            else Activity.ORPHANED
            if unrun
            else Activity.IDLE
        ),
        running_on=row.holder if running and row is not None else None,
        running_since=row.last_start if running and row is not None else None,
        instant=None if row is None else row.instant,
        attempt=None if row is None or row.instant is None else row.attempt,
        last_outcome=outcome if isinstance(outcome, Outcome) else None,
        last_start=None if row is None else row.last_start,
        last_end=None if row is None else row.last_end,
        last_duration=duration,
        last_success=None if row is None else row.last_success,
        last_error=None if row is None else row.last_error,
        consecutive_failures=failures,
        skipped_through=skipped,
        specs_seen=tuple(sorted(specs)) if len(specs) > 1 else (),
        problems=tuple(problems),
        paused_since=None if row is None else row.paused,
        paused_by=None if row is None else row.paused_by,
        pause_reason=None if row is None else row.pause_reason,
        paused=paused,
        requests=requests,
        policies=dict(policies or {}),
        task=name if plan is None else plan.task,
    )


def _held(row: lease.LeaseRow | None, now_ms: int) -> bool:
    """A round holds ``row``'s lease now (scheduled or manual)."""
    return row is not None and row.expires_ms is not None and row.expires_ms > now_ms


def _stale(
    schedule: Schedule | None,
    row: lease.LeaseRow | None,
    registered: dict[str, tuple[str, bool]],
    replicas: list[lease.ReplicaRow],
    now: datetime,
    started_after: datetime | None = None,
) -> str | None:
    """``"stale: ..."`` when no successful end came within two periods plus the slack
    (never succeeded: counted from the first live replica's start running it, or from
    ``started_after``, a schedule's creation, when later)."""
    if schedule is None or row is None:
        return None  # per-instance jobs keep no state; an unknown spec has no period
    period = _period(schedule, now)
    if period is None:
        return None
    allowed = 2 * period + timedelta(seconds=STALE_SLACK_SECONDS)
    since = row.last_success
    if since is None:
        # Never succeeded: count from the earliest start of a live replica running it.
        starts = [r.started for r in replicas if r.holder in registered]
        if not starts:
            return None
        since = min(starts) if started_after is None else max(min(starts), started_after)
    if now - since <= allowed:
        return None
    seen = "never" if row.last_success is None else f"last at {row.last_success.isoformat()}"
    return f"stale: no successful end within {_human(allowed)} ({seen})"
