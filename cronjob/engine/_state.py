"""The records the scheduler's parts share: a job's scheduling state and a round in flight.

Both belong to the dispatcher thread (see the package docstring, "Threads"): only the
dispatcher and the parts it calls create or change them. A round's worker thread reads
its own `Run` and sets ``ended`` once, before it hands the end back.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import lease

from .._jitter import jitter_delay
from .._records import Why
from .._registry import Job
from .._round import Outcome, Round
from .._schedule import Schedule
from ._metrics import NO_METRICS, JobMetrics
from ._pinned import NO_LIMITS, Limits, Pinned

__all__ = ["Flags", "JobState", "Killable", "Owed", "Reason", "Run", "pin"]


class Killable(Protocol):
    """A child process a round runs in: ``kill()`` ends it (SIGKILL)."""

    def kill(self) -> None: ...


#: The history's word for a reason, where it is not the reason's own value.
_WHY = {"catch-up after an outage": "catch-up", "start-up": "start", "overlap": "schedule"}


class Reason(enum.Enum):
    """Why a round runs: on its span (``cronjob.reason``) and in its start line.

    `text` is the value as a plain attribute, `why` the word the history
    keeps (``cronjob.admin.Why``): read for every round, thousands a second at scale,
    and an enum's ``value`` is a property that costs a call each time.
    """

    #: Its instant came.
    SCHEDULE = "schedule"
    #: Start-up owed it (the seed's catch-up rule).
    CATCH_UP = "catch-up"
    #: The database was unreachable at its instant; it answered again within the day.
    OUTAGE = "catch-up after an outage"
    #: Its first round was cut short (attempt 2).
    RERUN = "re-run"
    #: A per-instance job registered with ``run_at_start=True``, as its replica starts.
    START = "start-up"
    #: An operator asked for a round now (``cronjob trigger``); never moves the schedule.
    MANUAL = "manual"
    #: A further attempt of a round whose attempt failed (the job's ``retries``).
    RETRY = "retry"
    #: Its instant fell while the round before ran (``overlap="buffer_one"`` or
    #: ``"cancel_other"``): it starts as that round ends (``why=schedule`` on record).
    OVERLAP = "overlap"
    #: An instant of the past an operator asked for again (``cronjob backfill``); never
    #: moves the schedule.
    BACKFILL = "backfill"

    text: str
    why: str
    word: Why

    def __init__(self, value: str) -> None:
        self.text = value
        # The reason in the history's words: an outage's catch-up is a catch-up.
        self.why = _WHY.get(value, value)
        #: The same as a member of `cronjob.admin.Why`: the round's ``ctx.why``.
        self.word = Why(self.why)


@dataclass(eq=False, slots=True)
class JobState:
    """One registered job, as the dispatcher schedules it.

    One per job for the replica's life: slotted (no ``__dict__``), ~150 bytes instead of
    ~280 (a replica of 100,000 jobs keeps 100,000 of them).
    """

    job: Job
    #: Bumped to invalidate the job's entries in the dispatcher's heap.
    generation: int = 0
    #: Claiming or running a round: the job's next instant is not in the heap.
    busy: bool = False
    #: The round in flight, if any.
    run: Run | None = None
    #: Where the job's rounds are measured (see `cronjob.engine._metrics`).
    metrics: JobMetrics = NO_METRICS
    #: A per-instance job paused by an operator, as the latest sweep read it (a leased
    #: job's pause is in its lease row, which the claim itself reads).
    paused: bool = False
    #: What its policy asks of each round, read once per change of the job (each round's
    #: descriptor shares it, see `cronjob.engine._pinned`).
    limits: Limits = field(init=False, default=NO_LIMITS)
    #: A schedule made of data that was removed (or whose task left): never scheduled
    #: again; a round in flight ends as it runs.
    retired: bool = False
    #: The instants before the one a catch-up claims that no replica ran (counted in
    #: ``cronjob.instants.missed`` by the replica whose claim wins).
    missed: int = 0
    #: The instant its heap entry is for, while it has one (see ``Dispatcher.schedule_after``).
    due: datetime | None = None
    #: A descriptor pinned for a round of it still to be made (see `cronjob.engine._pinned`).
    pinned: Pinned | None = None
    #: A schedule made of data: when this replica saw its timing change last; a round
    #: claimed before runs as claimed, the instants after are the new timing's.
    changed: datetime | None = None
    #: The timing before that change (what a round claimed before it was bound by).
    before: Schedule | None = None
    #: What a hand-off job's next round owes besides its instant: after a round of the
    #: job that died holding the lease, or one that ran past its next instants (see
    #: `cronjob.engine._owed`).
    owed: Owed | None = None

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Take the job's policy anew (a schedule made of data whose row changed)."""
        self.limits = Limits.of(self.job.policy)

    def next_after(self, instant: datetime) -> datetime | None:
        """The job's first instant strictly after ``instant`` (``None``: none): the claim
        of ``instant`` writes it on the lease row, and the end of its round schedules it.
        Asked of the job's schedule, which every job on its spec shares and which keeps
        its last answer (see [cronjob.Schedule][]): the jobs due at one instant
        compute it once."""
        return self.job.schedule.next(instant)

    def starts_at(self, instant: datetime) -> datetime:
        """When the job's round of ``instant`` starts: the instant, or, with a ``jitter``,
        that much later (see `cronjob._jitter.jitter_delay`): the dispatcher's heap
        keeps it, and the claim goes out then."""
        jitter = self.job.policy.jitter
        if jitter is None:
            return instant
        delay = jitter_delay(self.job.name, instant, jitter, self.job.schedule.next(instant))
        return instant + delay


@dataclass(frozen=True, slots=True)
class Owed:
    """What the round of a hand-off job's ``instant`` owes besides that instant (see
    `cronjob.engine._owed`): the ``instants`` a round of its job kept from every claim,
    oldest first, to record and publish; with ``takes_over``, that round died holding
    the lease, and the outbox rows it recorded and still held are this round's to send
    at once (``Round._takes_over``)."""

    instant: datetime
    instants: tuple[datetime, ...]
    takes_over: bool


@dataclass(eq=False, slots=True, weakref_slot=True)
class Run:
    """A round in flight on this replica (slotted: an instant of 100,000 jobs at one
    second has 100,000 in flight; a leased round's ``Round`` holds it by weak reference)."""

    state: JobState
    ctx: Round
    #: What the round runs, fixed at its claim: every path reads it, never ``state.job``.
    pinned: Pinned
    #: The fencing token of the round's lease; ``None`` for a per-instance round.
    token: int | None
    #: Why the round runs.
    reason: Reason
    #: Monotonic clock time the claim was issued, or of the last successful renewal.
    renewed_at: float
    #: Monotonic clock time the claim was issued (a hand-off's overrun is counted from
    #: it, see `cronjob.engine._owed.first_kept`).
    claimed_mono: float = 0.0
    #: Monotonic clock time the lease was found lost, if it was.
    lost_at: float | None = None
    #: Set by the round's worker when the job returned or raised, before the end is
    #: recorded; the lease is still kept (renewed) until the end is settled.
    ended: bool = False
    #: The end is settled (recorded, given back, or known lost): the lease is let go.
    settled: bool = False
    #: When the job began, on the scheduler's clock (for the history).
    started: datetime | None = None
    #: An async round's task, once it runs.
    task: asyncio.Task[None] | None = None
    #: Clock time and monotonic time the job began, set by its worker.
    started_at: datetime | None = None
    started_mono: float = 0.0
    #: Monotonic clock time the round was made, to wait for a worker thread.
    queued_mono: float = 0.0
    #: The request a manual round runs for (`Reason.MANUAL`); ``None`` otherwise.
    request: lease.TriggerRow | None = None
    #: How the job ended, once it did (set by its worker; counted in the summary line).
    outcome: Outcome | None = None
    #: Its attempt failed and the round runs again after this many seconds (set by its
    #: worker with `Outcome.RETRYING`; ``None`` if the retry is given up).
    retry_delay: float | None = None
    #: The failure of the attempt that ended ``retrying``: logged in one line then, its
    #: traceback kept for the one line that tells the retry is given up (if it is).
    retry_error: BaseException | None = None
    #: It ended and waits for its retry, its lease still kept: a lease found taken meanwhile
    #: counts as lost (the retry then does not start).
    backoff: bool = False
    #: Its end is being settled: by the round's thread as the job returns or raises, or,
    #: for a round whose job outlived its timeout, by the policies before the forced
    #: exit (see ``EndRecorder.take_end``): whichever comes first, the other does nothing.
    end_taken: bool = False
    #: The child process a round of a job with ``isolation="process"`` runs in, while it
    #: runs (see `cronjob.engine._isolated`): what a forced exit kills instead.
    child: Killable | None = None


@dataclass(eq=False)
class Flags:
    """How far the scheduler's life has gone; set by the façade, read by every part.

    Each flag only ever goes from ``False`` to ``True``.
    """

    #: ``stop()`` began: no new work is started and the dispatcher returns.
    stopped: bool = False
    #: Stopped as a killed process would be: nothing more is written to the lease table.
    crashed: bool = False


def pin(state: JobState, instant: datetime, *, requested: bool = False) -> Pinned:
    """The descriptor of ``state``'s round of ``instant``, as the round is made.

    A descriptor pinned on ``state`` for that instant (a retry of it, its second run
    after it was cut short here, a jittered instant that came before its schedule
    changed) is taken, once; one for an earlier instant is dropped (a later round's
    claim leaves it nothing to do). Else the job as it is now. A manual round or a
    backfill (``requested``) always runs the job as it is now and leaves the pinned one.
    """
    held = state.pinned
    if held is not None and not requested:
        if held.instant == instant:
            state.pinned = None
            return held
        if held.instant < instant:
            state.pinned = None
    # The policy's limits as the state keeps them: read once per change, not per round.
    return Pinned(job=state.job, instant=instant, limits=state.limits)
