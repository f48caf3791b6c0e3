"""The outbox's sweep: sends again the occurrences a round recorded and could not send.

A job that hands its instants to a task queue (``cronjob.contrib.handoff``) records each
occurrence in the outbox before it sends it. A round that ended first (the broker down
past its retries, a drain, a lease lost, a replica killed between the send and the mark)
leaves the row unsent. On the sweep's cadence (every `SWEEP_EVERY` seconds, with the
sweep for rounds cut short) each replica reads the due unsent rows of the names it can
send (its jobs that hand their instants on), all in one statement, and hands each to
the job function of that name in its registry (the function carries its publisher:
``Handoff.resend``), which claims the row by a conditional update of its next try time
before it sends: one replica at a time sends a given row, and every replica may.

The statements and the sends run on one thread of this part's own (``cronjob-outbox``),
not on the control thread: a broker that hangs until its client's timeout must never hold
a claim of the next instant back. Only a replica with such a job starts it. The rows are
read there, handed to the job functions on the dispatcher thread (which owns the job
states), and sent back there. Each send waits for the broker at most its
``send_timeout``, so a broker that never answers holds this thread for that long, not
forever. A send that fails defers the other due rows of its publisher by `DEFER_REFUSED`
(one statement, no try counted): a broker that is down costs one timeout per sweep, not
one per row, and its rows never fill the sweep's `REPUBLISH_LIMIT` ahead of the rows of
a broker that is up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import lease

from .._clock import Clock
from ._control import Control
from ._sweep import SWEEP_EVERY
from ._wings import Wing

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from ._state import JobState

__all__ = ["DEFER_REFUSED", "REPUBLISH_LIMIT", "Republisher", "Resender"]

log = logging.getLogger("cronjob")

#: The most unsent rows one sweep reads (the longest due first); more wait for the next.
REPUBLISH_LIMIT: Final = 500
#: Seconds the due rows of a publisher that refused a send are put off, untried: the
#: longest back-off of a send (``cronjob.contrib.RETRY_LONGEST``), so the next sweeps
#: read the rows behind them.
DEFER_REFUSED: Final = 60.0


@runtime_checkable
class Resender(Protocol):
    """A job function that can send an outbox row again (``cronjob.contrib.Handoff``)."""

    publisher: Any

    def resend(self, engine: Engine, row: lease.OutboxRow, *, now: datetime) -> bool | None:
        """Send ``row`` again: ``True`` sent, ``False`` refused, ``None`` not claimed."""
        ...

    def keep_held(self, engine: Engine, *, now: datetime) -> None:
        """Keep held the rows whose send this replica gave up on and may still be
        accepted, so that no other replica sends them meanwhile."""
        ...


def is_resender(fn: object) -> bool:
    """Whether ``fn`` hands its instants on (has an outbox to sweep)."""
    return isinstance(fn, Resender)


class Republisher(Wing):
    """Sweeps the outbox of the jobs in ``states`` that hand their instants on (a wing,
    see ``_wings``).

    Args:
        clock: The scheduler's clock.
        store: The lease store (its engine runs the statements).
        control: The scheduler's control thread; this part gets a sibling of its own.
        states: The dispatcher's job states by name (read on the dispatcher thread only).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        states: Mapping[str, JobState],
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._states = states
        self._thread: Control | None = None
        self._sweep_at: float | None = None
        self._sweeping = False
        #: The database is ready and start-up's catch-up sent (as for the sweep): until
        #: then no sweep is due, or the dispatcher would wake for it without end.
        self._begun = False
        self.notice(states.values())

    def begin(self) -> None:
        """The database is ready (and start-up's catch-up sent): sweep now, if any job
        hands its instants on."""
        self._begun = True
        if self._thread is not None:
            self._sweep_at = self._clock.monotonic()

    def notice(self, states: Iterable[JobState]) -> None:
        """Jobs came (schedules made of data): start sweeping if one hands its instants on."""
        if self._thread is None and any(is_resender(s.job.fn) for s in states):
            self._thread = self._control.sibling("cronjob-outbox")
            if self._begun:
                self._sweep_at = self._clock.monotonic()

    def names_changed(self, added: list[JobState], dropped: list[str]) -> None:
        """Leased jobs came or went: see `notice`."""
        self.notice(added)

    def next_wake(self, *, draining: bool) -> float | None:
        """When the next sweep of the outbox is due (monotonic), or ``None``."""
        if self._sweep_at is None or self._sweeping or draining:
            return None
        return self._sweep_at

    def sweep(self, now: float) -> None:
        """Read the due unsent rows if it is time, and send each again."""
        thread, sweep_at = self._thread, self._sweep_at
        if thread is None or self._sweeping or sweep_at is None or now < sweep_at:
            return
        self._sweeping = True
        store, clock = self._store, self._clock
        # Read here, on the dispatcher thread that owns the states.
        fns: dict[str, Resender] = {}
        for name, state in self._states.items():
            if isinstance(state.job.fn, Resender):
                fns[name] = state.job.fn

        def read() -> list[lease.OutboxRow]:
            for fn in {id(fn): fn for fn in fns.values()}.values():
                fn.keep_held(store.engine, now=clock.now())
            now_ms = round(clock.now().timestamp() * 1000)
            names = list(fns)
            with store.engine.connect() as conn:
                return lease.due_publications(
                    conn, now_ms=now_ms, limit=REPUBLISH_LIMIT, names=names
                )

        thread.run(read, self._send)

    def _send(self, rows: list[lease.OutboxRow] | BaseException) -> None:
        """On the dispatcher thread: pair each row with its job's function, send them."""
        if isinstance(rows, BaseException):
            log.warning("reading the outbox failed: %s", rows)
            self._done(None)
            return
        pairs: list[tuple[lease.OutboxRow, Resender]] = []
        for row in rows:
            state = self._states.get(row.name)
            fn = None if state is None else state.job.fn
            if isinstance(fn, Resender):  # else a replica that registers it sends it
                pairs.append((row, fn))
        if not pairs:
            self._done(None)
            return
        engine, clock = self._store.engine, self._clock
        assert self._thread is not None
        self._thread.run(lambda: _resend_all(engine, clock, pairs), self._done)

    def _done(self, result: object) -> None:
        if isinstance(result, BaseException):
            log.warning("sending the outbox again failed: %s", result)
        self._sweeping = False
        self._sweep_at = self._clock.monotonic() + SWEEP_EVERY

    def close(self) -> None:
        """Stop the thread: a send in flight ends with the process (its row is retried)."""
        if self._thread is not None:
            self._thread.shutdown(wait=0)


def _resend_all(engine: Engine, clock: Clock, pairs: list[tuple[lease.OutboxRow, Resender]]) -> int:
    """Send each row again; after a failure, defer the rest of that publisher's rows."""
    failed: dict[int, list[str]] = {}  # publisher -> the ids it was not asked to send
    sent = 0
    try:
        for row, fn in pairs:
            skipped = failed.get(id(fn.publisher))
            if skipped is not None:
                skipped.append(row.id)
                continue
            done = fn.resend(engine, row, now=clock.now())
            if done:
                sent += 1
            elif done is not None:  # refused: the broker is down, try its other rows later
                failed[id(fn.publisher)] = []
        skipped_ids = [id_ for ids in failed.values() for id_ in ids]
        if skipped_ids:
            now_ms = round(clock.now().timestamp() * 1000)
            later = now_ms + round(DEFER_REFUSED * 1000)
            with engine.begin() as conn:
                lease.defer_publications(conn, skipped_ids, now_ms=now_ms, next_try_ms=later)
    except lease.LeaseError as exc:
        log.warning("outbox: %s", exc)
    return sent
