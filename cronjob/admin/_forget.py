"""What an operator deletes: a retired job's record (``cronjob forget``).

Re-exported by [cronjob.admin][]. A job that no live replica registers any more (it was
renamed or removed from the code) keeps its lease row and its history, shown as retired
by `status`; [forget][cronjob.admin.forget] removes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from .._exceptions import CronjobError
from . import _scheduled
from ._base import REPLICA_LIVE_SECONDS, UnknownJob, aware, store_on, to_ms

__all__ = ["ForgetRefused", "Forgotten", "forget"]


class ForgetRefused(CronjobError, RuntimeError):
    """Raised when a job on record cannot be forgotten now; nothing was deleted.

    Attributes:
        job: The job.
        registered_by: The live replicas that register it; empty when no replica is
            live at all (then nothing tells whether the job is still in the code), and
            when a round holds its lease.
        held_by: The replica whose round holds the job's lease, when that is the
            reason (a removed schedule's round in flight, a crashed replica's round
            until its lease expires); ``None`` otherwise.
    """

    def __init__(
        self,
        message: str,
        *,
        job: str,
        registered_by: tuple[str, ...],
        held_by: str | None = None,
    ) -> None:
        super().__init__(message)
        self.job = job
        self.registered_by = registered_by
        self.held_by = held_by


@dataclass(frozen=True, slots=True, kw_only=True)
class Forgotten:
    """What [forget][cronjob.admin.forget] deleted of one job."""

    job: str
    #: Whether it had a lease row (a job known from its history alone has none).
    lease_row: bool
    #: Its rounds deleted from the history.
    rounds: int
    #: Its requests for a round now deleted (see [trigger][cronjob.admin.trigger]).
    requests: int


def forget(database: str | sa.Engine, name: str, *, now: datetime | None = None) -> Forgotten:
    """Delete job ``name``'s record: its lease row, its history and its requests for a
    round now, in one transaction.

    Meant for a retired job (`Activity.RETIRED` in [status][cronjob.admin.status]): one
    that no live replica registers any more. It is refused while a live replica registers
    it, and while no replica is live at all (nothing then tells whether the job is still
    in the code: during a deploy, say). It is refused too while a round holds the job's
    lease — a removed schedule's round in flight runs to its end, and a crashed replica's
    round keeps its lease until it expires (15 s) —: deleting the row under it would cut
    the round short with its end never on record. It does not wait: forget the job once
    the round has ended (the check and the delete are one transaction, so a round claimed
    meanwhile is never deleted under). A replica that registers the name later starts it
    afresh, as a new job.

    Args:
        database: a URL, or an engine (not disposed).
        name: the job.
        now: "now" for the replicas' liveness; the database's clock by default.

    Returns:
        What was deleted.

    Raises:
        ForgetRefused: a live replica registers ``name``, no replica is live, a round
            holds ``name``'s lease (`ForgetRefused.held_by`), or ``name`` is a live
            schedule's id (`cronjob.schedules.remove` removes a schedule; a
            removed one's record can be forgotten); nothing was deleted.
        UnknownJob: nothing of ``name`` is on record (no lease row, no round); nothing
            was deleted. A name with whitespace at its ends is never a job's (the
            internal rows of chores, such as the prune's, are named so).
        TablesMissing, SchemaOutdated, SchemaNewer: as [status][cronjob.admin.status].
        lease.DatabaseUnavailable, lease.DatabaseError: the database failed a statement.
    """
    if not isinstance(name, str) or not name or name != name.strip():
        raise UnknownJob(f"no job named {name!r} is on record")
    with store_on(database) as store:
        plan = _scheduled.read(store, ids=[name])  # a live schedule (tombstones left out)
        if plan:
            raise ForgetRefused(
                f"{name!r} is a schedule of task {plan[0].task!r}, not a retired job: "
                "remove it with cronjob.schedules.remove (its history stays until pruned, "
                "or forget it once removed); nothing was deleted",
                job=name,
                registered_by=(),
            )
        now_ms = store.now_ms() if now is None else to_ms(aware(now, "now"))
        # The one read status makes of the live replicas: their records list their jobs.
        live = store.replicas(seen_since_ms=now_ms - round(REPLICA_LIVE_SECONDS * 1000))
        registering = tuple(sorted(r.holder for r in live if name in r.jobs))
        if registering:
            raise ForgetRefused(
                f"job {name!r} is registered by live replica(s) {', '.join(registering)}: "
                "remove it from the code and deploy first; nothing was deleted",
                job=name,
                registered_by=registering,
            )
        if not live:
            if not store.known(name):
                raise UnknownJob(f"no job named {name!r} is on record")
            raise ForgetRefused(
                f"no replica is live, so nothing tells whether job {name!r} is still "
                "registered: forget it while a replica runs; nothing was deleted",
                job=name,
                registered_by=(),
            )
        forgotten = store.forget(name, unless_held=True, now_ms=now_ms)
        if forgotten is None:
            held = store.read([name]).get(name)
            holder = held.holder if held is not None and held.holder else "a replica"
            instant = "" if held is None or not held.instant else f" of {held.instant.isoformat()}"
            raise ForgetRefused(
                f"the round{instant} of {name!r} holds its lease on {holder}: forget it once "
                "the round has ended; nothing was deleted",
                job=name,
                registered_by=(),
                held_by=holder,
            )
        row, rounds, requests = forgotten
    if not (row or rounds or requests):
        raise UnknownJob(f"no job named {name!r} is on record")
    return Forgotten(job=name, lease_row=row, rounds=rounds, requests=requests)
