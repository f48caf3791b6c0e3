"""What an operator writes: requests for a round now (run-now), and reads back of them.

Re-exported by [cronjob.admin][]. Requests are stored in ``cronjob_trigger``, which
every replica's sweep reads, so every replica obeys without a redeploy. The pause, which
a forced request overrides, is in `_control`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

import lease

from .._clock import Clock, SystemClock
from .._exceptions import CronjobError
from . import _scheduled
from ._base import REPLICA_LIVE_SECONDS, UnknownJob, at_ms, aware, operator, store_on, to_ms
from ._control import _registered

__all__ = [
    "Refusal",
    "RequestState",
    "RequestStatus",
    "TriggerRefused",
    "TriggerRequest",
    "request_status",
    "requests",
    "trigger",
    "wait",
]


class Refusal(enum.StrEnum):
    """Why a request for a round now was not run."""

    #: A round of the job held its lease (running, or its end not yet on record): a
    #: request never queues behind it, so it never doubles a round.
    BUSY = "busy"
    #: The job is paused, and the request did not force it.
    PAUSED = "paused"
    #: A per-instance job that no live replica registers, or ``replica`` is not live:
    #: nobody to run it. (A leased job's request is written even then: see
    #: `TriggerRequest.live_replicas`.)
    NO_REPLICA = "no replica"


class TriggerRefused(CronjobError, RuntimeError):
    """Raised when a round cannot be requested now; nothing was written.

    Attributes:
        job: The job.
        why: The [Refusal][cronjob.admin.Refusal].
        running_on: For `Refusal.BUSY`, the replica holding the lease.
    """

    def __init__(self, message: str, *, job: str, why: Refusal, running_on: str | None = None):
        super().__init__(message)
        self.job = job
        self.why = why
        self.running_on = running_on


#: Where a request stands: ``lease.TriggerState`` (pending, running, cut, done, refused,
#: expired), under the name `requests` readers know it by.
RequestState = lease.TriggerState


@dataclass(frozen=True, slots=True, kw_only=True)
class TriggerRequest:
    """A request written by [trigger][cronjob.admin.trigger]."""

    job: str
    #: One id per request: one for a leased job, one per replica for a per-instance job.
    ids: tuple[int, ...]
    requested: datetime
    requested_by: str
    force: bool
    #: The replicas asked (a per-instance job); empty for a leased job.
    replicas: tuple[str, ...]
    #: When it expires if no replica has taken it (`lease.REQUEST_TTL` on).
    expires: datetime
    #: The live replicas that have the job (register it) as it was requested. Empty:
    #: none does (all restarting in a deploy, or none started yet): the request is on
    #: record and runs if a replica that has the job starts before `expires`.
    live_replicas: tuple[str, ...] = ()

    @property
    def no_live_replica(self) -> bool:
        """No live replica had the job: nobody takes the request until one starts."""
        return not self.live_replicas


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestStatus:
    """One request, as the replicas left it."""

    id: int
    job: str
    requested: datetime
    requested_by: str
    force: bool
    #: The replica asked (per-instance), else ``None``.
    replica: str | None
    #: The instant to catch up (``resume --catch-up``); ``None`` for a round now.
    instant: datetime | None
    state: RequestState
    attempt: int
    #: The replica that ran it.
    ran_on: str | None
    started: datetime | None
    ended: datetime | None
    #: How its round ended (``'succeeded'``, ``'failed'``, ``'cut short'``, ``'given
    #: up'``), or why it was not run.
    outcome: str | None
    error: str | None

    @property
    def open(self) -> bool:
        """It may still run."""
        return self.state in (RequestState.PENDING, RequestState.RUNNING, RequestState.CUT)

    @property
    def succeeded(self) -> bool:
        """Its round ran to its end and the job returned."""
        return self.outcome == "succeeded"


def trigger(
    database: str | sa.Engine,
    name: str,
    *,
    force: bool = False,
    replica: str | None = None,
    by: str | None = None,
    now: datetime | None = None,
) -> TriggerRequest:
    """Ask for one round of job ``name`` now, run by one replica within a sweep (15 s).

    The round takes the job's lease like any round, so it never overlaps one; it never
    moves the schedule (the next instant, catch-up and second runs are as without it).
    It sees ``ctx.trigger == Trigger.MANUAL``, ``ctx.requested_by`` and, as
    ``ctx.instant``, the moment of the request. It is in the history as ``'manual'``
    with who asked. Cut short, it runs a second time (still manual), as the seed says.
    A per-instance job runs on every live replica that registers it, or on ``replica``.
    A request no replica takes within `lease.REQUEST_TTL` seconds expires.

    When no live replica has a leased job (all restarting in a deploy, say), the request
    is still written — a replica that starts with the job within the ttl takes it — and
    the returned request says so: `TriggerRequest.live_replicas` is empty. A
    per-instance request names its replicas, which a restart replaces, so with none
    live it is refused (`Refusal.NO_REPLICA`) and nothing is written; so is one
    naming a ``replica`` that is not live. ``force`` overrides only the pause.

    Args:
        database: a URL, or an engine (not disposed).
        force: run even while the job is paused.
        replica: for a per-instance job, the one replica to run it.
        by: who asks; ``user@host`` of this process by default.
        now: the moment of the request on the lease clock; the database's by default.

    Raises:
        UnknownJob: no job ``name`` is on record, or ``name`` is a removed schedule's id;
            nothing was written. A live schedule's id is taken as a job's name: the
            replicas that register its task are its `TriggerRequest.live_replicas`.
        TriggerRefused: a round holds the job's lease now (`Refusal.BUSY`), it is
            paused without ``force``, or no live replica runs the per-instance job (or
            ``replica`` is not live); nothing was written.
        ValueError: ``replica`` given for a leased job, or a live replica that does not
            run the per-instance job.
    """
    who = operator() if by is None else by
    lease.check_holder(who)
    with store_on(database) as store:
        now_ms = store.now_ms() if now is None else to_ms(aware(now, "now"))
        # A schedule's id is taken as a job's name; a removed schedule's is refused.
        plan = _scheduled.refuse_removed(store, name)
        row = store.read([name]).get(name)
        targets: tuple[str | None, ...] = (None,)
        # A per-instance job has a row only once paused, a leased one only once its
        # replica's start wrote it: the live replicas' word decides.
        local, leased = _registered(store, name, now_ms)
        local = local or (plan is None and row is None and not leased and store.known(name))
        if local:
            targets = tuple(_runners(store, name, replica, now_ms))
        elif row is None and not leased:
            raise UnknownJob(f"no job named {name!r} is on record")
        elif replica is not None:
            raise ValueError(
                f"job {name!r} runs under a lease, on one replica: --replica is for "
                "per-instance jobs; nothing was written"
            )
        elif row is not None and row.expires_ms is not None and row.expires_ms > now_ms:
            raise TriggerRefused(
                f"a round of {name!r} is running on {row.holder} (its lease is held): "
                "a round now would overlap it; nothing was written",
                job=name,
                why=Refusal.BUSY,
                running_on=row.holder,
            )
        if row is not None and row.paused is not None and not force:
            raise TriggerRefused(
                f"job {name!r} is paused (by {row.paused_by}): give --force to run it "
                "anyway; nothing was written",
                job=name,
                why=Refusal.PAUSED,
            )
        live = tuple(t for t in targets if t is not None) or _leased_by(store, name, now_ms, plan)
        ids = lease.Triggers(store).request(
            name, by=who, force=force, replicas=targets, now_ms=now_ms
        )
    requested = at_ms(now_ms)
    return TriggerRequest(
        job=name,
        ids=tuple(ids),
        requested=requested,
        requested_by=who,
        force=force,
        replicas=tuple(t for t in targets if t is not None),
        expires=requested + timedelta(seconds=lease.REQUEST_TTL),
        live_replicas=live,
    )


def _leased_by(
    store: lease.LeaseStore, name: str, now_ms: int, plan: lease.ScheduleRow | None = None
) -> tuple[str, ...]:
    """The live replicas that register ``name`` under a lease (for a schedule, ``plan``:
    those that register its task)."""
    live = store.replicas(seen_since_ms=now_ms - round(REPLICA_LIVE_SECONDS * 1000))
    if plan is not None:
        return _scheduled.runners(plan.task, live)
    return tuple(sorted(r.holder for r in live if name in r.jobs and r.jobs[name][1]))


def _runners(store: lease.LeaseStore, name: str, replica: str | None, now_ms: int) -> list[str]:
    """The live replicas that register per-instance job ``name`` (or ``replica`` alone)."""
    live = store.replicas(seen_since_ms=now_ms - round(REPLICA_LIVE_SECONDS * 1000))
    runners = sorted(r.holder for r in live if name in r.jobs and not r.jobs[name][1])
    if replica is not None:
        if replica not in {r.holder for r in live}:
            raise TriggerRefused(
                f"replica {replica!r} is not live (live: "
                f"{', '.join(sorted(r.holder for r in live)) or 'none'}); nothing was written",
                job=name,
                why=Refusal.NO_REPLICA,
            )
        if replica not in runners:
            raise ValueError(
                f"replica {replica!r} is not a live replica running {name!r} (live: "
                f"{', '.join(runners) or 'none'}); nothing was written"
            )
        return [replica]
    if not runners:
        raise TriggerRefused(
            f"no live replica runs the per-instance job {name!r}; nothing was written",
            job=name,
            why=Refusal.NO_REPLICA,
        )
    return runners


def requests(
    database: str | sa.Engine,
    ids: tuple[int, ...] | None = None,
    *,
    name: str | None = None,
) -> tuple[RequestStatus, ...]:
    """The requests ``ids``, or every open one (of job ``name`` if given), oldest first.
    A pending request past `lease.REQUEST_TTL` reads as expired."""
    with store_on(database) as store:
        rows = lease.Triggers(store).read(None if ids is None else list(ids), name=name)
        now = at_ms(store.now_ms())
    return tuple(request_status(row, now) for row in rows)


def wait(
    database: str | sa.Engine,
    request: TriggerRequest,
    *,
    timeout: float | None = None,
    every: float = 0.5,
    clock: Clock | None = None,
) -> tuple[RequestStatus, ...]:
    """Wait until every round ``request`` asked for has ended (or was refused, or
    expired), reading the record every ``every`` seconds; give up after ``timeout``.

    Returns:
        The requests as they stand: check ``open`` (still running at the timeout) and
        ``succeeded``.
    """
    clock = clock or SystemClock()
    deadline = None if timeout is None else clock.monotonic() + timeout
    while True:
        found = requests(database, request.ids)
        if not any(r.open for r in found):
            return found
        if deadline is not None and clock.monotonic() >= deadline:
            return found
        clock.sleep(every if deadline is None else min(every, deadline - clock.monotonic()))


def request_status(row: lease.TriggerRow, now: datetime) -> RequestStatus:
    """``row`` as an operator reads it: pending past the ttl reads as expired."""
    state = row.state
    outcome = row.outcome
    if state is RequestState.PENDING and (now - row.requested).total_seconds() > lease.REQUEST_TTL:
        state, outcome = RequestState.EXPIRED, "expired"
    return RequestStatus(
        id=row.id,
        job=row.name,
        requested=row.requested,
        requested_by=row.requested_by,
        force=row.force,
        replica=row.replica,
        instant=row.instant,
        state=state,
        attempt=row.attempt,
        ran_on=row.holder,
        started=row.started,
        ended=row.ended,
        outcome=outcome,
        error=row.error,
    )
