"""Handing an instant to a task queue: what every target (Celery, RQ, Dramatiq) shares.

A *publisher* knows one task system and how to put one message on it. `handoff` turns a
publisher into a job function: the round that claims an instant records an *occurrence*
in the outbox (in its fenced transaction), has the publisher send it with the
occurrence id as the message's own id, and marks it sent once the broker accepted it.

`Handoff` is the job function `handoff` returns: it carries its publisher, so that the
sweep of any replica, which finds a job by its name, can send an unsent occurrence again
([Handoff.resend][cronjob.contrib.Handoff.resend]) with the same id. See
docs/concepts/outbox.md for the whole story and docs/decisions.md for why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from opentelemetry import propagate

import lease

from .._exceptions import RegistrationError
from ..engine import Resent
from . import _records
from ._outbox import (
    claim,
    count_accepted,
    count_refused,
    mark,
    occurrence_of,
    put_off_invalid,
    to_send,
)
from ._retries import (
    HOLD_SECONDS,
    RETRY_FIRST,
    RETRY_LONGEST,
    RETRY_PAUSES,
    RETRY_WITHIN,
    SEND_LEAST,
    SEND_TIMEOUT,
    NotPublished,
    knobs,
    retry_pause,
    round_bound,
    warn_overrun,
)
from ._sender import Occurrence, Publisher, Sender

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .._round import Round
    from .._schedule import Schedule

__all__ = [
    "HOLD_SECONDS",
    "RETRY_FIRST",
    "RETRY_LONGEST",
    "RETRY_PAUSES",
    "RETRY_WITHIN",
    "SEND_TIMEOUT",
    "Handoff",
    "NotPublished",
    "Occurrence",
    "Publisher",
    "handoff",
]

log = logging.getLogger("cronjob")


def _now_ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


class Handoff:
    """A job function that hands each instant to a task system (see `handoff`).

    Attributes:
        publisher: What puts the messages on the broker.
        retry_within: Seconds the round retries a refused send before it leaves it to
            the sweep; ``None``: derived, until shortly before the job's next instant.
        hold: Seconds an attempt keeps its row from the other retriers (given, or
            `HOLD_SECONDS`).
        send_timeout: Seconds one send waits for the broker's answer, below ``hold``
            (given, or `SEND_TIMEOUT` capped at half the hold).
        leased_only: ``True``: registration refuses it as a per-instance job, which every
            replica would run, each publishing the instant once more.
        isolatable: ``False``: registration refuses it with ``isolation="process"``. It
            holds its publisher's thread and the sends it gave up on, which are this
            replica's: a child process could neither import it by name nor share them.
    """

    leased_only = True
    isolatable = False
    #: Each round publishes its instant: the engine hands a round the instants an earlier
    #: round of the job kept from every claim (one that died holding the lease, or one
    #: that ran past them: ``cronjob.engine._owed``), which it records and publishes
    #: before its own.
    publishes = True

    def __init__(
        self,
        publisher: Publisher,
        *,
        retry_within: float | None = None,
        hold: float | None = None,
        send_timeout: float | None = None,
    ) -> None:
        target = getattr(publisher, "target", None)
        if not isinstance(target, str) or not target or len(target) > 16:
            raise RegistrationError(
                f"handoff: the publisher {publisher!r} has no target (a short name such as 'rq')"
            )
        given = {"retry_within": retry_within, "send_timeout": send_timeout}
        hold, send_timeout = knobs(retry_within, hold, send_timeout)
        #: The knobs given as numbers (not derived): `check_period` warns about these.
        self._given = {key: float(value) for key, value in given.items() if value is not None}
        self.publisher = publisher
        self.retry_within: float | None = None if retry_within is None else float(retry_within)
        self.hold = float(hold)
        self.send_timeout = float(send_timeout)
        self._sender = Sender(publisher)
        self._lock = threading.Lock()
        #: Rows whose send was given up on and may still be accepted: their next try
        #: time as this replica last set it (`keep_held` moves it on).
        self._held: dict[str, int] = {}
        #: The specs `check_period` has read, with their shortest gap.
        self._gaps: dict[str, float | None] = {}
        self.__name__ = f"handoff_{target}"
        self.__qualname__ = self.__name__
        self.__module__ = "cronjob.contrib"

    def __repr__(self) -> str:
        return f"<Handoff {self.publisher.target} {self.publisher.describe()!r}>"

    def check_period(self, name: str, schedule: Schedule, *, now: datetime | None = None) -> None:
        """Warn when the knobs given would keep a round of job ``name`` sending past its
        next instant (registration calls it for every leased job whose function has it).

        A round retries a refused send for up to `retry_within` seconds and then waits up
        to `send_timeout` for its last send: the given ones together (derived values are
        kept within the period, and never warn) are compared with the shortest gap
        between two instants of ``schedule``: its period for ``@every``, else the
        shortest gap between its next ten instants after ``now``. When they
        reach it, one WARNING names the job, the values and the gap. A schedule with
        fewer than two instants left has no gap, and no warning. A spec is read once per
        hand-off: a task's schedules made of data share its hand-off, and of those on
        one spec the first is named (reading the gap costs about half a millisecond,
        on the dispatcher's thread for a schedule loaded at run time).

        Args:
            name: The job's name (a schedule's id), for the message.
            schedule: The job's schedule.
            now: Where to read the instants from; ``None``: the system clock's now.
        """
        warn_overrun(name, schedule, self._given, self._gaps, now)

    def __call__(self, ctx: Round) -> None:
        """The round: record the occurrence, send it, mark it sent.

        The record is written in a transaction fenced by the round's lease, so a round
        whose lease is gone records nothing; with it, the instants a round of the job kept
        from every claim (``ctx._owed``: its replica died, or it ran past them), each under
        its own id, sent first. The records of the hand-off rounds of a scheduler that
        write theirs at once share that transaction (`cronjob.contrib._records`): one
        statement checks all their leases and locks them until the commit, one writes
        their records; a round whose lease is gone is left out, and the others are not
        affected by it. A second run of the instant finds the
        record: sent, it sends nothing more; unsent and due (nobody holds it), it claims it
        as the sweep does and sends it again with the same id; unsent and held (an attempt
        in progress, or waiting for its retry), it leaves it to that attempt and the sweep.
        A round that follows a round of its job that died holding the lease
        (``ctx._takes_over``) takes over the rows that round recorded and still held,
        untouched since (`lease.held_publications`): nobody is sending them, and they are
        sent at once, oldest first with the rest, not at the end of their hold (the one the
        dead round was sending when it died may reach the broker twice, as it would from the
        sweep).

        A refused send is retried after `RETRY_PAUSES` (100 ms, 500 ms, 2 s, 5 s: five
        attempts) while the round is within its bound (`round_bound`: shortly before the
        job's next instant, or ``retry_within`` when given), through `ctx.wait`. Each
        send waits at most `send_timeout` seconds for the broker, and never past the
        bound nor the round's cancellation (a drain, a lost lease): a send given up on
        keeps its row held while the broker may still accept it, and the sweep sends
        it after.

        Raises:
            LeaseLost: the lease is gone when the record is written.
            Exception: the database error that failed the record's transaction (that of
                every round recorded with this one): nothing of it is on record.
            Cancelled: the round was cancelled while it sent or retried: the records
                stay, the sweep sends them.
            NotPublished: the broker did not accept an occurrence within the bound: the
                round fails (counted as a failure); the sweep sends the rows after.
        """
        headers: dict[str, str] = {}
        propagate.inject(headers)  # the round's span is current on its thread
        clock = ctx._clock
        hold = round(self.hold * 1000)
        now = _now_ms(clock.now())
        describe = self.publisher.describe()
        occurrences = [
            _records.occurrence(
                ctx,
                instant,
                headers,
                target=self.publisher.target,
                describe=describe,
                now_ms=now,
                hold_ms=hold,
            )
            for instant in sorted({*ctx._owed, ctx.instant})
        ]
        # In one transaction with the records of the rounds writing theirs meanwhile.
        recorded = _records.record(ctx, occurrences, now_ms=now, hold_ms=hold)
        engine = recorded.engine
        sends = to_send(engine, ctx.name, recorded.rows, recorded.dead, now_ms=now, hold_ms=hold)
        if sends:
            self._publish(ctx, engine, sends, clock.monotonic() + self.round_bound(ctx))

    def round_bound(self, ctx: Round) -> float:
        """Seconds from now the round may go on sending and retrying (see
        `cronjob.contrib._retries.round_bound`)."""
        return round_bound(ctx, self.retry_within)

    def _publish(
        self, ctx: Round, engine: Engine, sends: list[tuple[Occurrence, int]], bound: float
    ) -> None:
        """Send each occurrence (held by this round until its paired ms), oldest first,
        retrying a refusal while the round is before ``bound`` (monotonic); the first
        one that is not accepted within it leaves it and the rest to the sweep."""
        clock = ctx._clock
        for index, (occurrence, seen) in enumerate(sends):
            tries = 0
            while True:
                left = bound - clock.monotonic()
                error = self._send(
                    engine,
                    occurrence,
                    lambda: _now_ms(clock.now()),
                    ctx,
                    timeout=max(SEND_LEAST, min(self.send_timeout, left)),
                )
                now = _now_ms(clock.now())
                if error is None:
                    mark(engine, occurrence.id, now)
                    count_accepted(ctx, occurrence, self.publisher.target, clock.now())
                    break
                count_refused(ctx, self.publisher.target)
                if ctx.cancelled:  # given up at the cancellation: the sweep's now
                    self._hand_over(engine, [(occurrence, seen), *sends[index + 1 :]], now, error)
                    ctx.check()
                pause = RETRY_PAUSES[min(tries, len(RETRY_PAUSES) - 1)]
                tries += 1
                last = self.retry_within is None and tries >= len(RETRY_PAUSES) + 1
                if last or clock.monotonic() + pause >= bound:
                    self._hand_over(engine, [(occurrence, seen), *sends[index + 1 :]], now, error)
                    log.warning(
                        "job %r: occurrence %s not accepted by %s after %d attempt(s) (%s); "
                        "the sweep retries it",
                        ctx.name,
                        occurrence.id,
                        self.publisher.target,
                        tries,
                        error,
                    )
                    raise NotPublished(
                        f"occurrence {occurrence.id} not accepted by {self.publisher.target} "
                        f"after {tries} attempt(s): {error}"
                    )
                # Kept from the sweeps through the pause and the next attempt.
                later = now + round(pause * 1000) + round(self.hold * 1000)
                if not claim(engine, occurrence.id, seen, later, error=error):
                    break  # a sweep took it meanwhile
                seen = later
                if ctx.wait(pause):  # cancelled: the rows are the sweep's at once
                    now = _now_ms(clock.now())
                    self._hand_over(engine, [(occurrence, seen), *sends[index + 1 :]], now, None)
                    ctx.check()
                # Taken again before the next attempt: a send given up on that the broker
                # accepted meanwhile has marked the row sent, and must not be sent twice.
                now = _now_ms(clock.now())
                if not claim(engine, occurrence.id, seen, now + round(self.hold * 1000)):
                    break
                seen = now + round(self.hold * 1000)

    def _hand_over(
        self,
        engine: Engine,
        sends: list[tuple[Occurrence, int]],
        due_ms: int,
        error: str | None,
    ) -> None:
        """Leave the rows this round holds to the sweep, due at ``due_ms``: the first
        with its send's ``error``."""
        for index, (occurrence, seen) in enumerate(sends):
            self._hand_back(
                engine, occurrence.id, seen, due_ms, error=error if index == 0 else None
            )

    def _send(
        self,
        engine: Engine,
        occurrence: Occurrence,
        now: Callable[[], int],
        ctx: Round | None = None,
        *,
        timeout: float | None = None,
    ) -> str | None:
        """Publish within `send_timeout`, and for a round (``ctx``) no longer than until
        its cancellation; the failure's summary, or ``None`` once sent.

        A send given up on that the broker accepts after all is marked sent then."""

        bound = self.send_timeout if timeout is None else timeout

        def late() -> None:
            mark(engine, occurrence.id, now())
            log.info("occurrence %s: the broker accepted it late; marked sent", occurrence.id)

        if ctx is None:
            return self._sender.send(occurrence, timeout=bound, late=late)
        # The round's own wake-up event, which its cancellation sets: the sender sets it
        # too (the answer, the bound), so it is cleared after unless the round is
        # cancelled (the cause is recorded before the event is set: checked after).
        event = ctx._waker()
        try:
            return self._sender.send(occurrence, timeout=bound, late=late, interrupt=event)
        finally:
            if not ctx.cancelled:
                event.clear()
                if ctx.cancelled:
                    event.set()

    def _hand_back(
        self, engine: Engine, id: str, seen: int, due_ms: int, *, error: str | None = None
    ) -> bool:
        """Move the next try of a row this replica holds (until ``seen``) to ``due_ms``.

        If a send of it was given up on and may still be accepted, the row stays held
        instead (until ``seen`` at least), and `keep_held` keeps it so until that send
        ends: the hold covers the send, however long the broker takes to answer."""
        in_flight = self._sender.in_flight(id)
        if in_flight:
            due_ms = max(due_ms, seen)
        taken = claim(engine, id, seen, due_ms, error=error)
        if taken and in_flight:
            with self._lock:
                self._held[id] = due_ms
        return taken

    def keep_held(self, engine: Engine, *, now: datetime) -> None:
        """Keep held, for `hold` seconds from ``now``, each row whose send this replica
        gave up on (past `send_timeout`) while the broker may still accept it; the sweep
        calls it on every replica before it reads the due rows (at most a hold apart, and
        a second before a hold it keeps ends). A send that ended lets its row go: marked
        sent if the broker accepted it, else due at the end of its hold."""
        hold = round(self.hold * 1000)
        with self._lock:
            held = dict(self._held)
        for id, seen in held.items():
            until = _now_ms(now) + hold
            if self._sender.in_flight(id) and (until <= seen or claim(engine, id, seen, until)):
                with self._lock:
                    self._held[id] = max(until, seen)
                continue
            with self._lock:  # the send ended, or the row was sent or taken meanwhile
                self._held.pop(id, None)

    def resend(
        self, engine: Engine, row: lease.OutboxRow, *, now: datetime, retry_in: float | None = None
    ) -> Resent:
        """Send an unsent outbox row again (the sweep), with its id and recorded headers.

        The row is checked first, as a worker checks a message: one that does not decode,
        or whose id is not the occurrence id of its name, instant and app (recomputed
        here), is never sent. It is logged at ERROR with its id and why, and kept unsent,
        its next try put off as a refused probe's (5 s, doubling with its tries, up to a
        minute; the reason on record as its error). A row that can be sent is claimed
        first (a conditional update of its next try time), so of the replicas that sweep
        at once one sends it; the send waits at most `send_timeout` (below the hold) for
        the broker; a failure sets its next try ``retry_in`` seconds later (by default
        `retry_pause` of its tries), and not before the hold ends if the broker may still
        accept it.

        Returns:
            `Resent.SENT`, `Resent.REFUSED` (retried later), `Resent.NOT_CLAIMED` (sent
            meanwhile, or another replica took it), or `Resent.INVALID` (kept, put off).
        """
        now_ms = _now_ms(now)
        try:
            occurrence = occurrence_of(row)
        except ValueError as exc:
            return put_off_invalid(engine, row, str(exc), now_ms)
        hold = now_ms + round(self.hold * 1000)
        if not claim(engine, row.id, row.next_try_ms, hold):
            return Resent.NOT_CLAIMED
        error = self._send(engine, occurrence, lambda: now_ms)
        if error is None:
            mark(engine, row.id, now_ms)
            log.info("job %r: occurrence %s sent by the sweep", row.name, row.id)
            return Resent.SENT
        pause = retry_pause(row.tries + 1) if retry_in is None else retry_in
        self._hand_back(engine, row.id, hold, now_ms + round(pause * 1000), error=error)
        log.warning(
            "job %r: occurrence %s still not accepted by %s (%s)",
            row.name,
            row.id,
            self.publisher.target,
            error,
        )
        return Resent.REFUSED


def handoff(
    publisher: Publisher,
    *,
    retry_within: float | None = None,
    hold: float | None = None,
    send_timeout: float | None = None,
) -> Handoff:
    """Turn ``publisher`` into a job function that hands each instant to its task system.

    Register what it returns as any job (``cronjob.register(handoff(p), spec, name)``,
    or a task's function). Each round records its occurrence in the outbox, in its
    fenced transaction, sends it with the occurrence id as the message's own id, and
    marks it sent once the broker accepted it; see `Handoff.__call__` and `Handoff.resend`.

    Each knob is ``None`` (the default) to have it derived, or a number of seconds
    used as given; registration warns (`Handoff.check_period`) when the given ones
    would keep a round sending past the job's next instant.

    Args:
        retry_within: Seconds the round retries a refused send before it fails and
            leaves the row to the sweep. ``None`` (the default): the peer's five attempts
            (`RETRY_PAUSES`), never past shortly before the job's next instant, so that
            a round never overruns the next instant.
        hold: Seconds an attempt keeps its row from the other retriers; after them, a
            replica that died while sending is retried for (longer than a send takes);
            `HOLD_SECONDS` by default.
        send_timeout: Seconds one send waits for the broker's answer (real time), below
            ``hold``; ``None``: `SEND_TIMEOUT`, or half the hold if that is shorter.
            A send past it counts as refused; the row stays held until its hold ends.

    Raises:
        RegistrationError: ``publisher`` has no ``target``, ``retry_within`` is not a
            number of seconds >= 0, ``hold`` not > 0, or ``send_timeout`` not between
            0 and ``hold``.
    """
    return Handoff(publisher, retry_within=retry_within, hold=hold, send_timeout=send_timeout)
