"""The sweep: finds rounds cut short and runs each a second time; and the minute check.

- **Sweep**: every ~15 s, one query over all of this replica's leased jobs finds rounds
  cut short that run a second time (attempt 2): not run to its end, or its end not on
  record; not run a second time already; no later instant claimed since. Each is
  claimed with its own statement, so two replicas never both run it. On a fake clock
  (every replica in this process, see :attr:`Clock.in_process`) a sweep that found
  nothing is not repeated until a lease write or the expiry of a lease held now could
  change what it finds; it then resumes on its 15 s grid, so tests see the same sweeps
  at the same fake times, without a statement per replica per idle 15 s.
- **Check**: at start and then every minute, a job whose lease row has gone (deleted by
  hand, a backup restored from before the job existed, a start-up ``ensure`` that
  failed) gets it back, logged, since claims only update rows; and a clock that
  disagrees with the database's by more than 2 s is logged as an error (a replica far
  ahead has its claims refused, see :data:`lease.CLAIM_AHEAD_LIMIT`).

Dispatcher thread only (``_on_write`` excepted); statements run on the control thread.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import lease

from ._clock import Clock
from ._control import Control
from ._keeper import too_late
from ._state import JobState, Reason

if TYPE_CHECKING:
    from ._dispatcher import Dispatcher

__all__ = ["Sweeper"]

log = logging.getLogger("cronjob")

#: Seconds between two sweeps for rounds cut short.
SWEEP_EVERY = 15.0
#: Seconds between two checks of the lease rows and of the clock against the database's.
CHECK_EVERY = 60.0
#: A replica whose wall clock is further than this from the database's is logged.
CLOCK_SKEW_WARNING = 2.0


class Sweeper:
    """Sweeps for rounds cut short, and checks rows and clocks, for ``names``."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        dispatcher: Dispatcher,
        replica_id: str,
        names: list[str],
        post: Callable[[Callable[[], None]], object],
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._dispatcher = dispatcher
        self._replica_id = replica_id
        self._names = names
        # Local timers, on the clock's monotonic time; none until the database is ready.
        self._sweep_at: float | None = None
        self._sweeping = False
        self._check_at: float | None = None
        self._checking = False
        # Idle sweeps skipped on an in-process clock: lease writes seen, and whether the
        # sweep waits for one (or for the next expiry) before it runs again.
        self._post = post
        self._writes = 0
        self._suspended = False
        self._last_sweep: float | None = None
        self._unwatch = store.watch(self._on_write) if clock.in_process else None

    def begin(self) -> None:
        """The database is ready (and start-up's catch-up sent): sweep and check now."""
        self._sweep_at = self._check_at = self._clock.monotonic()

    def next_wake(self, *, draining: bool) -> float | None:
        """When the next sweep is due (monotonic), or ``None``."""
        if self._sweep_at is None or self._sweeping or draining:
            return None
        return self._sweep_at

    def sweep(self, now: float) -> None:
        """Look for rounds cut short if it is time, and run each found a second time.

        The check of rows and clocks rides on the sweep's wake-ups (every minute).
        """
        if self._sweeping or self._sweep_at is None or now < self._sweep_at:
            return
        if self._check_at is not None and now >= self._check_at and not self._checking:
            self._check()
        names = self._names
        self._sweeping = True
        writes = self._writes

        def done(result: lease.Survey | BaseException) -> None:
            self._sweeping = False
            self._last_sweep = mono = self._clock.monotonic()
            self._sweep_at = mono + SWEEP_EVERY
            if isinstance(result, BaseException):
                log.warning("sweep for rounds cut short failed: %s", result)
                return
            for found in result.cut_short:
                state = self._dispatcher.states.get(found.name)
                if state is None or state.busy or self._dispatcher.draining:
                    continue
                self._rerun(state, found.instant, given_back=found.given_back)
            if self._unwatch is not None and not result.cut_short and self._writes == writes:
                self._suspend(result.next_expiry, writes)

        self._control.run(lambda: self._store.survey(names), done)

    def _suspend(self, next_expiry: datetime | None, writes: int) -> None:
        """Sweep next when the earliest held lease expires (on the 15 s grid), or after a
        write: nothing else can change what the sweep finds (in-process clocks only)."""
        self._suspended = True
        if self._writes != writes:  # a write slipped in before it could see the flag
            self._suspended = False
            return
        if next_expiry is None:
            self._sweep_at = None
            return
        until = next_expiry.timestamp() - self._store.now_ms() / 1000  # on the lease clock
        self._sweep_at = self._on_grid(self._clock.monotonic() + max(0.0, until), strictly=False)

    def _on_write(self) -> None:
        """A lease write in this process (any thread): a suspended sweep resumes."""
        self._writes += 1
        if self._suspended:
            self._post(self._resume)

    def _resume(self) -> None:
        if self._suspended:
            self._suspended = False
            self._sweep_at = self._on_grid(self._clock.monotonic(), strictly=True)

    def _on_grid(self, mono: float, *, strictly: bool) -> float:
        """The first time at (or, ``strictly``, after) ``mono`` that a sweep every 15 s
        would run. After a write, strictly: a sweep due at that very moment would have
        been sent before it."""
        last = self._last_sweep if self._last_sweep is not None else mono
        gap = (mono - last) / SWEEP_EVERY
        steps = math.floor(gap) + 1 if strictly else math.ceil(gap)
        return last + max(1, steps) * SWEEP_EVERY

    def close(self) -> None:
        """Stop watching the lease writes (the scheduler stopped)."""
        if self._unwatch is not None:
            self._unwatch()

    # -- rows and clocks ---------------------------------------------------------------------

    def _check(self) -> None:
        """Recreate missing lease rows; compare this replica's clock with the database's."""
        self._checking = True
        clock, store, names = self._clock, self._store, self._names

        def check() -> tuple[list[str], float]:
            missing = store.missing(names)
            if missing:
                store.ensure(missing)
            before = clock.now()
            db_now = store.now_ms() / 1000
            after = clock.now()
            return missing, (before.timestamp() + after.timestamp()) / 2 - db_now

        def done(result: tuple[list[str], float] | BaseException) -> None:
            self._checking = False
            self._check_at = self._clock.monotonic() + CHECK_EVERY
            if isinstance(result, BaseException):
                log.warning("checking the lease rows failed: %s", result)
                return
            missing, skew = result
            if missing:
                log.warning(
                    "the lease row of %d job(s) was missing, recreated (deleted by hand? a "
                    "database restored from an older backup?): %s",
                    len(missing),
                    ", ".join(repr(name) for name in missing),
                )
            if abs(skew) > CLOCK_SKEW_WARNING:
                log.error(
                    "this replica's clock is %.1f s %s the database's: replicas' clocks must "
                    "agree to within a schedule's granularity (is NTP running?); claims of "
                    "instants more than %g s ahead of the database are refused",
                    abs(skew),
                    "ahead of" if skew > 0 else "behind",
                    lease.CLAIM_AHEAD_LIMIT,
                )

        self._control.run(check, done)

    def _rerun(self, state: JobState, instant: datetime, *, given_back: bool) -> None:
        dispatcher = self._dispatcher
        dispatcher.take(state)
        issued, claimed_at = self._clock.now(), self._clock.monotonic()

        def done(result: lease.Claim | BaseException | None) -> None:
            late = too_late(claimed_at, self._clock.monotonic())
            if late and isinstance(result, lease.Claim):
                log.warning(
                    "job %r: the claim of its second run came back too late to keep: given back",
                    state.job.name,
                )
            if isinstance(result, BaseException) or result is None or dispatcher.draining or late:
                if isinstance(result, BaseException):
                    log.error("job %r: claiming the second run failed: %s", state.job.name, result)
                elif result is not None:
                    dispatcher.hand_back(result)
                dispatcher.schedule_after(state, issued)
                return
            log.info(
                "job %r: running the round of %s a second time (%s)",
                state.job.name,
                instant.isoformat(),
                "it was cut short"
                if given_back
                else "its lease expired: the first round died with its process or lost "
                "the database",
            )
            state.metrics.rerun()
            dispatcher.start_round(
                state,
                instant,
                attempt=2,
                token=result.token,
                claimed_at=claimed_at,
                reason=Reason.RERUN,
            )

        self._control.run(
            lambda: self._store.claim_rerun(state.job.name, instant, self._replica_id),
            done,
            dispatcher.give_back,
        )
