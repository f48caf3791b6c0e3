"""Recovery: reaching the database, catch-up at start-up and after an outage.

The seed's rules, as this part applies them:

- **Database down at start**: retried with back-off (1 s doubling to 30 s), logged.
  Per-instance jobs run meanwhile; leased instants that come due are skipped. A
  database that refuses ([lease.DatabaseRefused][]: no such database, credentials,
  a privilege) is not down: the start fails on it.
- **Catch-up**: once the database is reached, each leased job whose most recent instant
  (within the last 24 h, measured on that instant) was not claimed and not overrun runs
  it once, on one replica. A job that never ran is owed it only if it comes after the
  job's first deployment (its lease row's first write, `lease.LeaseRow.deployed`):
  the instants before were never its to run. A schedule made of data is owed from its
  commit instead, even one that no replica ran then (see ``_committed``).
- **Outage**: a claim the database could not answer leaves its instant owed. Recovery
  then probes the database (1 s, doubling to 8 s) and, once it answers, applies the same
  catch-up rule: the most recent instant each job missed, once, on one replica; the
  claim itself decides which replica, so replicas recovering together run it once.
- **Sweep** and **check**: once the database is ready, `Sweeper`
  (re-runs of rounds cut short, missing rows, clock skew).
- **Wings** (see ``_wings``): the capabilities beside the core (the schedules made of
  data, backfills, the outbox) are called here at the same points: once the database is
  reached (a wing may load what the catch-up covers first), once the catch-up is sent,
  on each wake, with the sweep, and at stop.

Dispatcher thread only; the statements run on the control thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

import lease

from .._bounds import OneOff
from .._clock import Clock
from .._policy import CatchUp
from ._committed import owed_from
from ._control import Control
from ._metrics import missed_before
from ._overlap import oldest_owed
from ._peers import Peers
from ._ports import Claimer, Timetable
from ._skipped import BY_LATEST, BY_NONE, BY_WINDOW, skip_after, skip_note, write_notes
from ._state import JobState, Reason
from ._sweep import Sweeper
from ._wings import Wing

__all__ = ["Recovery"]

log = logging.getLogger("cronjob")

#: Catch-up only runs an instant this recent, unless a job's ``catch_up_window`` says.
CATCH_UP_HORIZON = timedelta(days=1)
#: Lease states of a round not run to its end (a second run may follow).
_UNENDED = (lease.LeaseState.RUNNING, lease.LeaseState.CUT)
#: First and longest pause between attempts to reach a database that is down.
RETRY_FIRST, RETRY_LONGEST = 1.0, 30.0
#: ... and to probe a database lost after start (what a failover usually takes).
PROBE_FIRST, PROBE_LONGEST = 1.0, 8.0


class Recovery:
    """Brings the replica to the database, and what was owed back to the schedule.

    Args:
        clock: The scheduler's clock.
        store: The lease store.
        control: Where the statements run.
        timetable: The heap the jobs owed are taken off (or put back on, not due yet).
        claims: Claims the instants owed.
        peers: Told how many leased jobs there are (schedules made of data come and go).
        states: The jobs' states by name (the dispatcher's).
        sweeper: The sweep for rounds cut short (begun once the catch-up is sent).
        wings: The capabilities beside the core, called at the same points (the list is
            the façade's, filled before the dispatcher starts).
        replica_id: The holder named in claims.
        migrate: Brings the tables to head (raises [lease.DatabaseUnavailable][]
            while the database is down).
        describe_database: The database's URL, password hidden, for logs.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        timetable: Timetable,
        claims: Claimer,
        peers: Peers,
        states: Mapping[str, JobState],
        sweeper: Sweeper,
        wings: Sequence[Wing],
        replica_id: str,
        migrate: Callable[[], None],
        describe_database: Callable[[], str],
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._timetable = timetable
        self._claims = claims
        self._peers = peers
        self._wings = wings
        self._replica_id = replica_id
        self._migrate = migrate
        self._describe_database = describe_database
        # The leased jobs (and schedules made of data, see `leased_changed`): the sweep
        # and catch-up read their rows.
        self._leased = {s.job.name: s for s in states.values() if s.job.leased}
        #: The tables are at head and the database answered (read from any thread).
        self.db_ready = False
        #: Start-up's catch-up is being decided (its read of the rows is in flight): no
        #: instant may be claimed meanwhile, or a claim of the next instant sent just
        #: before it could overtake the catch-up of the one missed.
        self.catch_up_pending = False
        #: Why the database was not reached at start, while it is not (any thread reads).
        self.database_error: str | None = None
        # Local timers, on the clock's monotonic time.
        self._db_retry_at: float | None = None
        self._db_retry_pause = RETRY_FIRST
        #: The sweep for rounds cut short, and the check of rows and clocks.
        self.sweeper = sweeper
        # A database lost after start: when to probe it next (None: not lost).
        self._probe_at: float | None = None
        self._probe_pause = PROBE_FIRST
        self._probing = False
        # The latest probe read the rows, and no claim was written since.
        self._probe_read = False

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
        """Let the wings load what start-up's catch-up covers (the schedules made of
        data, if this replica registers tasks), catch up what start-up owes, then start
        sweeping (statements run in order).

        A replica of per-instance jobs only sweeps too: the sweep puts it on record and
        takes the requests and pauses of its jobs."""
        loading = 1  # the wings still loading, and this call's own share

        def loaded() -> None:
            nonlocal loading
            loading -= 1
            if loading == 0:
                self._caught_up_after_load()

        for wing in self._wings:
            loading += wing.reached(then=loaded)
        if loading == 1:
            self._start_catch_up()
            return
        # Nothing is claimed before the wings' loads are in: the catch-up covers them.
        self.catch_up_pending = True
        loaded()

    def catch_up_loaded(self, states: list[JobState]) -> None:
        """Catch up ``states`` as start-up would have: schedules made of data whose load
        failed at start and succeeded later."""
        if not states:
            return
        now = self._clock.now()

        def done(result: dict[str, lease.LeaseRow] | BaseException) -> None:
            if isinstance(result, BaseException):
                log.warning("reading the schedules' rows for catch-up failed: %s", result)
            else:
                self._catch_up(states, result, now, reason=Reason.CATCH_UP)

        self._control.run(lambda: self._read_rows(states), done)

    def _caught_up_after_load(self) -> None:
        self.catch_up_pending = False
        self._start_catch_up()

    def leased_changed(self, added: list[JobState], dropped: list[str]) -> None:
        """Schedules made of data came (``added``) or went (``dropped``, by name): the
        sweep, the catch-up and the peers follow, at a cost of the change's size."""
        for state in added:
            self._leased[state.job.name] = state
        for name in dropped:
            self._leased.pop(name, None)
        self.sweeper.names_changed([state.job.name for state in added], dropped)
        for wing in self._wings:
            wing.names_changed(added, dropped)
        self._peers.set_count(len(self._leased))

    def _start_catch_up(self) -> None:
        if not self._leased:
            self._begin()
            return
        leased = list(self._leased.values())  # this thread's, for the control thread
        now = self._clock.now()
        self.catch_up_pending = True

        def done(result: dict[str, lease.LeaseRow] | BaseException) -> None:
            self.catch_up_pending = False
            if isinstance(result, lease.DatabaseUnavailable):
                # What start-up owes is then owed as an outage's: the probes read the
                # rows until the database answers, and catch up the latest instant.
                log.warning("reading the lease table for catch-up failed: %s", result)
                self.database_lost()
            elif isinstance(result, BaseException):
                log.error("reading the lease table for catch-up failed: %s", result)
            else:
                self._catch_up(leased, result, now, reason=Reason.CATCH_UP)
            self._begin()

        self._control.run(lambda: self._read_rows(leased), done)

    def _begin(self) -> None:
        """Start-up's catch-up is sent: the sweep and the wings begin."""
        self.sweeper.begin()
        for wing in self._wings:
            wing.begin()

    def _read_rows(self, leased: list[JobState]) -> dict[str, lease.LeaseRow]:
        # The specs go on record for tools that read the table (cronjob status).
        specs = {state.job.name: state.job.schedule.spec for state in leased}
        # Each row's next instant, as this replica schedules it: a due on record that is
        # later (a schedule changed to come sooner; or none yet) is lowered to it.
        now = self._clock.now()
        due = {state.job.name: state.job.schedule.next(now) for state in leased}
        names = list(specs)
        self._store.ensure(names, specs=specs, due=due)
        return self._store.read(names)

    # -- an outage after start --------------------------------------------------------------

    def database_lost(self) -> None:
        """A claim found the database unreachable: its instant is owed; probe until it answers.

        Idempotent while the outage lasts.

        A probe only reads (its ``ensure`` writes nothing when the rows are on record), so
        a database that answers reads but not writes (a lock held on the rows, a SQLite
        file locked by another process) passes it; the catch-up's claim that then fails
        counts as the probe failing: the probes go on backing off instead of starting
        over every second.
        """
        if self._probe_at is not None or self._probing or not self.db_ready:
            return
        if self._probe_read:
            self._probe_read = False
            pause = self._probe_pause
            self._probe_pause = min(pause * 2, PROBE_LONGEST)
            log.warning("database answers but takes no writes; next probe in %gs", pause)
            self._probe_at = self._clock.monotonic() + pause
            return
        log.warning(
            "database unreachable: the instants it misses are owed and caught up "
            "(the latest of each job, within the day) once it answers"
        )
        self._probe_pause = PROBE_FIRST
        self._probe_at = self._clock.monotonic() + PROBE_FIRST

    def database_answered(self) -> None:
        """A statement succeeded: if an outage is pending, probe (and catch up) at once."""
        self._probe_read = False  # a claim was written: the outage is over
        if self._probe_at is not None:
            self._probe_at = self._clock.monotonic()

    def probe(self, mono: float) -> None:
        """Probe a lost database if it is time; once it answers, catch up what it owes."""
        if self._probe_at is None or self._probing or mono < self._probe_at:
            return
        self._probe_at = None
        self._probing = True
        now = self._clock.now()
        leased = list(self._leased.values())

        def done(result: dict[str, lease.LeaseRow] | BaseException) -> None:
            self._probing = False
            if isinstance(result, BaseException):
                pause = self._probe_pause
                self._probe_pause = min(pause * 2, PROBE_LONGEST)
                log.warning("database still unreachable (%s); next probe in %gs", result, pause)
                self._probe_at = self._clock.monotonic() + pause
                return
            log.info("database answers again: catching up what the outage owes")
            self._probe_read = True
            self._catch_up(leased, result, now, reason=Reason.OUTAGE)

        self._control.run(lambda: self._read_rows(leased), done)

    def _catch_up(
        self,
        leased: Sequence[JobState],
        rows: dict[str, lease.LeaseRow],
        now: datetime,
        *,
        reason: Reason,
    ) -> None:
        """Claim each job's most recent instant that start-up (or an outage) owes it.

        The seed's rule: the most recent instant at or before ``now`` lies within the last
        day, is the job's to run — the job has run before (its row has an instant), or it
        never ran and the instant comes strictly after its first deployment on record (an
        instant at the very moment the row was written belongs before it, as a replica's
        schedule starts strictly after its start); for a schedule made of data, strictly
        after the commit of its timing, also when no replica ran then (`owed_from`) — no
        replica claimed it, and no round that ran to its end overran it. A row whose first
        deployment and commit are unknown (an older release wrote it) owes nothing before
        it has run. A job busy with a round is skipped. The job's policy bends the rule:
        ``catch_up="none"`` owes nothing, ``catch_up_window`` replaces the day, and
        ``catch_up="all"`` claims the oldest instant owed (its end claims the next, see
        ``_overlap``), ``catch_up="oldest"`` the oldest alone (the instants after it are
        passed over), unless the row's round awaits its second run: that run (the
        sweep's) is the oldest, its end goes on from there, and ``"oldest"`` passes over
        the instants after it. The instants a policy passes over go on record as skipped
        by it (see `_skipped`).
        """
        latest = now.replace(microsecond=0) + timedelta(seconds=1)  # instants <= now
        owed: dict[datetime, list[JobState]] = {}
        notes: list[lease.RoundRow | None] = []
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
            catch_up = state.job.policy.catch_up
            if row is None or state.busy or state.retired:
                continue
            instant = state.job.schedule.prev(latest)
            if instant is None:
                continue
            since = owed_from(row)  # its first deployment, or a data schedule's commit
            if row.instant is not None:
                if row.instant >= instant:
                    continue  # claimed already
                if state.job.task is not None and since and instant <= since:
                    continue  # a schedule made of data, changed since: not its instant
            elif isinstance(state.job.schedule, OneOff):
                pass  # a one-off never ran: its one instant is owed within the day
            elif since is None or instant <= since:
                # Never ran, and the instant came before its first deployment or commit (or
                # when is unknown, on a row an older release wrote): its next one is its first.
                continue
            if row.skipped_through is not None and instant <= row.skipped_through:
                continue  # overrun by a round that ran to its end
            # What the policy does not run is on record as skipped by it (`_skipped`).
            note = functools.partial(skip_note, state.job.name, state.job.schedule, row)
            late = now - instant > state.job.policy.catch_up_window
            if catch_up is CatchUp.NONE or late:  # history, not a round to run
                by = BY_NONE if catch_up is CatchUp.NONE else BY_WINDOW
                notes.append(note(instant, now, policy=by, holder=self._replica_id, through=True))
                continue
            if catch_up is CatchUp.ALL or catch_up is CatchUp.OLDEST:  # the oldest first
                # A round that awaits its second run (the sweep's) is the oldest owed.
                held = row.instant if row.attempt == 1 and row.state in _UNENDED else None
                latest_owed = instant
                if held is None:
                    instant = oldest_owed(state.job, row, instant, now)
                    notes.append(note(instant, now, policy=BY_WINDOW, holder=self._replica_id))
                if catch_up is CatchUp.OLDEST:  # the others are passed over, on record
                    skipped = skip_after(
                        state.job.name,
                        state.job.schedule,
                        instant if held is None else held,
                        latest_owed,
                        now,
                        holder=self._replica_id,
                    )
                    notes.append(skipped)
                if held is not None:
                    continue  # its second run comes first; its end goes on from there
            else:  # the instants before the latest are not run: count them missed
                state.missed = missed_before(state.job.schedule, row, instant, now)
                notes.append(note(instant, now, policy=BY_LATEST, holder=self._replica_id))
            self._timetable.take(state)
            if state.starts_at(instant) > now:
                # Its jitter's delay has not passed (a replica started within it): the
                # instant is not missed, it starts on time, as on the other replicas.
                self._timetable.schedule_after(state, instant, when=instant)
                continue
            owed.setdefault(instant, []).append(state)
        for instant, states in owed.items():
            self._claims.claim(instant, states, reason=reason)
        write_notes(self._control, self._store, [n for n in notes if n is not None])

    def next_wake(self, *, draining: bool) -> float | None:
        """The earliest monotonic time this part has something to do, or ``None``."""
        candidates: list[float] = []
        if self.db_ready:
            for wing in self._wings:
                at = wing.next_wake(draining=draining)
                if at is not None:
                    candidates.append(at)
        if self._db_retry_at is not None:
            candidates.append(self._db_retry_at)
        if self._probe_at is not None and not self._probing:
            candidates.append(self._probe_at)
        sweep_at = self.sweeper.next_wake(draining=draining)
        if sweep_at is not None:
            candidates.append(sweep_at)
        return min(candidates, default=None)

    def sweep(self, now: float) -> None:
        """Sweep for rounds cut short if it is time (see `Sweeper`); then the wings'."""
        if self.db_ready:
            self.sweeper.sweep(now)
            for wing in self._wings:
                wing.sweep(now)

    def poll(self, now: float) -> None:
        """Let the wings act if it is time (the schedules' changes read): also while
        start-up's catch-up runs (over 100,000 rows it takes a while), never during a
        drain."""
        if self.db_ready:
            for wing in self._wings:
                wing.poll(now)

    def close(self, *, leave: bool = False) -> None:
        """Stop watching the lease writes (the scheduler stopped); with ``leave`` (a clean
        stop), take this replica's record off the replica table, unless the database is
        known to be unreachable now (being probed after a statement failed, or never
        reached): a stop then does not wait on it, and the record ages out in a minute."""
        reachable = self.db_ready and self._probe_at is None and not self._probing
        if leave and not reachable:
            log.info(
                "replica %s: the database is unreachable: its record stays on the replica "
                "table, listed as live until a minute after its last sweep",
                self._replica_id,
            )
        for wing in self._wings:
            wing.close()
        self.sweeper.close(leave=leave and reachable)
