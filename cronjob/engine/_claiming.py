"""The claims of an instant: this replica's share, the rest after a grace, the rounds held.

The dispatcher's heap says which leased jobs are due at an instant (a little ahead of it:
see `Claims.lead`); `Claims.claim_due` claims them. This replica's share (see
``_peers``) goes out in one statement as far ahead as claims take (``_lead``), and the
rounds it wins are held until the instant (`Claims.start_held`); what the other
replicas' shares left unclaimed is claimed once a grace has passed (`Claims.claim_rest`),
with the jobs of this replica's share its early claim did not win; an instant too small to
share is claimed whole, at the instant. Every claim's statement runs on the control thread
and its result comes back through the inbox; the rounds won are handed to the dispatcher
(`start_rounds`), the jobs not won go back in
its heap. Leases won that will not run here (too late, draining, stopped) are given back.

Threads: everything here runs on the dispatcher's thread and is part of its scheduling
state (the leases won that will not run here are given back through ``_giveback``).
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

import lease

from .._clock import Clock
from ._control import Control
from ._decided import noting_given_up
from ._giveback import GiveBacks
from ._keeper import too_late
from ._lead import LEAD_MAX, ClaimLead
from ._owed import owe, owe_ran_over
from ._peers import GRACE, Peers
from ._ports import Outage, Starter, Timetable
from ._state import Flags, JobState, Reason, Run

__all__ = ["SATURATED_AFTER", "Claims"]

#: Seconds a sync round may run, or wait for a worker thread, before the threads count
#: as saturated (see `Claims.workers_saturated`): a saturated replica claims no
#: sync job of an instant, which another replica then takes.
SATURATED_AFTER = 1.0

log = logging.getLogger("cronjob")

_GRACE = timedelta(seconds=GRACE)


@dataclass
class _Rest:
    """Jobs of an instant claimed later than this replica's share: the other replicas'
    shares, after the grace, if they left them unclaimed (and jobs of this replica's
    share its claim sent ahead did not win); or, ``whole``, an instant too small to
    share, claimed whole at the instant itself."""

    #: When to claim them: on the wall clock like the instant.
    at: datetime
    instant: datetime
    states: list[JobState]
    #: Put off once already because every worker thread was busy.
    deferred: bool = False
    #: A small instant claimed whole (see Claims.claim_due), not others' shares.
    whole: bool = False


@dataclass
class _Held:
    """Rounds won ahead of their instant (see `Claims.lead`), started at it."""

    instant: datetime
    start: Callable[[], None]
    #: Undoes the claim instead (the scheduler began to drain meanwhile).
    drop: Callable[[], None]


class Claims:
    """Claims instants for the dispatcher and keeps what is owed of them: the rest of past
    instants (claimed after the grace) and the rounds won ahead (started at the instant).

    Args:
        timetable: The heap the jobs claimed came off, and go back to when not won.
        starter: Starts the rounds won.
        runs: The rounds in flight (read to tell saturated worker threads).
        max_workers: The worker threads for sync rounds.
        give_backs: Gives back the leases won that will not run here.
        clock: The scheduler's clock.
        replica_id: This replica's id: the holder of what it claims.
        store: The lease store (the claims, the give-backs).
        control: Runs the statements.
        flags: The scheduler's life flags.
        peers: The live replicas and each one's share of an instant.
        history: Whether the round history is kept: the unfinished rounds a claim gives
            up are then put in it (see `noting_given_up`).

    The façade then wires in `outage` (told how the database answered each claim) and
    `missed` (told the names a claim did not win).
    """

    def __init__(
        self,
        *,
        timetable: Timetable,
        starter: Starter,
        runs: Collection[Run],
        max_workers: int,
        give_backs: GiveBacks,
        clock: Clock,
        replica_id: str,
        store: lease.LeaseStore,
        control: Control,
        flags: Flags,
        peers: Peers,
        history: bool = True,
    ) -> None:
        self._timetable = timetable
        self._history = history
        self._starter = starter
        self._runs = runs
        self._max_workers = max_workers
        self._give_backs = give_backs
        #: Told how the database answered each claim (recovery: an outage, its end).
        self.outage: Outage
        #: Told the names a claim of an instant did not win (the sweep's row check).
        self.missed: Callable[[list[str], datetime], None]
        self._clock = clock
        self._replica_id = replica_id
        self._store = store
        self._control = control
        self._flags = flags
        self._peers = peers
        #: Other replicas' shares of past instants, in order, claimed once the grace passed.
        self._rest: list[_Rest] = []
        #: Rounds won ahead of their instant, in order, started when it comes.
        self._held: list[_Held] = []
        #: How long this replica's claims take: they go out that much ahead of an instant.
        self.claim_lead = ClaimLead()

    def lead(self) -> float:
        """Seconds ahead of an instant its share's claim goes out: as long as claims take
        (see ``_lead``); while this replica needs to be seen by the others (see
        `Peers.lead`), ahead of any replica's claims. Every round still starts at
        its instant."""
        if self._peers.lead:
            return LEAD_MAX + self._peers.lead
        return self.claim_lead.seconds

    def claim_due(
        self,
        due: dict[datetime, list[JobState]],
        now: datetime,
        mono: float,
        *,
        saturated: bool,
    ) -> None:
        """Claim the leased jobs ``due`` at each instant (the dispatcher's wake at ``now``,
        monotonic ``mono``, found them in its heap): this replica's share at once, the
        others' after the grace; ``saturated``: every worker thread was busy as it woke."""
        for instant, states in due.items():
            shares = self._peers.share(instant, states)
            # Too few to share: claimed whole, the first to claim wins, as without peers.
            mine, rest = shares if shares is not None else (states, [])
            if rest:
                self._add_rest(_Rest(instant + self._peers.rest_after(instant), instant, rest))
            if saturated:
                mine = self._refuse_sync(instant, mine)
            if not mine:
                continue
            if shares is None:
                # Not ahead by the claims' lead: every replica claims these, and one whose
                # claim finds the lease still held by the round before (ending before the
                # instant) would otherwise have lost the instant if that round's replica
                # then stops. Ahead only to be seen (see Peers.lead), as before.
                at = instant - timedelta(seconds=self._peers.lead)
                if at > now:
                    self._add_rest(_Rest(at, instant, mine, whole=True))
                    continue
                self.claim(instant, mine, then=self._claimed_whole(instant, mine))
                continue
            self.claim(
                instant,
                mine,
                then=self._claimed_share(instant, mine, mono),
                lost_later=instant > now,
            )

    def next_wake(self) -> datetime | None:
        """When something owed is due (wall clock): a held round's instant, or the rest
        of an instant to claim; ``None`` when nothing is owed."""
        wakes: list[datetime] = []
        if self._held:
            wakes.append(self._held[0].instant)
        if self._rest:
            wakes.append(self._rest[0].at)
        return min(wakes) if wakes else None

    def _claimed_share(
        self, instant: datetime, mine: list[JobState], woke: float
    ) -> Callable[[set[str]], None]:
        """What to do when the claim of this replica's share of ``instant``, sent on the
        wake at monotonic ``woke``, answered: learn how long claims take, tell peers."""

        def then(won: set[str]) -> None:
            self.claim_lead.took(self._clock.monotonic() - woke)
            self._peers.claimed_share(instant, mine, won, whole=False)

        return then

    def _claimed_whole(self, instant: datetime, mine: list[JobState]) -> Callable[[set[str]], None]:
        return functools.partial(self._peers.claimed_share, instant, mine, whole=True)

    def _add_rest(self, rest: _Rest) -> None:
        bisect.insort(self._rest, rest, key=lambda r: r.at)

    def _claim_later(self, instant: datetime, lost: list[JobState]) -> bool:
        """Claim ``lost`` (jobs of this replica's share whose claim, sent ahead of
        ``instant``, did not win them) one grace after ``instant``, whatever this replica's
        turn for the rest: a lease still held by the round before is free by then.
        ``False`` if that claim has gone out already (the others' covered them then)."""
        for rest in self._rest:
            if rest.instant == instant and rest.at == instant + _GRACE and not rest.deferred:
                rest.states.extend(lost)
                return True
        if instant + _GRACE <= self._clock.now():
            return False
        self._add_rest(_Rest(instant + _GRACE, instant, lost))
        return True

    def hold(self, instant: datetime, start: Callable[[], None], drop: Callable[[], None]) -> None:
        """Run ``start`` when ``instant`` comes (rounds won ahead of it, or a per-instance
        round fired ahead), or ``drop`` if a drain begins first."""
        bisect.insort(self._held, _Held(instant, start, drop), key=lambda h: h.instant)

    def _unhold(self, won: list[JobState], token: int, instant: datetime) -> None:
        """Draining before the instant of rounds won ahead: hand them on, as rounds cut
        short (another replica's sweep runs them; see `GiveBacks.hand_back`)."""
        why = "was won ahead of its instant, then a drain began"
        self._give_backs.hand_back(won, token, instant, why, logging.INFO)
        for state in won:
            self._timetable.schedule_after(state, instant)

    def start_held(self, now: datetime) -> None:
        """Start the rounds held for an instant that has come."""
        while self._held and self._held[0].instant <= now:
            self._held.pop(0).start()

    def claim_rest(self, now: datetime) -> None:
        """Claim, once their grace passed, the jobs other replicas left unclaimed (and
        small instants, whole, at their instant)."""
        while self._rest and self._rest[0].at <= now:
            rest = self._rest.pop(0)
            states = rest.states
            if rest.whole:
                self.claim(rest.instant, states, then=self._claimed_whole(rest.instant, states))
                continue
            sync = [state for state in states if not state.job.is_async]
            if sync and not rest.deferred and self.workers_saturated():
                # Every thread is busy: let replicas with free threads take the sync jobs
                # first, and take what they leave one grace later. Left alone, a job in
                # nobody's share (views that disagree) would miss its instant.
                self._add_rest(_Rest(rest.at + _GRACE, rest.instant, sync, deferred=True))
                states = [state for state in states if state.job.is_async]
            if states:
                then = functools.partial(self._peers.claimed_rest, rest.instant)
                self.claim(rest.instant, states, then=then, rest=True)

    def drop_rest(self) -> None:
        """Draining: forget the rest of past instants; hand on rounds won ahead."""
        for rest in self._rest:
            for state in rest.states:
                self._timetable.schedule_after(state, rest.instant)
        self._rest.clear()
        for held in self._held:
            held.drop()
        self._held.clear()

    # -- worker threads -------------------------------------------------------------------

    def workers_saturated(self) -> bool:
        """Whether the worker threads are saturated: each held by a sync round that has
        run for `SATURATED_AFTER` or more (jobs that run long or hang), or some sync
        round has waited that long for a thread (more work than the threads get through).

        A sync round holds a thread from its start until its end, leased or per-instance;
        async rounds run on the loop and take none. Short rounds queued behind each other
        are not saturation: an instant's share larger than the pool (10,000 jobs on 8
        threads) is through within the second, and refusing the next instant while it
        is would skip instants a free pool runs at once.
        """
        now = self._clock.monotonic()
        held = 0
        for run in self._runs:
            if run.ended or run.pinned.job.is_async:
                continue
            if run.started_at is None:  # waiting for a thread
                if now - run.queued_mono >= SATURATED_AFTER:
                    return True
            elif now - run.started_mono >= SATURATED_AFTER:
                held += 1
        return held >= self._max_workers

    def _refuse_sync(self, instant: datetime, states: list[JobState]) -> list[JobState]:
        """Leave ``instant`` of the sync jobs in ``states`` unclaimed; return the others.

        Claimed now they would only wait in the queue, holding (and renewing) leases that
        keep every other replica from running them. Left unclaimed, another replica's
        claim of the same instant takes them.
        """
        refused = [state for state in states if not state.job.is_async]
        if refused:
            log.warning(
                "instant %s of job(s) %s not claimed on this replica: all %d worker "
                "thread(s) are busy (another replica may run it)",
                instant.isoformat(),
                ", ".join(repr(state.job.name) for state in refused),
                self._max_workers,
            )
            for state in refused:
                self._timetable.schedule_after(state, instant)
        return [state for state in states if state.job.is_async]

    # -- claims ---------------------------------------------------------------------------

    def claim(
        self,
        instant: datetime,
        states: list[JobState],
        *,
        reason: Reason = Reason.SCHEDULE,
        then: Callable[[set[str]], None] | None = None,
        lost_later: bool = False,
        rest: bool = False,
    ) -> None:
        """Claim ``instant`` for ``states`` in one statement, then start what was won
        (a round won ahead of its instant starts at the instant). Each claimed row keeps
        its job's next instant (``due_s``, see [lease.LeaseStore.unclaimed][]).

        With ``rest`` (the others' shares, after the grace), the names are not sent:
        one query asks which rows of ``instant`` are still unclaimed
        ([lease.LeaseStore.unclaimed][], normally none), and only those of
        ``states`` are claimed, by name (no statement when there are none). Past the
        query's limit, every name is claimed, as before it existed.

        ``then`` is told the names won, when the database answered, before their rounds
        start. A claim the database could not answer leaves the instant owed: recovery
        catches it up once the database answers again (unless a later instant came first).
        With ``lost_later`` (a share claimed ahead of its instant), jobs not won are
        claimed once more with the rest of the instant (see `_claim_later`).
        """
        timetable = self._timetable
        names = [state.job.name for state in states]
        issued, claimed_at = self._clock.now(), self._clock.monotonic()
        catch_up = reason is not Reason.SCHEDULE

        def done(result: lease.ClaimBatch | BaseException) -> None:
            won: set[str] = set()
            if isinstance(result, BaseException):
                log.error(
                    "claiming %s for %d job(s) failed: %s", instant.isoformat(), len(names), result
                )
                if isinstance(result, lease.DatabaseUnavailable):
                    self.outage.database_lost()
            else:
                won = set(result.names)
                self.outage.database_answered()
                if len(won) < len(names):
                    self.missed([n for n in names if n not in won], instant)
                if then is not None:
                    then(won)
            late = too_late(claimed_at, self._clock.monotonic())
            ahead = instant > self._clock.now()
            # Jobs of a share claimed ahead that it did not win: claimed again later.
            retry = (
                lost_later
                and not isinstance(result, BaseException)
                and not timetable.draining
                and not self._flags.stopped
            )
            claimed: list[JobState] = []
            lost: list[JobState] = []
            for state in states:
                if state.job.name in won:
                    claimed.append(state)
                elif retry:
                    lost.append(state)
                else:
                    timetable.schedule_after(state, max(instant, issued) if catch_up else instant)
            batch = None if isinstance(result, BaseException) else result
            if batch is not None and claimed:
                if late or timetable.draining or self._flags.stopped:
                    # The drain began meanwhile, or the claim came back too late: hand the
                    # instant on.
                    self._hand_on(claimed, batch, claimed_at, late=late)
                    for state in claimed:
                        timetable.schedule_after(
                            state, max(instant, issued) if catch_up else instant
                        )
                    claimed = []
                else:
                    self._report_claimed(claimed, batch, reason)
                    if batch.superseded or batch.ended:
                        self._owe(claimed, batch)
            if lost and not self._claim_later(instant, lost):
                for state in lost:
                    timetable.schedule_after(state, instant)
            if not claimed:
                return
            assert batch is not None
            rounds: list[tuple[JobState, int | None]] = [(state, batch.token) for state in claimed]
            start = functools.partial(
                self._starter.start_rounds,
                rounds,
                instant,
                attempt=1,
                claimed_at=claimed_at,
                reason=reason,
            )
            if ahead:  # claimed ahead: the rounds start together, on time
                drop = functools.partial(self._unhold, claimed, batch.token, instant)
                self.hold(instant, start, drop)
            else:
                start()

        store, holder = self._store, self._replica_id
        work: Callable[[], lease.ClaimBatch]
        if rest:
            jobs = {state.job.name: state.job for state in states}
            within = self._peers.rest_within(instant)

            def work() -> lease.ClaimBatch:
                found = store.unclaimed(instant, within=within)
                asked = names
                if len(found) < lease.UNCLAIMED_LIMIT:
                    asked = [name for name in found if name in jobs]
                    if not asked:
                        return lease.ClaimBatch(instant=instant, token=0, names=(), superseded={})
                # Off the dispatcher's thread: a data schedule may change (a Job swapped in).
                due = {name: jobs[name].schedule.next(instant) for name in asked}
                return store.claim_batch(asked, instant, holder, due=due)

        else:
            due = {state.job.name: state.next_after(instant) for state in states}

            def work() -> lease.ClaimBatch:
                return store.claim_batch(names, instant, holder, due=due)

        if self._history:  # the unfinished rounds a claim gives up go on record
            work = noting_given_up(work, store=store, holder=holder, clock=self._clock)
        self._control.run(work, done, self._give_backs.give_back)

    def _hand_on(
        self, states: list[JobState], batch: lease.ClaimBatch, claimed_at: float, *, late: bool
    ) -> None:
        """Give back the leases of rounds just won that will not run here."""
        took = self._clock.monotonic() - claimed_at
        why = f"came back {took:.1f} s after it was sent, when its leases may be lost already"
        give_backs = self._give_backs
        if late:
            give_backs.hand_back(states, batch.token, batch.instant, why, logging.WARNING)
        else:
            give_backs.hand_back(states, batch.token, batch.instant, "met a drain", logging.INFO)

    def _owe(self, claimed: list[JobState], batch: lease.ClaimBatch) -> None:
        """Hand each round just won of a hand-off the instants the round before it held
        the lease over: one it gave up (`owe`), or one that ended after them (`owe_ran_over`)."""
        for state in claimed:
            gave_up = batch.superseded.get(state.job.name)
            if gave_up is not None:
                owe(state, gave_up[0], batch.instant, self._store.ttl)
            ran = batch.ended.get(state.job.name)
            if ran is not None:
                owe_ran_over(state, ran[0], ran[1], batch.instant)

    def _report_claimed(
        self, claimed: list[JobState], batch: lease.ClaimBatch, reason: Reason
    ) -> None:
        """Log what a claim that is kept says: the unfinished rounds it gave up, and, for
        a catch-up, each round caught up (counted too)."""
        instant = batch.instant.isoformat()
        for name, (old_instant, old_attempt) in batch.superseded.items():
            log.warning(
                "job %r: the unfinished round of %s (attempt %d) is given up: "
                "instant %s started first",
                name,
                old_instant.isoformat(),
                old_attempt,
                instant,
            )
        if reason is Reason.SCHEDULE or reason is Reason.OVERLAP:  # not caught up
            return
        for state in claimed:
            state.metrics.caught_up(reason.text, missed=state.missed)
            log.info(
                "job %r: catching up instant %s%s",
                state.job.name,
                instant,
                " after the database outage" if reason is Reason.OUTAGE else "",
            )
