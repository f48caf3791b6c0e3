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
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from opentelemetry import propagate

import lease

from .._exceptions import RegistrationError
from ._sender import Occurrence, Publisher, Sender

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .._round import Round

__all__ = [
    "HOLD_SECONDS",
    "RETRY_FIRST",
    "RETRY_LONGEST",
    "RETRY_WITHIN",
    "SEND_TIMEOUT",
    "Handoff",
    "Occurrence",
    "Publisher",
    "handoff",
]

log = logging.getLogger("cronjob")

#: How often every replica's outbox sweep runs, and keeps held the rows of sends it gave
#: up on (the engine's ``SWEEP_EVERY``).
_SWEEP_EVERY = 15.0

#: Seconds an attempt to send keeps its outbox row from every other retrier (the sweep
#: of each replica); past them, a replica that died while sending is retried for.
HOLD_SECONDS: Final = 60.0
#: Seconds before the first retry of a send that failed; each retry doubles it.
RETRY_FIRST: Final = 1.0
#: The longest pause between two retries, in seconds (the round's and the sweep's).
RETRY_LONGEST: Final = 60.0
#: Seconds the round itself retries a refused send before it leaves it to the sweep.
RETRY_WITHIN: Final = 10.0
#: The longest wait for the broker's answer to one send, in seconds (real time, like a
#: socket timeout), unless the hold is shorter: then half the hold.
SEND_TIMEOUT: Final = 20.0


def _now_ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def retry_pause(tries: int) -> float:
    """The pause before the retry that follows ``tries`` failed attempts, in seconds."""
    return min(RETRY_LONGEST, RETRY_FIRST * float(2 ** max(0, tries - 1)))


class Handoff:
    """A job function that hands each instant to a task system (see `handoff`).

    Attributes:
        publisher: What puts the messages on the broker.
        retry_within: Seconds the round retries a refused send before it leaves it to
            the sweep.
        hold: Seconds an attempt keeps its row from the other retriers (`HOLD_SECONDS`).
        send_timeout: Seconds one send waits for the broker's answer, below ``hold``.
        leased_only: ``True``: registration refuses it as a per-instance job, which every
            replica would run, each publishing the instant once more.
        isolatable: ``False``: registration refuses it with ``isolation="process"``. It
            holds its publisher's thread and the sends it gave up on, which are this
            replica's: a child process could neither import it by name nor share them.
    """

    leased_only = True
    isolatable = False

    def __init__(
        self,
        publisher: Publisher,
        *,
        retry_within: float = RETRY_WITHIN,
        hold: float = HOLD_SECONDS,
        send_timeout: float | None = None,
    ) -> None:
        target = getattr(publisher, "target", None)
        if not isinstance(target, str) or not target or len(target) > 16:
            raise RegistrationError(
                f"handoff: the publisher {publisher!r} has no target (a short name such as 'rq')"
            )
        if not isinstance(retry_within, int | float) or not retry_within >= 0:
            raise RegistrationError(
                f"handoff: retry_within must be a number of seconds >= 0, got {retry_within!r}"
            )
        if not isinstance(hold, int | float) or not hold > 0:
            raise RegistrationError(f"handoff: hold must be a number of seconds > 0, got {hold!r}")
        if send_timeout is None:
            send_timeout = min(SEND_TIMEOUT, hold / 2)
        if not isinstance(send_timeout, int | float) or not 0 < send_timeout < hold:
            raise RegistrationError(
                f"handoff: send_timeout must be a number of seconds > 0 and below the hold "
                f"({hold:g}s), got {send_timeout!r}"
            )
        if hold - send_timeout <= _SWEEP_EVERY:
            # The sweep keeps a row held past a send given up on (keep_held), every 15 s:
            # a hold that ends sooner may let another replica send it while it is in flight.
            log.warning(
                "handoff %s: the hold (%gs) is less than the send timeout (%gs) plus the "
                "sweep's %gs: a send that hangs past its timeout may be sent a second time "
                "by another replica",
                target,
                hold,
                send_timeout,
                _SWEEP_EVERY,
            )
        self.publisher = publisher
        self.retry_within = float(retry_within)
        self.hold = float(hold)
        self.send_timeout = float(send_timeout)
        self._sender = Sender(publisher)
        self._lock = threading.Lock()
        #: Rows whose send was given up on and may still be accepted: their next try
        #: time as this replica last set it (`keep_held` moves it on).
        self._held: dict[str, int] = {}
        self.__name__ = f"handoff_{target}"
        self.__qualname__ = self.__name__
        self.__module__ = "cronjob.contrib"

    def __repr__(self) -> str:
        return f"<Handoff {self.publisher.target} {self.publisher.describe()!r}>"

    def __call__(self, ctx: Round) -> None:
        """The round: record the occurrence, send it, mark it sent.

        The record is written in the round's fenced transaction (`ctx.transaction()`),
        so a round whose lease is gone records nothing. A second run of the instant finds
        the record: sent, it sends nothing more; unsent and due (nobody holds it), it
        claims it as the sweep does and sends it again with the same id; unsent and held
        (an attempt in progress, or waiting for its retry), it leaves it to that attempt
        and the sweep. Each send waits at most `send_timeout` seconds for the broker,
        and no longer than the round's cancellation (its ``timeout``, a drain, a lost
        lease): a send given up on then keeps its row, held while the broker may still
        accept it, and the sweep sends it after. A refused send is retried with back-off
        (`RETRY_FIRST`, doubling) through `ctx.wait` for `retry_within` seconds, then left
        to the sweep (logged).

        Raises:
            LeaseLost: the lease is gone when the record is written.
            Cancelled: the round was cancelled (drain, lease lost, timeout) while it
                sent or retried: the record stays, the sweep sends it.
        """
        headers: dict[str, str] = {}
        propagate.inject(headers)  # the round's span is current on its thread
        occurrence = Occurrence(
            id=ctx.occurrence_id,
            name=ctx.name,
            instant=ctx.instant,
            headers=headers,
            app=ctx.app,
            args="{}" if ctx._data is None else ctx._data[1],
            trigger=str(ctx.trigger),
        )
        clock = ctx._clock
        hold = round(self.hold * 1000)
        with ctx.transaction() as conn:
            engine = conn.engine
            now = _now_ms(clock.now())
            row, new = lease.record_publication(
                conn,
                id=occurrence.id,
                name=occurrence.name,
                instant=occurrence.instant,
                target=self.publisher.target,
                payload={
                    "headers": headers,
                    "publisher": self.publisher.describe(),
                    **({"app": ctx.app} if ctx.app else {}),
                    **({"args": occurrence.args} if occurrence.args != "{}" else {}),
                    **({"trigger": occurrence.trigger} if occurrence.trigger != "schedule" else {}),
                },
                now_ms=now,
                hold_ms=hold,
                # A schedule's task: its publisher sends the row once the schedule is gone.
                task=ctx.task if ctx.task != ctx.name else None,
            )
        if row.sent_ms is not None:
            log.info("job %r: occurrence %s was sent already", ctx.name, occurrence.id)
            return
        if not new:  # a second run: take the row as the sweep does, if it is due
            if row.next_try_ms > now:
                log.info(
                    "job %r: occurrence %s is held by an attempt to send it; not sent again",
                    ctx.name,
                    occurrence.id,
                )
                return  # that attempt, or the sweep once the hold ends, sends it
            occurrence = _occurrence(row)
            if not _claim(engine, row.id, row.next_try_ms, now + hold):
                return  # a sweep sends it now
        seen, started, tries = now + hold, clock.monotonic(), row.tries
        while True:
            error = self._send(engine, occurrence, lambda: _now_ms(clock.now()), ctx)
            now = _now_ms(clock.now())
            if error is None:
                _mark(engine, occurrence.id, now)
                return
            if ctx.cancelled:  # the send given up on at the cancellation: the sweep's now
                self._hand_back(engine, occurrence.id, seen, now, error=error)
                ctx.check()
            tries += 1
            pause = retry_pause(tries)
            if pause > started + self.retry_within - clock.monotonic():
                self._hand_back(engine, occurrence.id, seen, now, error=error)  # to the sweep
                log.warning(
                    "job %r: occurrence %s not accepted by %s (%s); the sweep retries it",
                    ctx.name,
                    occurrence.id,
                    self.publisher.target,
                    error,
                )
                return
            # Kept from the sweeps through the pause and the next attempt.
            later = now + round(pause * 1000) + hold
            if not _claim(engine, occurrence.id, seen, later, error=error):
                return  # a sweep took it meanwhile
            log.warning(
                "job %r: occurrence %s not accepted by %s (%s); retrying in %gs",
                ctx.name,
                occurrence.id,
                self.publisher.target,
                error,
                pause,
            )
            seen = later
            if ctx.wait(pause):  # cancelled: the row is the sweep's at once
                now = _now_ms(clock.now())
                self._hand_back(engine, occurrence.id, seen, now)
                ctx.check()
            # Taken again before the next attempt: a send given up on that the broker
            # accepted meanwhile has marked the row sent, and must not be sent twice.
            now = _now_ms(clock.now())
            if not _claim(engine, occurrence.id, seen, now + hold):
                return
            seen = now + hold

    def _send(
        self,
        engine: Engine,
        occurrence: Occurrence,
        now: Callable[[], int],
        ctx: Round | None = None,
    ) -> str | None:
        """Publish within `send_timeout`, and for a round (``ctx``) no longer than until
        its cancellation; the failure's summary, or ``None`` once sent.

        A send given up on that the broker accepts after all is marked sent then."""

        def late() -> None:
            _mark(engine, occurrence.id, now())
            log.info("occurrence %s: the broker accepted it late; marked sent", occurrence.id)

        if ctx is None:
            return self._sender.send(occurrence, timeout=self.send_timeout, late=late)
        # The round's own wake-up event, which its cancellation sets: the sender sets it
        # too (the answer, the bound), so it is cleared after unless the round is
        # cancelled (the cause is recorded before the event is set: checked after).
        event = ctx._waker()
        try:
            return self._sender.send(
                occurrence, timeout=self.send_timeout, late=late, interrupt=event
            )
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
        taken = _claim(engine, id, seen, due_ms, error=error)
        if taken and in_flight:
            with self._lock:
                self._held[id] = due_ms
        return taken

    def keep_held(self, engine: Engine, *, now: datetime) -> None:
        """Keep held, for `hold` seconds from ``now``, each row whose send this replica
        gave up on (past `send_timeout`) while the broker may still accept it; the sweep
        calls it on every replica before it reads the due rows (every `SWEEP_EVERY`
        seconds, which the hold must exceed). A send that ended lets its row go: marked
        sent if the broker accepted it, else due at the end of its hold."""
        hold = round(self.hold * 1000)
        with self._lock:
            held = dict(self._held)
        for id, seen in held.items():
            until = _now_ms(now) + hold
            if self._sender.in_flight(id) and (until <= seen or _claim(engine, id, seen, until)):
                with self._lock:
                    self._held[id] = max(until, seen)
                continue
            with self._lock:  # the send ended, or the row was sent or taken meanwhile
                self._held.pop(id, None)

    def resend(self, engine: Engine, row: lease.OutboxRow, *, now: datetime) -> bool | None:
        """Send an unsent outbox row again (the sweep), with its id and recorded headers.

        The row is claimed first (a conditional update of its next try time), so of the
        replicas that sweep at once one sends it; the send waits at most `send_timeout`
        (below the hold) for the broker; a failure sets its next try after a back-off
        (`retry_pause`), and not before the hold ends if the broker may still accept it.

        Returns:
            ``True``: sent; ``False``: refused (retried later); ``None``: not claimed
            (sent meanwhile, or another replica took it).
        """
        now_ms = _now_ms(now)
        hold = now_ms + round(self.hold * 1000)
        if not _claim(engine, row.id, row.next_try_ms, hold):
            return None
        error = self._send(engine, _occurrence(row), lambda: now_ms)
        if error is None:
            _mark(engine, row.id, now_ms)
            log.info("job %r: occurrence %s sent by the sweep", row.name, row.id)
            return True
        later = now_ms + round(retry_pause(row.tries + 1) * 1000)
        self._hand_back(engine, row.id, hold, later, error=error)
        log.warning(
            "job %r: occurrence %s still not accepted by %s (%s)",
            row.name,
            row.id,
            self.publisher.target,
            error,
        )
        return False


def handoff(
    publisher: Publisher,
    *,
    retry_within: float = RETRY_WITHIN,
    hold: float = HOLD_SECONDS,
    send_timeout: float | None = None,
) -> Handoff:
    """Turn ``publisher`` into a job function that hands each instant to its task system.

    Register what it returns as any job (``cronjob.register(handoff(p), spec, name)``,
    or a task's function). Each round records its occurrence in the outbox, in its
    fenced transaction, sends it with the occurrence id as the message's own id, and
    marks it sent once the broker accepted it; see `Handoff.__call__` and `Handoff.resend`.

    Args:
        retry_within: Seconds the round retries a refused send before it leaves it to
            the sweep (keep it below the job's period: a round that runs past its next
            instant makes that instant skipped).
        hold: Seconds an attempt keeps its row from the other retriers; after them, a
            replica that died while sending is retried for (longer than a send takes).
        send_timeout: Seconds one send waits for the broker's answer (real time), below
            ``hold``; by default `SEND_TIMEOUT`, or half the hold if that is shorter.
            A send past it counts as refused; the row stays held until its hold ends.

    Raises:
        RegistrationError: ``publisher`` has no ``target``, ``retry_within`` is not a
            number of seconds >= 0, ``hold`` not > 0, or ``send_timeout`` not between
            0 and ``hold``.
    """
    return Handoff(publisher, retry_within=retry_within, hold=hold, send_timeout=send_timeout)


def _occurrence(row: lease.OutboxRow) -> Occurrence:
    headers = row.payload.get("headers") or {}
    return Occurrence(
        id=row.id,
        name=row.name,
        instant=row.instant.astimezone(UTC),
        headers={str(k): str(v) for k, v in headers.items()},
        app=str(row.payload.get("app") or ""),
        again=True,
        args=str(row.payload.get("args") or "{}"),
        trigger=str(row.payload.get("trigger") or "schedule"),
    )


def _claim(
    engine: Engine, id: str, seen: int, next_try_ms: int, *, error: str | None = None
) -> bool:
    with engine.begin() as conn:
        return lease.claim_publication(
            conn, id, seen_next_try_ms=seen, next_try_ms=next_try_ms, error=error
        )


def _mark(engine: Engine, id: str, now_ms: int) -> None:
    with engine.begin() as conn:
        lease.mark_published(conn, id, now_ms=now_ms)
