"""Sends with a bound: a publisher's ``publish`` run on a thread of its own, waited for
at most a given number of seconds; what is sent (`Occurrence`) and who sends it
(`Publisher`), which `cronjob.contrib._handoff` re-exports.

A broker that accepts the connection and never answers would otherwise hold the
caller (a round's thread, or the ``cronjob-outbox`` thread of every sweep) for as long as
its client has no timeout of its own, which may be forever. `Sender` runs each publish on
one daemon thread per publisher (``cronjob-publish``), reused from send to send (a
client that keeps one connection per thread, as Dramatiq's RabbitMQ broker does, keeps
one), and the caller waits for the answer at most ``timeout`` seconds.

A send given up on may still be accepted later. The caller keeps the row held for as
long as `in_flight` says so (``Handoff.keep_held``), and the sender marks the row sent
itself if the late answer is an acceptance (``late``). While such a send is in flight,
the publisher's next send fails at once: the broker has not answered, and no more
threads are spent on it.

The bound is in real seconds, like a socket timeout: it bounds an I/O call, not a
schedule, so it does not follow the scheduler's (possibly fake) clock.

A round's send also ends at the round's cancellation (its timeout, a drain, a lost
lease): the round waits on its own wake-up event (``interrupt``), which its cancellation
sets, and which the answer, or the bound in real seconds, sets too. A round whose job's
``timeout`` is below the send's bound thus ends at its timeout, not 5 s later with the
whole process (the rule for a round that outlives its cancellation). For its first
`ANSWER_GRACE` seconds the wait is work in progress (a fake clock's time stands still,
as for any work: a broker's usual answer comes well within them); past them it waits on
the clock event, so a fake clock's time, and the round's timeout, move on while the
broker is silent.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from .._clock import ClockEvent

__all__ = ["ANSWER_GRACE", "Occurrence", "Publisher", "Sender"]

log = logging.getLogger("cronjob")


#: Real seconds a round's send waits for the broker as work in progress (a fake clock's
#: time stands still meanwhile, as it does for any work), looking for the round's
#: cancellation every `_POLL` seconds; past them, it waits on the round's clock event.
ANSWER_GRACE: Final = 5.0
_POLL: Final = 0.05
#: A failed publish is tried again at once only if it failed within these seconds (a
#: stale connection fails at once; a broker that is away fails after a timeout).
_STALE_WITHIN: Final = 1.0


@dataclass(frozen=True)
class Occurrence:
    """One instant of one job, as handed to a task system.

    Attributes:
        id: `cronjob.occurrence_id` of (name, instant): the message's own id.
        name: The job's (or data schedule's) name.
        instant: The scheduled instant, an aware UTC datetime.
        headers: The round's W3C trace context (``traceparent``, and ``tracestate``
            when there is one), to be put in the message's headers; empty when no
            trace context is known (a republish by the sweep carries the recorded one).
        app: The application's name, part of ``id`` (``Scheduler(app=...)``); ``""``
            by default.
        again: ``True`` when it is sent again from its outbox row (a second run of the
            instant, the sweep): it may have been sent before.
        args: A data schedule's arguments, as JSON text (``"{}"`` for a registered job).
        trigger: What started the round (``"schedule"``, ``"manual"``, ``"backfill"``):
            each target carries it unless it is ``"schedule"``, so that a worker skips
            the firing check for a manual round.
    """

    id: str
    name: str
    instant: datetime
    headers: Mapping[str, str]
    app: str = ""
    again: bool = False
    args: str = "{}"
    trigger: str = "schedule"


class Publisher(Protocol):
    """What a target must do; the outbox does the rest."""

    @property
    def target(self) -> str:
        """``"celery"``, ``"rq"`` or ``"dramatiq"``."""
        ...

    def describe(self) -> dict[str, Any]:
        """What this publisher sends, as JSON-able data (task name, queue, …), for the
        outbox row, logs and ``status``. Never secrets (no broker URL password)."""
        ...

    def publish(self, occurrence: Occurrence) -> None:
        """Put one message for ``occurrence`` on the broker, with ``occurrence.id`` as
        its id, the instant (`cronjob.contrib.format_instant`: RFC 3339 UTC with ``Z``) in
        it, and ``occurrence.headers`` in its headers. Return only once the broker has
        accepted it (publisher confirms on RabbitMQ); raise on any failure. It may be
        called again with the same occurrence (after a failure, a crash, or on another
        replica). It is called on a thread of its own (``cronjob-publish``, one per
        publisher, one call at a time), waited for at most ``send_timeout`` seconds."""
        ...


@dataclass(eq=False)
class _Send:
    occurrence: Occurrence
    late: Callable[[], None] | None
    #: When the caller stops waiting (monotonic): a second attempt starts only before.
    deadline: float = 0.0
    #: The caller's wake-up event, set once the publish returns (while the caller waits).
    interrupt: ClockEvent | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    abandoned: bool = False
    #: The caller stopped waiting: nothing sets ``interrupt`` any more.
    left: bool = False
    #: Orders `_wake` against the caller's leaving.
    lock: threading.Lock = field(default_factory=threading.Lock)


class Sender:
    """Runs one publisher's sends, one at a time, each waited for with a bound."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self._lock = threading.Lock()
        self._slot = threading.Semaphore(1)  # taken by a send until its publish returns
        self._sends: queue.SimpleQueue[_Send] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: The id of a send given up on whose publish has not returned yet.
        self._stuck: str | None = None

    def in_flight(self, id: str) -> bool:
        """Whether a send of ``id`` was given up on and may still be accepted."""
        with self._lock:
            return self._stuck == id

    def send(
        self,
        occurrence: Occurrence,
        *,
        timeout: float,
        late: Callable[[], None] | None = None,
        interrupt: ClockEvent | None = None,
    ) -> str | None:
        """Publish ``occurrence``, waiting at most ``timeout`` seconds for the broker.

        Args:
            late: Called on the sender's thread if the publish is accepted after the
                caller gave up on it (to mark the row sent).
            interrupt: The caller's wake-up event (a round's, set by its cancellation):
                the wait ends when it is set, and the send is given up on as past its
                bound. The sender sets it too, when the publish returns or ``timeout``
                real seconds have passed, and never once this call has returned; the
                caller clears it after (unless its own cause still holds). An event
                already set gives the send up at once, unsent.

        Returns:
            ``None`` once the broker accepted it; else the failure's summary (a
            ``TimeoutError`` when the broker gave no answer in time, or the caller's
            event ended the wait first).
        """
        if interrupt is not None and interrupt.is_set():
            return "Cancelled: the send was not started"
        with self._lock:
            stuck = self._stuck
        if stuck is not None:
            return (
                f"TimeoutError: {self._publisher.target} has not answered a send "
                f"(occurrence {stuck}) yet; not sending another"
            )
        deadline = time.monotonic() + timeout
        if not self._slot.acquire(timeout=timeout):
            return f"TimeoutError: another send to {self._publisher.target} took over {timeout:g}s"
        job = _Send(occurrence, late, deadline, interrupt)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="cronjob-publish", daemon=True
                )
                self._thread.start()
        self._sends.put(job)
        if interrupt is None:
            job.done.wait(max(0.0, deadline - time.monotonic()))
        elif not self._answered(job, interrupt, min(deadline, time.monotonic() + ANSWER_GRACE)):
            bound = threading.Timer(max(0.0, deadline - time.monotonic()), _wake, (job,))
            bound.daemon = True
            bound.start()
            interrupt.wait()  # the answer, the bound, or the caller's cancellation
            bound.cancel()
            with job.lock:
                job.left = True
        with self._lock:
            if job.done.is_set():  # answered (just now, perhaps)
                return job.error
            job.abandoned = True
            self._stuck = occurrence.id
        if time.monotonic() < deadline:
            return f"Cancelled: the wait for {self._publisher.target}'s answer was given up"
        return f"TimeoutError: {self._publisher.target} gave no answer within {timeout:g}s"

    @staticmethod
    def _answered(job: _Send, interrupt: ClockEvent, until: float) -> bool:
        """Wait in real time, as work a fake clock waits for, until ``until`` (monotonic)
        for the answer; whether it came or ``interrupt`` was set meanwhile."""
        while not job.done.wait(max(0.0, min(_POLL, until - time.monotonic()))):
            if interrupt.is_set() or time.monotonic() >= until:
                return interrupt.is_set()
        return True

    def _publish(self, job: _Send) -> str | None:
        """Publish ``job``'s occurrence; the failure's summary, or ``None`` once sent.

        A publish that fails is tried once more at once while its caller still waits: a
        client's connection gone stale while the broker was away (restarted, a network
        blip) fails the first send after, and the client opens a new one on the next
        call. Only a second failure counts as the broker's refusal. A first failure that
        took `_STALE_WITHIN` seconds or more (a connect timeout: the broker is away) is
        not tried again: the second would only wait as long."""
        for attempt in (1, 2):
            began = time.monotonic()
            try:
                self._publisher.publish(job.occurrence)
            except Exception as exc:  # any failure of the broker's client: retried
                error = f"{type(exc).__name__}: {exc}"
                took = time.monotonic() - began
                if attempt == 1 and took < _STALE_WITHIN and began + 2 * took < job.deadline:
                    log.info(
                        "occurrence %s: %s refused it (%s); trying again at once on a new "
                        "connection",
                        job.occurrence.id,
                        self._publisher.target,
                        error,
                    )
                    continue
                return error
            return None
        return None  # not reached: the loop returns

    def _run(self) -> None:
        while True:
            job = self._sends.get()
            error = self._publish(job)
            with self._lock:
                job.error = error
                job.done.set()
                late = job.abandoned
                if late:
                    self._stuck = None
            _wake(job)
            self._slot.release()
            if late and error is None and job.late is not None:
                try:
                    job.late()
                except Exception as exc:  # the row stays unsent: a resend comes
                    log.warning("occurrence %s: marking it sent failed: %s", job.occurrence.id, exc)


def _wake(job: _Send) -> None:
    """Set the waiting caller's event, unless it has stopped waiting (an event is a
    round's, and would read as its cancellation after)."""
    interrupt = job.interrupt
    if interrupt is None:
        return
    with job.lock:
        if not job.left:
            interrupt.set()
