"""A job as `status` reads it back: what it is doing (`Activity`) and its record
(`JobStatus`).

Below `cronjob.admin._status` (which reads them) and `cronjob.admin._missed` (which
counts a job's missed instants into one): both import them from here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from .._records import Outcome
from ._trigger import RequestStatus

__all__ = ["Acknowledgement", "Activity", "JobStatus"]


class Activity(enum.StrEnum):
    """What a job is doing now."""

    IDLE = "idle"
    RUNNING = "running"
    #: Paused by an operator (`pause`): no replica starts a round of it.
    PAUSED = "paused"
    #: On record, but no live replica registers it while some replica is live (renamed
    #: or removed from the code): never stale nor failing, no next instant. `forget`
    #: removes it (see [forget][cronjob.admin.forget]).
    RETIRED = "retired"
    #: A schedule made of data whose task no live replica registers, while some replica
    #: is live (a task misspelt, or added without the ``registry=`` its replicas use):
    #: none of its instants runs until a replica registers the task. A problem too
    #: (``no replica runs task T``); unlike `RETIRED`, never on purpose.
    ORPHANED = "orphaned"


@dataclass(frozen=True, slots=True, kw_only=True)
class Acknowledgement:
    """An operator's acknowledgement of a job's missed instants (`acknowledge`)."""

    #: Every instant up to this one that no round ran stops counting as missed.
    through: datetime
    #: When it was made (the lease clock), by whom, why.
    at: datetime | None
    by: str | None
    reason: str | None


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
    #: The next instant after "now" per the spec on record; ``None`` while paused (no
    #: instant runs until it is resumed: see `paused`) and when retired (no replica
    #: runs it: see `Activity.RETIRED`).
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
    #: Paused since, by whom, why (`pause`); ``None`` when not paused. A paused
    #: job with a round running shows `Activity.RUNNING`: the round runs to its end.
    paused_since: datetime | None = None
    paused_by: str | None = None
    pause_reason: str | None = None
    #: Paused (`pause`): no instant of it runs, so it has no `next_instant`.
    paused: bool = False
    #: Requests for a round now (`trigger`) not ended yet: pending, running, or
    #: cut short and to be taken again; oldest first.
    requests: tuple[RequestStatus, ...] = ()
    #: The job's policies as the live replica that started last registered them
    #: (`cronjob.Policy.describe`: ``timeout``, ``retries``, ``retry_backoff``,
    #: ``start_deadline`` in seconds, ``pause_after_failures``, ``on_failure`` named);
    #: empty without options, or when no live replica of this release registers it.
    policies: Mapping[str, object] = dataclasses.field(default_factory=dict)
    #: The task that runs it: a schedule's task (see `cronjob.schedules`); a registered
    #: job's own name for a registered job (the default, given none).
    task: str = ""
    #: The instants of the last day that no round ran or accounted for, nor an operator
    #: acknowledged (see `cronjob.admin._missed`: overrun, paused, given up, missed
    #: deadline, skipped by its catch-up policy are accounted): any is a problem.
    missed: int = 0
    #: The instants of the last day its catch-up policy passed over on purpose
    #: (``catch_up="latest"``'s older ones, ``"none"``, past ``catch_up_window``).
    skipped: int = 0
    #: The missed instants of the last day an operator acknowledged (`acknowledge`), and
    #: the latest acknowledgement (within the day, or reaching past it); not a problem.
    missed_acknowledged: int = 0
    acknowledgement: Acknowledgement | None = None
    #: A backfill's instants queued (see [backfill][cronjob.admin.backfill]), and the one
    #: running now (``None``: none).
    backfill_queued: int = 0
    backfilling: datetime | None = None
    #: Its backfill's latest cancellation within the last day (see
    #: [cancel_backfill][cronjob.admin.cancel_backfill]): when, by whom, instants closed.
    backfill_cancelled: datetime | None = None
    backfill_cancelled_by: str | None = None
    backfill_cancelled_instants: int = 0

    def __post_init__(self) -> None:
        if not self.task:
            object.__setattr__(self, "task", self.name)  # frozen: this is its constructor
