"""What the scheduler did, read from the database the replicas share; and the pause.

Everything here reads the tables the replicas keep current (``cronjob_lease``,
``cronjob_round``, ``cronjob_replica``, see :mod:`lease`) and needs no application module:
a job's spec is on record, so its next instant is computed from it. Only :func:`pause`,
:func:`resume` and their ``_all`` forms write (the pause on the lease row, a note in the
history). Nothing migrates: a database without the tables, or at an older revision, is an
error that says which (:class:`TablesMissing`, :class:`SchemaOutdated`).

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
"""

from __future__ import annotations

import contextlib
import enum
import functools
import getpass
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, TypeVar

import sqlalchemy as sa

import lease

from ._exceptions import CronjobError, ScheduleError
from ._schedule import Schedule

__all__ = [
    "Activity",
    "JobStatus",
    "NotPausable",
    "Outcome",
    "PauseChange",
    "ReplicaStatus",
    "RoundRecord",
    "SchemaNewer",
    "SchemaOutdated",
    "Status",
    "StatusError",
    "TablesMissing",
    "UnknownJob",
    "Why",
    "history",
    "pause",
    "pause_all",
    "resume",
    "resume_all",
    "status",
]

#: A replica not seen for this long is not shown as live (four sweeps missed).
REPLICA_LIVE_SECONDS: Final = 60.0
#: The slack on top of two periods before a job without a successful end counts as
#: stale: a sweep (15 s), a lease's time-to-live (15 s), and the re-run's own start.
STALE_SLACK_SECONDS: Final = 60.0
#: The most rounds :func:`history` returns at once.
HISTORY_LIMIT: Final = 10_000
#: The revision of the tables this release reads.
REVISION: Final = "0003"

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_E = TypeVar("_E", bound=enum.StrEnum)


class Outcome(enum.StrEnum):
    """How a round ended, as recorded."""

    #: The job returned.
    SUCCEEDED = "succeeded"
    #: The job raised an error of its own (ran to its end; not retried).
    FAILED = "failed"
    #: The job raised its round's cancellation (shutdown, lease lost): it may run again.
    CUT_SHORT = "cut short"
    #: A second run cut short: the instant is given up.
    GAVE_UP = "given up"


class Activity(enum.StrEnum):
    """What a job is doing now."""

    IDLE = "idle"
    RUNNING = "running"
    #: Paused by an operator (:func:`pause`): no replica starts a round of it.
    PAUSED = "paused"


class Why(enum.StrEnum):
    """Why a round ran."""

    #: Its instant came.
    SCHEDULE = "schedule"
    #: Start-up or the end of a database outage owed it (the catch-up rule).
    CATCH_UP = "catch-up"
    #: Its first round was cut short: this is attempt 2.
    RERUN = "re-run"
    #: A per-instance job registered with ``run_at_start=True``, as its replica started.
    START = "start"
    #: An operator asked for it (reserved for issue #13).
    MANUAL = "manual"
    #: Not a round: a note that an operator paused the job (:func:`pause`); the record's
    #: ``replica`` is who paused it, its outcome ``'paused'``.
    PAUSE = "pause"
    #: Not a round: a note that an operator resumed the job (:func:`resume`); outcome
    #: ``'resumed'``.
    RESUME = "resume"


class StatusError(CronjobError):
    """Raised when the database cannot answer: the root of the errors below."""


class TablesMissing(StatusError, LookupError):
    """Raised when the database has no cronjob tables: no replica ever started on it."""


class SchemaOutdated(StatusError):
    """Raised when the cronjob tables are at an older revision than this release reads."""


class SchemaNewer(StatusError):
    """Raised when the cronjob tables are at a revision this release does not know."""


class UnknownJob(CronjobError, LookupError):
    """Raised when no job of that name is on record."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStatus:
    """One job, as the replicas left it on record."""

    name: str
    #: The spec on record (the latest replica to start wrote it); ``None`` if unknown
    #: (a row written by an older release).
    spec: str | None
    #: The IANA zone of a ``CRON_TZ=`` spec, else ``None`` (UTC).
    zone: str | None
    #: Run by every replica without a lease; such a job has no state on record.
    per_instance: bool
    #: The next instant after "now" per the spec on record.
    next_instant: datetime | None
    activity: Activity
    #: The replica running it now, and since when (the claim).
    running_on: str | None
    running_since: datetime | None
    #: The latest instant claimed, and its attempt.
    instant: datetime | None
    attempt: int | None
    last_outcome: Outcome | None
    last_start: datetime | None
    last_end: datetime | None
    last_duration: timedelta | None
    last_success: datetime | None
    #: ``"ExceptionType: message"`` of the latest failure, bounded; ``None`` after a
    #: success.
    last_error: str | None
    consecutive_failures: int
    #: The latest round overran its next instants up to here: they stay skipped.
    skipped_through: datetime | None
    #: The specs the live replicas registered, when they disagree (a rolling deploy).
    specs_seen: tuple[str, ...]
    #: One line each: failing, stale, specs that disagree. Empty when healthy.
    problems: tuple[str, ...]
    #: Paused since, by whom, why (:func:`pause`); ``None`` when not paused. A paused
    #: job with a round running shows :attr:`Activity.RUNNING`: the round runs to its end.
    paused_since: datetime | None = None
    paused_by: str | None = None
    pause_reason: str | None = None


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    """Every job on record and the live replicas, as of ``checked_at``."""

    checked_at: datetime
    jobs: tuple[JobStatus, ...]
    replicas: tuple[ReplicaStatus, ...]

    @property
    def healthy(self) -> bool:
        """No job is failing, stale, or registered with specs that disagree."""
        return not any(job.problems for job in self.jobs)

    @property
    def problems(self) -> tuple[str, ...]:
        """Every job's problems, ``"name: problem"``, in the order of the jobs."""
        return tuple(f"{job.name}: {problem}" for job in self.jobs for problem in job.problems)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRecord:
    """One round that ended, from the history."""

    job: str
    instant: datetime
    attempt: int
    replica: str
    why: Why | str
    #: On the replica's clock.
    started: datetime
    ended: datetime
    outcome: Outcome | str
    error: str | None
    trace_id: str | None

    @property
    def duration(self) -> timedelta:
        """How long the round ran."""
        return self.ended - self.started


def status(database: str | sa.Engine, *, now: datetime | None = None) -> Status:
    """Read every job's state and the live replicas.

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
    checked_at = _at(now_ms)
    registered: dict[str, dict[str, tuple[str, bool]]] = {}  # name -> replica -> (spec, leased)
    for replica in replicas:
        for name, (spec, leased) in replica.jobs.items():
            registered.setdefault(name, {})[replica.holder] = (spec, leased)
    jobs = [
        _job_status(name, rows.get(name), registered.get(name, {}), replicas, checked_at)
        for name in sorted(set(rows) | set(registered))
    ]
    return Status(
        checked_at=checked_at,
        jobs=tuple(jobs),
        replicas=tuple(
            ReplicaStatus(
                id=r.holder,
                host=r.host,
                pid=r.pid,
                version=r.version,
                started=r.started,
                last_seen=r.seen,
                jobs=tuple(sorted(r.jobs)),
            )
            for r in sorted(replicas, key=lambda r: r.holder)
        ),
    )


def history(
    database: str | sa.Engine,
    name: str,
    *,
    limit: int = 50,
    failed: bool = False,
    since: datetime | None = None,
) -> list[RoundRecord]:
    """The latest rounds of job ``name`` that ended, newest first.

    Args:
        database: a URL, or an engine (not disposed).
        name: the job.
        limit: at most this many rounds (1 to :data:`HISTORY_LIMIT`).
        failed: only rounds that failed or were given up.
        since: only rounds that ended at or after this aware time.

    Raises:
        UnknownJob: no job ``name`` is on record (no lease row, no round, no replica
            registering it).
        ValueError: ``limit`` is out of range, ``since`` is naive.
        TablesMissing, SchemaOutdated, SchemaNewer: as :func:`status`.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= HISTORY_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {HISTORY_LIMIT}, not {limit!r}")
    since_ms = None if since is None else _ms(_aware(since, "since"))
    outcomes = (Outcome.FAILED.value, Outcome.GAVE_UP.value) if failed else None
    with _store(database) as store:
        found = store.rounds(name, limit=limit, outcomes=outcomes, since_ms=since_ms)
        if not found and not store.known(name):
            raise UnknownJob(f"no job named {name!r} is on record")
    return [
        RoundRecord(
            job=row.name,
            instant=row.instant,
            attempt=row.attempt,
            replica=row.holder,
            why=_enum(Why, row.why) or row.why,
            started=row.started,
            ended=row.ended,
            outcome=_enum(Outcome, row.outcome) or row.outcome,
            error=row.error,
            trace_id=row.trace_id,
        )
        for row in found
    ]


# -- pause and resume ----------------------------------------------------------------------


#: The longest pause reason, in characters: a longer one is refused, never cut.
REASON_LENGTH: Final = lease.REASON_LENGTH


class NotPausable(CronjobError, ValueError):
    """Raised for a job that cannot be paused: a per-instance job (it has no lease row;
    not supported in this release)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseChange:
    """What :func:`pause` or :func:`resume` did to one job."""

    job: str
    #: ``False`` when the job was already in the state asked for: nothing was written.
    changed: bool
    #: Whether the job is paused now, and since when, by whom, why.
    paused: bool
    paused_since: datetime | None
    paused_by: str | None
    pause_reason: str | None
    #: A round running now (on this replica): pausing does not cancel it, it runs to
    #: its end; ``None`` when idle.
    running_on: str | None


def pause(
    database: str | sa.Engine,
    name: str,
    *,
    reason: str | None = None,
    by: str | None = None,
    now: datetime | None = None,
) -> PauseChange:
    """Pause job ``name`` on every replica: from its next instant, no replica claims it
    (the claim statement refuses a paused row), nor re-runs or catches it up. A round
    running now runs to its end. Noted in the history (:attr:`Why.PAUSE`).

    Args:
        database: a URL, or an engine (not disposed).
        reason: why, at most :data:`REASON_LENGTH` characters.
        by: who; ``user@host`` of this process by default.
        now: when, on the lease clock; the database's clock by default.

    Returns:
        The change; ``changed`` is ``False`` (nothing written) if it was paused already.

    Raises:
        UnknownJob: no job ``name`` is on record; nothing was written.
        NotPausable: ``name`` is a per-instance job; nothing was written.
        ValueError: ``reason`` is longer than :data:`REASON_LENGTH`; nothing was written.
        TablesMissing, SchemaOutdated, SchemaNewer: as :func:`status`.
    """
    return _set_paused(database, name, paused=True, reason=reason, by=by, now=now)[0]


def pause_all(
    database: str | sa.Engine,
    *,
    reason: str | None = None,
    by: str | None = None,
    now: datetime | None = None,
) -> tuple[PauseChange, ...]:
    """Pause every leased job on record (a maintenance window), as :func:`pause` each,
    in one transaction. A job a later release registers (no row yet) is not paused.
    Returns one change per job on record, sorted by name."""
    return _set_paused(database, None, paused=True, reason=reason, by=by, now=now)


def resume(
    database: str | sa.Engine,
    name: str,
    *,
    by: str | None = None,
    now: datetime | None = None,
) -> PauseChange:
    """Resume job ``name``: its next instant runs as usual. The instants skipped while
    it was paused are never run: not caught up at start-up, not re-run by the sweep.
    Noted in the history (:attr:`Why.RESUME`); ``changed`` is ``False`` (nothing
    written) if it was not paused. Raises as :func:`pause`."""
    return _set_paused(database, name, paused=False, reason=None, by=by, now=now)[0]


def resume_all(
    database: str | sa.Engine, *, by: str | None = None, now: datetime | None = None
) -> tuple[PauseChange, ...]:
    """Resume every paused job, as :func:`resume` each, in one transaction."""
    return _set_paused(database, None, paused=False, reason=None, by=by, now=now)


def _operator() -> str:
    """``user@host`` of this process: who pauses or resumes unless told."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


def _set_paused(
    database: str | sa.Engine,
    name: str | None,
    *,
    paused: bool,
    reason: str | None,
    by: str | None,
    now: datetime | None,
) -> tuple[PauseChange, ...]:
    who = _operator() if by is None else by
    if not isinstance(who, str) or not 0 < len(who) <= lease.HOLDER_LENGTH:
        raise ValueError(f"by must be 1 to {lease.HOLDER_LENGTH} characters, not {who!r}")
    if reason is not None and len(reason) > REASON_LENGTH:
        raise ValueError(
            f"the reason is {len(reason)} characters, more than the {REASON_LENGTH} kept; "
            "nothing was changed"
        )
    now_ms = None if now is None else _ms(_aware(now, "now"))
    with _store(database) as store:
        if name is not None:
            rows = store.read([name])
            if name not in rows:
                if store.known(name):
                    raise NotPausable(
                        f"job {name!r} runs on every replica without a lease (per instance):"
                        " pausing it is not supported; nothing was changed"
                    )
                raise UnknownJob(f"no job named {name!r} is on record")
        names = None if name is None else [name]
        changed = set(
            store.set_paused(names, paused=paused, by=who, reason=reason, now_ms=now_ms)
        )
        rows = store.read_all() if name is None else store.read([name])
        clock_ms = store.now_ms() if now_ms is None else now_ms
    return tuple(
        PauseChange(
            job=row.name,
            changed=row.name in changed,
            paused=row.paused is not None,
            paused_since=row.paused,
            paused_by=row.paused_by,
            pause_reason=row.pause_reason,
            running_on=(
                row.holder
                if row.state is lease.LeaseState.RUNNING
                and row.expires_ms is not None
                and row.expires_ms > clock_ms
                else None
            ),
        )
        for row in sorted(rows.values(), key=lambda row: row.name)
    )


# -- helpers -----------------------------------------------------------------------------


@contextlib.contextmanager
def _store(database: str | sa.Engine) -> Iterator[lease.LeaseStore]:
    """A store on ``database`` whose tables are at this release's revision (it never migrates)."""
    if isinstance(database, sa.Engine):
        engine, owned = database, False
    elif isinstance(database, str):
        _refuse_missing_file(database)
        engine, owned = lease.create_engine(database), True
    else:
        raise TypeError(f"database must be a URL or an Engine, not {type(database).__name__}")
    try:
        _check_revision(engine)
        yield lease.LeaseStore(engine)
    finally:
        if owned:
            engine.dispose()


def _refuse_missing_file(url: str) -> None:
    """A SQLite URL naming a file that does not exist: say so, and do not create it (as
    connecting would)."""
    parsed = sa.make_url(url)
    path = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or path in ("", ":memory:"):
        return
    if path.startswith("file:"):
        path = path[len("file:") :].split("?", 1)[0]
    if not os.path.exists(path):
        raise TablesMissing(
            f"no cronjob tables: the SQLite file {path} does not exist (no replica has "
            "started on it; nothing was changed)"
        )


def _check_revision(engine: sa.Engine) -> None:
    revision = lease.current_revision(engine)
    if revision == REVISION:
        return
    if revision is None:
        where = lease.redact(str(engine.url.render_as_string(hide_password=True)))
        raise TablesMissing(
            f"no cronjob tables in {where}: no replica has started on this database "
            "(a replica creates them as it starts; nothing was changed)"
        )
    if revision < REVISION and revision.isdigit():
        raise SchemaOutdated(
            f"the cronjob tables are at revision {revision}, older than {REVISION}, which "
            "this release reads: start a replica of this release (it migrates at start) or "
            "run lease.migrate(); nothing was changed"
        )
    raise SchemaNewer(
        f"the cronjob tables are at revision {revision}, which this release (revision "
        f"{REVISION}) does not know: use the release that migrated them"
    )


def _job_status(
    name: str,
    row: lease.LeaseRow | None,
    registered: dict[str, tuple[str, bool]],
    replicas: list[lease.ReplicaRow],
    now: datetime,
) -> JobStatus:
    specs = {spec for spec, _ in registered.values()}
    spec = row.spec if row is not None and row.spec is not None else None
    if spec is None and specs:
        spec = min(specs)
    if spec is not None:
        specs.add(spec)
    per_instance = row is None and bool(registered) and not any(
        leased for _, leased in registered.values()
    )
    schedule = _schedule(spec)
    problems: list[str] = []
    if len(specs) > 1:
        problems.append("replicas registered different specs: " + ", ".join(sorted(specs)))
    running = (
        row is not None
        and row.state is lease.LeaseState.RUNNING
        and row.expires_ms is not None
        and row.expires_ms > _ms(now)
    )
    outcome = None if row is None else _enum(Outcome, row.last_outcome)
    failures = 0 if row is None else row.failures
    if failures:
        what = outcome if outcome is not None else "failed"
        problems.append(f"failing: {failures} round{'s' if failures != 1 else ''} in a row {what}")
    # A paused job is not run on purpose: shown as paused, never as stale.
    paused = row is not None and row.paused is not None
    stale = None if paused else _stale(schedule, row, registered, replicas, now)
    if stale is not None:
        problems.append(stale)
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
        next_instant=None if schedule is None else _next(schedule, now),
        activity=(
            Activity.RUNNING
            if running
            else Activity.PAUSED
            if row is not None and row.paused is not None
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
    )


def _stale(
    schedule: Schedule | None,
    row: lease.LeaseRow | None,
    registered: dict[str, tuple[str, bool]],
    replicas: list[lease.ReplicaRow],
    now: datetime,
) -> str | None:
    """``"stale: ..."`` when no successful end came within two periods plus the slack."""
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
        since = min(starts)
    if now - since <= allowed:
        return None
    seen = "never" if row.last_success is None else f"last at {row.last_success.isoformat()}"
    return f"stale: no successful end within {_human(allowed)} ({seen})"


@functools.lru_cache(maxsize=65536)
def _next(schedule: Schedule, now: datetime) -> datetime | None:
    """``schedule.next(now)``, once per schedule and moment (jobs share both)."""
    return schedule.next(now)


@functools.lru_cache(maxsize=4096)
def _period(schedule: Schedule, now: datetime) -> timedelta | None:
    """The current period: from the latest instant at or before ``now`` to the next."""
    latest = schedule.prev(now + timedelta(seconds=1))
    following = None if latest is None else schedule.next(latest)
    return None if latest is None or following is None else following - latest


@functools.lru_cache(maxsize=4096)
def _schedule(spec: str | None) -> Schedule | None:
    """The schedule of ``spec`` (parsed once per spec: jobs share specs), or ``None``."""
    if spec is None:
        return None
    try:
        return Schedule(spec)
    except ScheduleError:
        return None  # a spec this release cannot parse (a newer one's): no next instant


def _human(span: timedelta) -> str:
    """``2h1m``, ``90s`` -> ``1m30s``: the units that are not zero, largest first."""
    seconds = int(span.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _enum(kind: type[_E], value: str | None) -> _E | str | None:
    """``value`` as a member of ``kind``; a value a newer release wrote stays a string."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        return value


def _aware(when: datetime, what: str) -> datetime:
    if not isinstance(when, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(when).__name__}")
    if when.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, not naive {when!r}")
    return when


def _ms(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(milliseconds=1)


def _at(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)
