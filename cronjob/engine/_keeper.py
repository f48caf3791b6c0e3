"""The lease keeper: renews the leases of running rounds, notices their loss, forces the exit.

The rules (SPEC.md, "Timing rules"):

- every lease this replica holds is renewed every 5 s, all in one statement; a failed
  renewal is retried after 1 s;
- a lease is lost when a renewal finds it taken, or when 10 s pass without a successful
  renewal; the round is then cancelled with [LeaseLost][cronjob.LeaseLost];
- a round still running 5 s after its lease was lost ends the process, and never later
  than 0.5 s before the lease can expire, so no other replica can claim the job while
  this one still runs it; a round in a child process (``isolation="process"``) has its
  child killed instead, and the process lives on.

The deadlines are kept on the dispatcher thread, which never waits on the database, so a
hung database cannot delay them; the renewals run on the control thread. They are all on
the clock's *monotonic* time: a wall clock stepped back (NTP, a resumed VM) cannot hold
back a renewal or a loss, which would let the lease expire in the database while the
round goes on. A lease is kept until its round's end is settled (recorded or given
back), not merely until the job returns: a slow write of the end must not let it expire.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

import lease

from .._clock import Clock
from .._exceptions import Cancelled
from .._round import lease_lost
from ._control import Control
from ._state import Flags, Run

__all__ = ["EXIT_LEASE_LOST", "LeaseKeeper", "exit_process", "too_late"]

log = logging.getLogger("cronjob")

#: Seconds between two renewals of the leases a replica holds.
RENEW_EVERY = 5.0
#: Seconds between two attempts when a renewal failed.
RENEW_RETRY = 1.0
#: A lease counts as lost after this many seconds without a successful renewal.
LOST_AFTER = 10.0
#: A round still running this many seconds after its lease was lost ends the process.
EXIT_AFTER_LOST = 5.0
#: ... and never later than this many seconds before its lease can expire: 10 s + 5 s is
#: exactly the lease's 15 s, and a replica claiming the job the moment the lease expires
#: must find this process gone (the fault suite saw one claim by 4 ms).
EXIT_MARGIN = 0.5
#: The exit status of a process a lost lease brings down.
EXIT_LEASE_LOST = 70
#: Real seconds the forced exit gives its last log line before ending the process anyway.
EXIT_LOG_GRACE = 0.2


def exit_process(message: str) -> None:
    """End the process with `EXIT_LEASE_LOST` (the default ``on_fatal``).

    The message is logged as critical from a thread of its own, and the process ends
    `EXIT_LOG_GRACE` real seconds later at the latest: a log handler blocked on a
    full pipe, a network or a held lock must not eat the margin before the lease can
    expire. (A real-time bound on purpose: it ends a real process.)
    """

    def report() -> None:
        logging.getLogger("cronjob").critical(
            "%s; exiting with status %d", message, EXIT_LEASE_LOST
        )
        logging.shutdown()  # flush what the handlers hold

    threading.Thread(target=report, name="cronjob-exit-log", daemon=True).start()
    threading.Event().wait(EXIT_LOG_GRACE)
    os._exit(EXIT_LEASE_LOST)


def too_late(claimed_at: float, now: float) -> bool:
    """Whether a claim sent at ``claimed_at`` that came back at ``now`` (monotonic) came
    back too late to run: its lease would count as lost already (the lease on the
    database is counted from no later than the claim was sent)."""
    return now - claimed_at >= LOST_AFTER


class _Deadline(NamedTuple):
    """When ``run``'s lease counts as lost (``renewed_at`` set) or the process must end.

    A tuple, ordered by ``(when, seq)`` in C (``seq`` is unique, so ``run`` is never
    compared): the heap compares entries thousands of times per instant at scale.
    """

    when: float  # monotonic
    seq: int
    run: Run
    renewed_at: float | None  # None: the exit deadline

    def current(self) -> bool:
        """Whether the run is still in the state this deadline was set for.

        The loss deadline holds until the round's end is settled (the lease is renewed
        until then); the exit deadline only while the job itself still runs.
        """
        run = self.run
        if run.settled:
            return False
        if self.renewed_at is None:
            return run.lost_at is not None and not run.ended
        return run.lost_at is None and run.renewed_at == self.renewed_at


class LeaseKeeper:
    """Keeps the leases of this replica's running rounds (dispatcher thread only).

    Args:
        clock: The scheduler's clock.
        store: The lease store.
        control: Where renewals run.
        replica_id: The holder named in renewals.
        flags: The scheduler's life flags; a fatal loss sets ``crashed``.
        cancel: Cancels a round with a cause (the round runner's).
        crash: Stops the scheduler as a killed process would (run on a thread of its own).
        on_fatal: Told the message when a round outlives its lost lease.
        on_lost: Told ``(name, instant, attempt)`` of a round whose renewal found its
            lease gone (taken, or its row deleted).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        replica_id: str,
        flags: Flags,
        cancel: Callable[[Run, Cancelled], None],
        crash: Callable[[], None],
        on_fatal: Callable[[str], None],
        on_lost: Callable[[str, datetime, int], None] | None = None,
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._replica_id = replica_id
        self._flags = flags
        self._cancel = cancel
        self._crash = crash
        self._on_fatal = on_fatal
        self._on_lost = on_lost
        self._held: set[Run] = set()  # rounds that hold (or held) a lease, until they end
        self._seq = itertools.count()
        # Loss at renewed_at + 10 s, exit at lost_at + 5 s, checked lazily: an entry whose
        # run has moved on since it was pushed is dropped.
        self._deadlines: list[_Deadline] = []
        self._renew_at: float | None = None  # monotonic
        self._renewing = False

    def hold(self, run: Run, claimed_at: float) -> None:
        """Start keeping ``run``'s lease, claimed at monotonic time ``claimed_at``."""
        self._held.add(run)
        self._watch(run)
        if self._renew_at is None:
            self._renew_at = claimed_at + RENEW_EVERY

    def release(self, run: Run) -> None:
        """Stop keeping ``run``'s lease: its round's end is settled."""
        run.settled = True
        self._held.discard(run)
        if not self._held:
            self._renew_at = None

    def tick(self, mono: float) -> None:
        """Act on the deadlines due by monotonic time ``mono``, then renew if it is time."""
        self._watch_leases(mono)
        self._maybe_renew(mono)

    def next_wake(self) -> float | None:
        """The earliest monotonic time `tick` has something to do, or ``None``."""
        candidates: list[float] = []
        if self._renew_at is not None and not self._renewing:
            candidates.append(self._renew_at)
        while self._deadlines and not self._deadlines[0].current():
            heapq.heappop(self._deadlines)
        if self._deadlines:
            candidates.append(self._deadlines[0].when)
        return min(candidates, default=None)

    # -- renewal --------------------------------------------------------------------------

    def _maybe_renew(self, now: float) -> None:
        if self._renew_at is None or self._renewing or now < self._renew_at:
            return
        if self._flags.crashed:  # a forced exit in this same tick: write nothing more
            return
        held = [run for run in self._held if run.lost_at is None]
        if not held:
            self._renew_at = None
            return
        self._renewing = True
        pairs = [(run.ctx.name, run.token) for run in held if run.token is not None]

        def done(result: set[str] | BaseException) -> None:
            self._renewing = False
            if isinstance(result, BaseException):
                log.warning("renewing %d lease(s) failed: %s", len(pairs), result)
                self._renew_at = self._clock.monotonic() + RENEW_RETRY
                return
            for run in held:
                if run.settled or run.lost_at is not None:
                    continue
                if run.ctx.name in result:
                    run.renewed_at = now
                    self._watch(run)
                elif not run.ended or run.backoff:  # an ended round's row may be done already
                    self._lose(run, self._clock.monotonic(), "another claim took it")
                    if self._on_lost is not None:
                        self._on_lost(run.ctx.name, run.ctx.instant, run.ctx.attempt)
            self._renew_at = now + RENEW_EVERY

        self._control.run(lambda: self._store.renew(pairs, self._replica_id), done)

    # -- loss and the forced exit -----------------------------------------------------------

    def _watch(self, run: Run) -> None:
        """Set the deadline that follows from ``run``'s lease as it stands now."""
        when: float
        renewed_at: float | None
        if run.lost_at is None:
            when, renewed_at = run.renewed_at + LOST_AFTER, run.renewed_at
        else:
            when, renewed_at = self._exit_deadline(run), None
        heapq.heappush(self._deadlines, _Deadline(when, next(self._seq), run, renewed_at))

    def _exit_deadline(self, run: Run) -> float:
        """When a round still running after its lease was lost ends the process: 5 s after
        the loss, but before the lease can expire (counted from the last successful claim
        or renewal, as issued, so the lease's own expiry is later still)."""
        assert run.lost_at is not None
        expires = run.renewed_at + self._store.ttl - EXIT_MARGIN
        return min(run.lost_at + EXIT_AFTER_LOST, expires)

    def _watch_leases(self, now: float) -> None:
        while self._deadlines and self._deadlines[0].when <= now:
            deadline = heapq.heappop(self._deadlines)
            if not deadline.current():
                continue
            run = deadline.run
            if run.lost_at is None:
                self._lose(run, now, f"no successful renewal for {LOST_AFTER:g} s")
            else:
                self._fatal(run)
                return

    def _lose(self, run: Run, now: float, reason: str) -> None:
        run.lost_at = now
        run.state.metrics.lost_lease()
        self._watch(run)
        log.error(
            "job %r instant %s: lease lost (%s); cancelling the round",
            run.ctx.name,
            run.ctx.instant.isoformat(),
            reason,
        )
        self._cancel(run, lease_lost(run.ctx.name, reason))

    def _fatal(self, run: Run) -> None:
        assert run.lost_at is not None
        if run.child is not None:
            # A round in a child process: the child is killed, the replica lives on.
            log.error(
                "job %r instant %s: the round's child process still runs after its lease "
                "was lost: SIGKILL",
                run.ctx.name,
                run.ctx.instant.isoformat(),
            )
            run.child.kill()
            return
        after = self._exit_deadline(run) - run.lost_at
        self.force_exit(
            run,
            f"job {run.ctx.name!r} instant {run.ctx.instant.isoformat()}: the round is still "
            f"running {after:g} s after its lease was lost; another replica may "
            "run the job by now",
        )

    def force_exit(
        self, run: Run, message: str, *, settle: Callable[[float], None] | None = None
    ) -> None:
        """End the process because ``run``'s round will not stop (``message`` says why):
        the scheduler stops as a killed process would, then ``on_fatal`` is told (the
        default ends the process). Its leases then expire as a dead process's do.

        ``settle``, if given, is first handed the seconds left before a lease this
        replica holds could expire (less `EXIT_MARGIN`): what it may still do
        before the process ends (let the failure hooks queued run)."""
        self._flags.crashed = True
        if settle is not None:
            settle(self._exit_budget())
        # Stop as a dead process would, then report: the default ends the process at
        # once (it logs the message itself, without waiting on a blocked handler).
        threading.Thread(target=self._crash, name="cronjob-fatal", daemon=True).start()
        self._on_fatal(message)
        log.critical(message)

    def _exit_budget(self) -> float:
        """Seconds until the earliest moment this process must be gone: a lease it holds
        could expire, or a round outliving its lost lease ends the process."""
        now = self._clock.monotonic()
        ttl = self._store.ttl
        deadlines = [
            self._exit_deadline(run)
            if run.lost_at is not None
            else run.renewed_at + ttl - EXIT_MARGIN
            for run in self._held
            if not run.settled
        ]
        return max(0.0, min(deadlines, default=now) - now)
