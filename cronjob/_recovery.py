"""Recovery: reaching the database, catch-up, and the sweep that re-runs rounds cut short.

The seed's rules, as this part applies them:

- **Database down at start**: retried with back-off (1 s doubling to 30 s), logged.
  Per-instance jobs run meanwhile; leased instants that come due are skipped. A
  database that refuses (:class:`lease.DatabaseRefused`: no such database, credentials,
  a privilege) is not down: the start fails on it.
- **Catch-up**: once the database is reached, each leased job whose most recent instant
  (within the last 24 h, measured on that instant) was not claimed and not overrun runs
  it once, on one replica.
- **Outage**: a claim the database could not answer leaves its instant owed. Recovery
  then probes the database (1 s, doubling to 8 s) and, once it answers, applies the same
  catch-up rule: the most recent instant each job missed, once, on one replica; the
  claim itself decides which replica, so replicas recovering together run it once.
- **Sweep**: every ~15 s, one query over all of this replica's leased jobs finds rounds
  cut short that the seed says run a second time (attempt 2); each is claimed with its
  own statement, so two replicas never both run it. On a fake clock (every replica in
  this process, see :attr:`Clock.in_process`) a sweep that found nothing is not
  repeated until a lease write or the expiry of a lease held now could change what it
  finds; it then resumes on its 15 s grid, so tests see the same sweeps at the same
  fake times, without a statement per replica per idle 15 s.
- **Check**: at start and then every minute, a job whose lease row has gone (deleted by
  hand, a backup restored from before the job existed, a start-up ``ensure`` that
  failed) gets it back, logged, since claims only update rows; and a clock that
  disagrees with the database's by more than 2 s is logged as an error (a replica far
  ahead has its claims refused, see :data:`lease.CLAIM_AHEAD_LIMIT`).

Dispatcher thread only; the statements run on the control thread.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import lease

from ._clock import Clock
from ._control import Control
from ._keeper import too_late
from ._state import JobState, Reason

if TYPE_CHECKING:
    from ._dispatcher import Dispatcher

__all__ = ["Recovery"]

log = logging.getLogger("cronjob")

#: Seconds between two sweeps for rounds cut short.
SWEEP_EVERY = 15.0
#: Catch-up only runs an instant this recent.
CATCH_UP_HORIZON = timedelta(days=1)
#: First and longest pause between attempts to reach a database that is down.
RETRY_FIRST, RETRY_LONGEST = 1.0, 30.0
#: Seconds between two checks of the lease rows and of the clock against the database's.
CHECK_EVERY = 60.0
#: A replica whose wall clock is further than this from the database's is logged.
CLOCK_SKEW_WARNING = 2.0
#: ... and to probe a database lost after start (what a failover usually takes).
PROBE_FIRST, PROBE_LONGEST = 1.0, 8.0


class Recovery:
    """Brings the replica to the database, and what was owed back to the schedule.

    Args:
        clock: The scheduler's clock.
        store: The lease store.
        control: Where the statements run.
        dispatcher: Claims and starts the rounds recovery finds owed.
        replica_id: The holder named in claims.
        migrate: Brings the tables to head (raises :class:`lease.DatabaseUnavailable`
            while the database is down).
        describe_database: The database's URL, password hidden, for logs.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        dispatcher: Dispatcher,
        replica_id: str,
        migrate: Callable[[], None],
        describe_database: Callable[[], str],
        post: Callable[[Callable[[], None]], object],
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._dispatcher = dispatcher
        self._replica_id = replica_id
        self._migrate = migrate
        self._describe_database = describe_database
        # The leased jobs, fixed at start: the sweep and catch-up read their rows.
        self._leased = [s for s in dispatcher.states.values() if s.job.leased]
        self._leased_names = [state.job.name for state in self._leased]
        #: The tables are at head and the database answered (read from any thread).
        self.db_ready = False
        #: Why the database was not reached at start, while it is not (any thread reads).
        self.database_error: str | None = None
        # Local timers, on the clock's monotonic time.
        self._db_retry_at: float | None = None
        self._db_retry_pause = RETRY_FIRST
        self._sweep_at: float | None = None
        self._sweeping = False
        self._check_at: float | None = None  # set once the database is ready
        self._checking = False
        # Idle sweeps skipped on an in-process clock: lease writes seen, and whether the
        # sweep waits for one (or for the next expiry) before it runs again.
        self._post = post
        self._writes = 0
        self._suspended = False
        self._last_sweep: float | None = None
        self._unwatch = store.watch(self._on_write) if clock.in_process else None
        # A database lost after start: when to probe it next (None: not lost).
        self._probe_at: float | None = None
        self._probe_pause = PROBE_FIRST
        self._probing = False

    # -- reaching the database --------------------------------------------------------------

    def first_migration(self) -> None:
        """Bring the tables to head now (the caller's thread); retry later if it is down.

        Raises:
            lease.DatabaseRefused: the server answered and refused (no such database,
                credentials, a privilege): waiting will not heal it, so the start fails.
        """
        try:
            self._migrate()
        except lease.DatabaseRefused:
            raise
        except lease.DatabaseUnavailable as exc:
            self.database_error = str(exc)
            log.warning(
                "database %s unavailable at start (%s); retrying in the background",
                self._describe_database(),
                exc,
            )
            self._db_retry_at = self._clock.monotonic()
        else:
            self.db_ready = True

    def retry_database(self, now: float) -> None:
        """Try to reach the database again if it is down and the pause has passed.

        A server that was down at start and now answers with a refusal is not going to
        heal by waiting either, but the start has returned: it is logged as an error and
        still retried (someone may create the database or fix the grant), with back-off.
        """
        if self._db_retry_at is None or now < self._db_retry_at:
            return
        self._db_retry_at = None

        def done(result: BaseException | None) -> None:
            if isinstance(result, BaseException):
                self.database_error = str(result)
                pause = self._db_retry_pause
                self._db_retry_pause = min(pause * 2, RETRY_LONGEST)
                if isinstance(result, lease.DatabaseRefused):
                    log.error(
                        "database %s refuses this replica (%s): waiting will not fix it, "
                        "check the URL, the credentials and the grants; next attempt in %gs",
                        self._describe_database(),
                        result,
                        pause,
                    )
                else:
                    log.warning(
                        "database still unavailable (%s); next attempt in %gs", result, pause
                    )
                self._db_retry_at = self._clock.monotonic() + pause
                return
            log.info("database %s reached", self._describe_database())
            self.database_error = None
            self.db_ready = True
            self.on_database_ready()

        self._control.run(self._migrate, done)

    def on_database_ready(self) -> None:
        """Catch up what start-up owes, then start sweeping (statements run in order)."""
        if not self._leased:
            return
        leased = self._leased
        now = self._clock.now()

        def done(result: dict[str, lease.LeaseRow] | BaseException) -> None:
            if isinstance(result, BaseException):
                log.error("reading the lease table for catch-up failed: %s", result)
            else:
                self._catch_up(leased, result, now, reason=Reason.CATCH_UP)
            self._sweep_at = self._check_at = self._clock.monotonic()

        self._control.run(self._read_rows, done)

    def _read_rows(self) -> dict[str, lease.LeaseRow]:
        self._store.ensure(self._leased_names)
        return self._store.read(self._leased_names)

    # -- an outage after start --------------------------------------------------------------

    def database_lost(self) -> None:
        """A claim found the database unreachable: its instant is owed; probe until it answers.

        Idempotent while the outage lasts.
        """
        if self._probe_at is not None or self._probing or not self.db_ready:
            return
        log.warning(
            "database unreachable: the instants it misses are owed and caught up "
            "(the latest of each job, within the day) once it answers"
        )
        self._probe_pause = PROBE_FIRST
        self._probe_at = self._clock.monotonic() + PROBE_FIRST

    def database_answered(self) -> None:
        """A statement succeeded: if an outage is pending, probe (and catch up) at once."""
        if self._probe_at is not None:
            self._probe_at = self._clock.monotonic()

    def probe(self, mono: float) -> None:
        """Probe a lost database if it is time; once it answers, catch up what it owes."""
        if self._probe_at is None or self._probing or mono < self._probe_at:
            return
        self._probe_at = None
        self._probing = True
        now = self._clock.now()

        def done(result: dict[str, lease.LeaseRow] | BaseException) -> None:
            self._probing = False
            if isinstance(result, BaseException):
                pause = self._probe_pause
                self._probe_pause = min(pause * 2, PROBE_LONGEST)
                log.warning("database still unreachable (%s); next probe in %gs", result, pause)
                self._probe_at = self._clock.monotonic() + pause
                return
            log.info("database answers again: catching up what the outage owes")
            self._catch_up(self._leased, result, now, reason=Reason.OUTAGE)

        self._control.run(self._read_rows, done)

    def _catch_up(
        self,
        leased: Sequence[JobState],
        rows: dict[str, lease.LeaseRow],
        now: datetime,
        *,
        reason: Reason,
    ) -> None:
        """Claim each job's most recent instant that start-up (or an outage) owes it.

        The seed's rule: the job has run before (its row has an instant), the most recent
        instant at or before ``now`` lies within the last day, no replica claimed it, and
        no round that ran to its end overran it. A job busy with a round is skipped.
        """
        latest = now.replace(microsecond=0) + timedelta(seconds=1)  # instants <= now
        owed: dict[datetime, list[JobState]] = {}
        ahead = now + timedelta(seconds=lease.CLAIM_AHEAD_LIMIT)
        for state in leased:
            row = rows.get(state.job.name)
            if row is not None and row.instant is not None and row.instant > ahead:
                log.warning(
                    "job %r: its lease row records instant %s as claimed, later than this "
                    "replica's clock (%s): it runs nothing before then. A replica's clock "
                    "runs ahead, or the rows were left by an earlier run (a test's fake "
                    "clock that ran later?)",
                    state.job.name,
                    row.instant.isoformat(),
                    now.isoformat(),
                )
            if row is None or row.instant is None or state.busy:
                continue  # never ran: it starts with its next instant
            instant = state.job.schedule.prev(latest)
            if instant is None or now - instant > CATCH_UP_HORIZON:
                continue  # history, not a missed round
            if row.instant >= instant:
                continue  # claimed already
            if row.skipped_through is not None and instant <= row.skipped_through:
                continue  # overrun by a round that ran to its end
            self._dispatcher.take(state)
            owed.setdefault(instant, []).append(state)
        for instant, states in owed.items():
            self._dispatcher.claim(instant, states, reason=reason)

    # -- the sweep --------------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Look for rounds cut short if it is time, and run each found a second time.

        The check of rows and clocks rides on the sweep's wake-ups (every minute).
        """
        if not self.db_ready or self._sweeping or self._sweep_at is None or now < self._sweep_at:
            return
        if self._check_at is not None and now >= self._check_at and not self._checking:
            self._check()
        names = self._leased_names
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
                self._suspend(result.next_expiry)

        self._control.run(lambda: self._store.survey(names), done)

    def _suspend(self, next_expiry: datetime | None) -> None:
        """Sweep next when the earliest held lease expires (on the 15 s grid), or after a
        write: nothing else can change what the sweep finds (in-process clocks only)."""
        self._suspended = True
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
        clock, store, names = self._clock, self._store, self._leased_names

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

    def next_wake(self, *, draining: bool) -> float | None:
        """The earliest monotonic time this part has something to do, or ``None``."""
        candidates: list[float] = []
        if self._db_retry_at is not None:
            candidates.append(self._db_retry_at)
        if self._probe_at is not None and not self._probing:
            candidates.append(self._probe_at)
        if self._sweep_at is not None and not self._sweeping and not draining:
            candidates.append(self._sweep_at)
        return min(candidates, default=None)
