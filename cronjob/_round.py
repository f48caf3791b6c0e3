"""The round: one run of a job for one instant, and what the job sees of it."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from ._exceptions import Cancelled, LeaseLost, Retry
from ._occurrence import occurrence_id
from ._records import Why

if TYPE_CHECKING:
    from sqlalchemy import Connection, Dialect, Select
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ._clock import Clock, ClockEvent
    from ._schedule import Schedule

__all__ = ["Outcome", "Round", "Trigger", "classify"]


class Trigger(enum.StrEnum):
    """What started a round (`Round.trigger`)."""

    #: The schedule: its instant came (also a catch-up, a second run, a retry, a start-up
    #: round: [Round.why][cronjob.Round] tells them apart).
    SCHEDULE = "schedule"
    #: An operator asked for it now (``cronjob trigger``, `cronjob.admin.trigger`).
    MANUAL = "manual"
    #: An operator asked for an instant of the past (``cronjob backfill``,
    #: `cronjob.admin.backfill`): ``ctx.instant`` is that instant.
    BACKFILL = "backfill"


#: A round's `Round.why` when none is given: its trigger's.
_TRIGGER_WHY = {
    Trigger.SCHEDULE: Why.SCHEDULE,
    Trigger.MANUAL: Why.MANUAL,
    Trigger.BACKFILL: Why.BACKFILL,
}


class Outcome(enum.Enum):
    """How a round ended.

    `text` is the value as a plain attribute (an enum's ``value`` is a property
    that costs a call each time; read for every round).
    """

    #: The job returned: the round ran to its end.
    SUCCEEDED = "succeeded"
    #: The job raised an error of its own: the round ran to its end (logged; retried only
    #: with the job's ``retries``, each attempt but the last then ending ``retrying``).
    FAILED = "failed"
    #: The job raised the round's cancellation: the round may run a second time.
    CUT_SHORT = "cut short"
    #: The round ran past its job's ``timeout`` and was cancelled (never run again).
    TIMED_OUT = "timed_out"
    #: The round could not start within its job's ``start_deadline``: not run.
    MISSED_DEADLINE = "missed_deadline"
    #: This attempt failed (or asked for a retry) and the round runs again.
    RETRYING = "retrying"
    #: A newer instant came while it ran (``overlap="cancel_other"``): cancelled with
    #: [Superseded][cronjob.Superseded], never run again, not a failure.
    SUPERSEDED = "superseded"

    text: str

    def __init__(self, value: str) -> None:
        self.text = value


#: Opens the fenced transaction of a round: ``transaction(round)``.
TransactionFactory = Callable[["Round"], contextlib.AbstractContextManager["Connection"]]
#: Opens the fenced transaction of an async round: ``transaction_async(round)``.
AsyncTransactionFactory = Callable[
    ["Round"], contextlib.AbstractAsyncContextManager["AsyncConnection"]
]
#: Writes for many rounds in one transaction fenced by one check of all their leases:
#: ``writes(rounds, work)`` calls ``work(conn, holding)`` (``holding[i]``: ``rounds[i]``
#: still holds its lease and may write), commits, and returns each round's fate:
#: ``None`` (written) or what it raises. See ``cronjob.engine._fencing.Fencing.write_many``.
GroupWrites = Callable[
    [Sequence["Round"], Callable[["Connection", list[bool]], None]], list[Exception | None]
]
#: Checks a round's lease inside a transaction on a connection that is not SQLAlchemy's
#: (a framework's ORM): ``fence(round, dialect, fetch, final)`` hands ``fetch`` the check's
#: statement, ``fetch`` runs it on that connection and tells whether it found a row; a
#: lease not held raises `LeaseLost`. See ``cronjob.contrib.django.fenced``.
FenceCheck = Callable[["Round", "Dialect", Callable[["Select[int]"], bool], bool], None]


#: Guards every round's cancellation and wake-up (rare, brief): one lock for all rather
#: than one made per round, thousands a second at scale.
_CANCEL_LOCK = threading.Lock()


class Round:
    """What a job receives: the identity of its round and the means to stop early.

    Attributes:
        name: The job's name.
        instant: The scheduled instant this round runs for, an aware UTC datetime — the
            same on a second run and on a catch-up. For a manual round, the moment the
            request was made (lease clock, to the millisecond).
        attempt: 1, or 2 for the second run of a round cut short; with the job's
            ``retries``, each further attempt of the instant counts on (2, 3, …).
        trigger: `Trigger.SCHEDULE`, or `Trigger.MANUAL` for a round an
            operator asked for (`Trigger.BACKFILL` for an instant of the past); a
            manual round never moves the schedule.
        why: Why this round runs, in the words of its history row
            ([cronjob.admin.Why][cronjob.admin.Why]): ``SCHEDULE`` (its instant came,
            also a round that waited for the one before, ``overlap=``), ``CATCH_UP``
            (an instant start-up or the end of a database outage owed), ``RERUN`` (the
            second run of a round cut short), ``RETRY`` (a further attempt, the job's
            ``retries``), ``START`` (``run_at_start=True``), ``MANUAL``, ``BACKFILL``.
            A job that must not redo a catch-up's work late checks
            ``ctx.why is Why.CATCH_UP``; ``trigger`` stays ``SCHEDULE`` for all but
            the last two.
        requested_by: Who asked for a manual round (``user@host`` unless told); ``None``
            for a scheduled one.
        trace_id: The round's trace id (32 hex digits, W3C format), in its logs and SQL.
        replica: The id of the replica running the round.

    A round of a schedule made of data (see `cronjob.schedules`) has the schedule's id as
    its ``name``; [task][cronjob.Round.task] and [args][cronjob.Round.args] tell which
    task runs it and with what.
    """

    __slots__ = (
        "_cause",
        "_clock",
        "_data",
        "_event",
        "_fence",
        "_owed",
        "_run",
        "_schedule",
        "_takes_over",
        "_transaction",
        "_transaction_async",
        "_woken",
        "_writes",
        "app",
        "attempt",
        "instant",
        "name",
        "replica",
        "requested_by",
        "trace_id",
        "trigger",
        "why",
    )

    def __init__(
        self,
        *,
        name: str,
        instant: datetime,
        attempt: int,
        replica: str,
        trace_id: str,
        clock: Clock,
        transaction: TransactionFactory,
        transaction_async: AsyncTransactionFactory | None = None,
        fence: FenceCheck | None = None,
        writes: GroupWrites | None = None,
        trigger: Trigger = Trigger.SCHEDULE,
        requested_by: str | None = None,
        why: Why | None = None,
        task: str | None = None,
        args: str | None = None,
        app: str = "",
    ) -> None:
        self.name = name
        #: The application's name, in the occurrence id (``Scheduler(app=...)``).
        self.app = app
        # A schedule's (task, JSON text of its args); None for a registered job's round.
        self._data = None if task is None else (task, args or "{}")
        self.trigger = trigger
        self.why = why if why is not None else _TRIGGER_WHY[trigger]
        self.requested_by = requested_by
        self.instant = instant
        self.attempt = attempt
        self.replica = replica
        self.trace_id = trace_id
        self._clock = clock
        # Made on the first wait: most rounds never wait, and an event is a lock and a
        # condition, made per round by the thousand at scale.
        self._event: ClockEvent | None = None
        self._woken = False
        self._cause: Cancelled | None = None
        self._transaction = transaction
        self._transaction_async = transaction_async
        self._fence = fence  # None: no lease to check (a round built by make_round)
        #: Writes for this round and the others waiting to write at once, in one fenced
        #: transaction (a hand-off's group record, ``cronjob.contrib._records``); the
        #: rounds of one scheduler share it. None (a round no scheduler made, or a child
        #: process's): the round writes in its own ``transaction``.
        self._writes = writes
        #: The scheduler's record of this round (its ``Run``, or a weak reference to a
        #: leased round's), for the factories above: they are made once per scheduler,
        #: not once per round.
        self._run: object = None
        #: The schedule the round was claimed under (its pinned descriptor's), for a job
        #: that bounds its work by the next instant (a hand-off); ``None``: unknown.
        self._schedule: Schedule | None = None
        #: Earlier instants of a hand-off job that this round owes (a round of its job
        #: held the lease over them, dead or running past them: see
        #: `cronjob.engine._owed`), oldest first; empty for nearly every round.
        self._owed: tuple[datetime, ...] = ()
        #: A round of its job died holding the lease before this one (a claim gave it
        #: up, or this is its second run): the outbox rows that round recorded and still
        #: held are this round's to send (a hand-off's, see `cronjob.contrib.handoff`).
        self._takes_over = False

    @property
    def occurrence_id(self) -> str:
        """This round's occurrence id: [occurrence_id][cronjob.occurrence_id] of its name and
        instant (and its scheduler's ``app``), the same on every replica and in a second
        run or a catch-up of the instant (a manual round's instant is its request's
        moment)."""
        return occurrence_id(self.name, self.instant, app=self.app)

    @property
    def task(self) -> str:
        """The task that runs this round: a schedule's task, or a registered job's own
        name."""
        data = self._data
        return self.name if data is None else data[0]

    @property
    def args(self) -> dict[str, Any]:
        """The schedule's arguments, decoded from their JSON anew at each read (the
        round may change what it is given); ``{}`` for a registered job."""
        data = self._data
        return {} if data is None else json.loads(data[1])

    def __repr__(self) -> str:
        state = f" cancelled ({self._cause})" if self._cause else ""
        manual = (
            "" if self.trigger is Trigger.SCHEDULE else f" {self.trigger} ({self.requested_by})"
        )
        return (
            f"<Round {self.name!r} {self.instant.isoformat()} attempt {self.attempt}"
            f"{manual} on {self.replica!r}{state}>"
        )

    @property
    def cancelled(self) -> bool:
        """Whether the round has been cancelled (shutdown, lease lost or timed out)."""
        return self._cause is not None

    @property
    def cause(self) -> Cancelled | None:
        """Why the round was cancelled: a [Shutdown][cronjob.Shutdown],
        [LeaseLost][cronjob.LeaseLost] or [TimedOut][cronjob.TimedOut], or None."""
        return self._cause

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` on the scheduler's clock, waking early if the round is cancelled.

        Returns:
            ``True`` as soon as the round is cancelled (at once if it already is),
            ``False`` once the time has passed.
        """
        return self._waker().wait(max(0.0, seconds))

    async def wait_async(self, seconds: float) -> bool:
        """Like [wait][cronjob.Round.wait], for an async job.

        An async round is also cancelled as an asyncio task: a cancellation that arrives
        while the job awaits raises `asyncio.CancelledError` there, which counts as
        the round cut short.
        """
        return await self._waker().wait_async(max(0.0, seconds))

    def retry_in(self, seconds: float) -> NoReturn:
        """Ask for another attempt of this round in ``seconds``: raises [Retry][cronjob.Retry].

        Let it propagate out of the job. Whether the retry happens is the job's policy's
        to say (``retries``, and never after the job's next instant is due).

        Raises:
            Retry: always, carrying ``seconds``.
            ValueError: ``seconds`` is negative or NaN.
        """
        raise Retry(seconds)

    def check(self) -> None:
        """Raise the round's cancellation if it has been cancelled; return otherwise.

        Raises:
            Shutdown: the scheduler is draining.
            LeaseLost: the round's lease was taken or could not be renewed.
            TimedOut: the round ran past its job's ``timeout``.
        """
        cause = self._cause
        if cause is not None:
            raise type(cause)(*cause.args)

    def transaction(self) -> contextlib.AbstractContextManager[Connection]:
        """Open a transaction on the scheduler's database, fenced by the round's lease.

        For a leased job the transaction checks, inside itself, that this round still
        holds its lease (its fencing token changes on every claim) when it opens and again
        just before it commits; if the lease is gone it rolls back and raises
        [LeaseLost][cronjob.LeaseLost]. A per-instance round gets a plain transaction.

        Returns:
            A context manager yielding a SQLAlchemy `Connection`;
            leaving the block commits, an exception rolls back.
        """
        return self._transaction(self)

    def transaction_async(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """Like [transaction][cronjob.Round.transaction], for an async job: ``async with
        ctx.transaction_async()``.

        The transaction runs on an `AsyncEngine`, so the
        job's event loop keeps serving other tasks while it waits on the database. It is
        fenced as [transaction][cronjob.Round.transaction] is: for a leased job it checks,
        inside itself, that the round still holds its lease when it opens and again just
        before it commits, and otherwise rolls back and raises
        [LeaseLost][cronjob.LeaseLost]; a per-instance round gets a plain transaction.

        The engine is the one the scheduler was given, if it was an ``AsyncEngine`` (or an
        async URL); otherwise one the scheduler creates on the same database with the
        matching async driver (psycopg's async mode or asyncpg, aiosqlite, aiomysql or
        asyncmy) and disposes at stop.

        Returns:
            An async context manager yielding a SQLAlchemy
            `AsyncConnection`; leaving the block commits,
            an exception rolls back.

        Raises:
            LeaseLost: the round no longer holds its lease (at the start or at the end).
            lease.DatabaseError: no async driver for the database is installed (the
                message names what to install).
        """
        if self._transaction_async is None:
            raise RuntimeError(f"round of job {self.name!r} has no async transactions")
        return self._transaction_async(self)

    # -- used by the scheduler ----------------------------------------------------------

    def _cancel(self, cause: Cancelled, *, wake: bool = True) -> bool:
        """Cancel the round with ``cause``; the first cause wins. Returns True if it did.

        With ``wake=False`` only the cause is recorded; the caller wakes waiters later
        with `_wake` (after delivering an async task's cancellation).
        """
        with _CANCEL_LOCK:
            if self._cause is not None:
                return False
            self._cause = cause
        if wake:
            self._wake()
        return True

    def _wake(self) -> None:
        with _CANCEL_LOCK:
            self._woken = True
            event = self._event
        if event is not None:
            event.set()

    def _waker(self) -> ClockEvent:
        """The event [wait][cronjob.Round.wait] waits on: set once the round is woken
        (cancelled)."""
        event = self._event
        if event is None:
            with _CANCEL_LOCK:
                if self._event is None:
                    self._event = self._clock.event()
                    if self._woken:
                        self._event.set()
                event = self._event
        return event


def classify(error: BaseException | None) -> Outcome:
    """Tell a round cut short from one that ran to its end, from what the job raised.

    Cut short: the job raised a [Cancelled][cronjob.Cancelled] (what ``ctx.check()`` raises), an
    exception group containing one (the job's own failures beside it are logged), or,
    for an async job, `asyncio.CancelledError`. Anything else ran to its end:
    a return is a success; any other exception — a failure of the job's own, including
    one that merely chains a cancellation as its cause — is a failure.
    """
    if error is None:
        return Outcome.SUCCEEDED
    if isinstance(error, Cancelled | asyncio.CancelledError):
        return Outcome.CUT_SHORT
    if isinstance(error, BaseExceptionGroup):
        match, _rest = error.split((Cancelled, asyncio.CancelledError))
        if match is not None:
            return Outcome.CUT_SHORT
    return Outcome.FAILED


def iter_own_errors(error: BaseException) -> Iterator[BaseException]:
    """Yield the job's own failures inside an exception group beside its cancellation."""
    if isinstance(error, BaseExceptionGroup):
        _match, rest = error.split((Cancelled, asyncio.CancelledError))
        if rest is not None:
            yield rest


def lease_lost(name: str, reason: str) -> LeaseLost:
    """Build the cancellation cause of a round whose lease is gone."""
    return LeaseLost(f"job {name!r}: lease lost: {reason}")
