"""What the round history holds: a round's record, how it ended and why it ran.

The admin API ([cronjob.admin.history][]) reads these from the history table, and the
failure hooks (``on_failure``, see `cronjob.engine._failures`) receive the record of
the round that failed; both hand out the same values. Public as [cronjob.admin][]'s
``RoundRecord``, ``Outcome``, ``Why`` and ``FAILED_OUTCOMES``.
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import lease

__all__ = ["FAILED_OUTCOMES", "Outcome", "RoundRecord", "Why", "record_of"]


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
    #: The round ran past its job's ``timeout`` and was cancelled (never run again).
    TIMED_OUT = "timed_out"
    #: The round could not start within its job's ``start_deadline``: not run.
    MISSED_DEADLINE = "missed_deadline"
    #: An attempt that failed (or asked for a retry): the round runs again.
    RETRYING = "retrying"
    #: A newer instant came while it ran (``overlap="cancel_other"``): cancelled, not
    #: run again, not a failure.
    SUPERSEDED = "superseded"


#: The outcomes ``history(failed=True)`` (``cronjob history --failed``) keeps: a round
#: that did not do its work. An attempt that is retried is not among them (its round's
#: end is).
FAILED_OUTCOMES: Final = (
    Outcome.FAILED,
    Outcome.GAVE_UP,
    Outcome.TIMED_OUT,
    Outcome.MISSED_DEADLINE,
)


class Why(enum.StrEnum):
    """Why a round ran."""

    #: Its instant came.
    SCHEDULE = "schedule"
    #: Start-up or the end of a database outage owed it (the catch-up rule).
    CATCH_UP = "catch-up"
    #: Its first round was cut short: this is attempt 2.
    RERUN = "re-run"
    #: An earlier attempt failed and its job's ``retries`` allow another (same instant).
    RETRY = "retry"
    #: A per-instance job registered with ``run_at_start=True``, as its replica started.
    START = "start"
    #: An operator asked for it now (`trigger`); ``requested_by`` says who.
    MANUAL = "manual"
    #: Not a round: a note that an operator paused the job (`pause`); the record's
    #: ``replica`` is who paused it, its outcome ``'paused'``.
    PAUSE = "pause"
    #: Not a round: a note that an operator resumed the job (`resume`); outcome
    #: ``'resumed'``.
    RESUME = "resume"
    #: An instant of the past that had no round on record, run by a backfill
    #: (`cronjob.admin.backfill`); ``requested_by`` says who asked.
    BACKFILL = "backfill"
    #: Not a round: a note that a catch-up policy passed over instants no replica ran
    #: (``catch_up="latest"``'s older ones, ``"none"``, past ``catch_up_window``): from
    #: ``started`` (the first instant) through ``instant`` (the last); the outcome names
    #: the policy, ``replica`` the replica that decided.
    SKIPPED = "skipped"
    #: Not a round: a note that an operator acknowledged the missed instants up to
    #: ``instant`` (`cronjob.admin.acknowledge`); ``replica`` is who, outcome
    #: ``'acknowledged'``.
    ACK = "ack"
    #: Not a run: an unfinished round (cut short, never run again) that a later
    #: instant's claim gave up; outcome ``'given up'``, the record's ``replica`` the one
    #: that claimed the later instant.
    SUPERSEDED = "superseded"


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
    #: Who asked for a manual round (`Why.MANUAL`); ``None`` otherwise.
    requested_by: str | None = None

    @property
    def duration(self) -> timedelta:
        """How long the round ran."""
        return self.ended - self.started


def record_of(row: lease.RoundRow) -> RoundRecord:
    """The record of the history row ``row``: its ``why`` and ``outcome`` as members of
    [Why][cronjob.admin.Why] and [Outcome][cronjob.admin.Outcome], or as the string itself
    where a newer release wrote a word this one does not know."""
    why: Why | str = row.why
    with contextlib.suppress(ValueError):
        why = Why(row.why)
    outcome: Outcome | str = row.outcome
    with contextlib.suppress(ValueError):
        outcome = Outcome(row.outcome)
    return RoundRecord(
        job=row.name,
        instant=row.instant,
        attempt=row.attempt,
        replica=row.holder,
        why=why,
        started=row.started,
        ended=row.ended,
        outcome=outcome,
        error=row.error,
        trace_id=row.trace_id,
        requested_by=row.requested_by,
    )
