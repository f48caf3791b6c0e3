"""The peers: which replicas are alive, and how an instant's rounds are shared among them.

An instant with at least `SPREAD_FROM` jobs per live replica is split among them in
two claims per replica (a smaller one is claimed whole by every replica, the first winning,
in one claim each, as before):

1. **Its share, at the instant.** The jobs due are put in one order every replica agrees
   on (their names' order), and dealt out in turn to the live replicas (sorted by id),
   starting at a replica drawn from a hash of the instant: every replica gets
   ``J // R`` or ``J // R + 1`` of them, at every instant.
2. **The rest, after a grace** (`GRACE`, on the scheduler's clock, times the replica's
   turn at that instant: see `rest_after`). Whatever a replica that is slow, draining,
   saturated or dead left unclaimed is taken by the others: the claim condition lets
   each instant be claimed once, so the first to claim a job wins it and the rest find
   it taken. The replicas look one after the other, a grace apart, the first in turn
   drawn from a hash of the instant: the first takes what was left, and the others'
   look (one read of the index on ``due_s``, over its last `REST_RECENT` seconds but once
   a minute) finds nothing, instead of every replica reading the same rows left at the
   same moment and racing for them. A replica alone in its view sends only the first
   claim.

Who is alive is learned from the lease table and the replicas' record: the replicas on
record within `RECORD_WITHIN` that run a job of ours (each one's sweep records it at
start and every 15 s), and the holders of claims at instants within the last day
([lease.LeaseStore.holders][]), plus this replica. Only the first read asks for a day of
claims, of every holder; later ones ask, of each replica known (seen, suspected, on
record now), for its latest claim at the instant they check or later, or else since the
last read (`HOLDERS_OVERLAP` before it, `HOLDERS_RECENT` at most): one probe of the index
on ``(holder, instant)`` a replica, whatever the number of jobs, and keep what earlier
reads found. A read takes each recent
record's ``(holder, started)`` only ([lease.LeaseStore.replica_starts][]), and the jobs
of the records whose pair it has not seen yet: a record's jobs are written only with its
replica's ``started`` (see [lease.LeaseStore.survey][]), so a pair once read keeps its
answer, and a replica that starts again (under the same id too, a millisecond or more
later on its clock) is read anew. The jobs (~50 bytes each) are read once per replica
start, not at every read, and only to ask whether one of ours is among them
([lease.LeaseStore.leasing][]: a replica of the same deployment answers from the
record's text, which is not parsed). One read (two queries; three when a record is new)
at start, then a few more while reads change the view (replicas starting together), the
first `FIRST_GAP` apart and twice as long each time a read changed nothing, up to
`CHECK_GAP`; later, at the grace of an instant that proved the view wrong, at most every
`CHECK_GAP` (never while the views agree). Holders alone would show only the replicas
that won some row lately: views would take many reads to agree. A replica of the view
that claimed nothing at such an instant is *suspected* (dead, draining, saturated) and
left out until it is seen claiming a later instant. Views that disagree for a while (a
replica that just joined, one just gone) cost nothing but spreading: a job nobody's
share covered is claimed after the grace, and two claims of one job are settled by the
lease, as always.

Dispatcher thread only; the read runs on the control thread.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import lease

from .._clock import Clock
from ._control import Control
from ._lead import LEAD_MAX
from ._state import JobState

__all__ = ["GRACE", "Peers", "REST_RECENT", "REST_WIDE_EVERY"]

log = logging.getLogger("cronjob")

#: Seconds after an instant before a replica claims the rest of the instant's jobs, the
#: shares of the others that they left unclaimed. A share left by a slow, saturated,
#: draining or dead replica starts this much (plus one claim's round trip) late.
GRACE = 0.1
#: Seconds ahead of the others' claims (see _lead) that a replica they do not see yet
#: claims its share (its rounds still start at the instant): claiming with them, it would
#: lose every job of its share to the others, whose shares cover it, and stay unseen.
LEAD = 0.05
#: The fewest jobs per live replica for which an instant is shared out; below, every
#: replica claims the instant's jobs whole (one statement each, none after the grace).
SPREAD_FROM = 2
#: The least time between two reads when instants keep proving the view wrong (a job
#: of one's share still running elsewhere does, at every instant).
CHECK_GAP = timedelta(seconds=5)
#: The least time between two reads while reads keep changing the view (replicas that
#: start or stop together): views converge within a few instants.
FIRST_GAP = timedelta(seconds=1)
#: While some replica is suspected, the holders are read again after CHECK_GAP, then
#: after twice as long each time, up to this: a suspected replica that claims again (it
#: was only slow) is dealt back in, though nothing else would make this one read.
RECHECK_MAX = timedelta(minutes=5)
#: A replica put on record (``cronjob_replica``, by its sweep every 15 s and at start)
#: within this long is counted as alive, unless suspected, even before it wins a claim.
RECORD_WITHIN = timedelta(seconds=60)
#: Seconds of ``due_s`` a look for an instant's rest reaches back, but for one look a
#: `REST_WIDE_EVERY` (see `Peers.rest_within`).
REST_RECENT = 10
#: How often (in instants' time) a replica's look for the rest reaches back a whole day.
REST_WIDE_EVERY = timedelta(minutes=1)
#: A replica that claimed no instant within this long is not counted as alive.
SEEN_WITHIN = timedelta(days=1)
#: A read after the first reads the holders of the claims at the instant it checks and
#: later, or else at instants from this long before the last read on: what it found is
#: kept, so only the claims since are new. A claim committed later than this after its
#: instant is missed by the reads, and its replica seen at its next claim instead.
HOLDERS_OVERLAP = timedelta(seconds=5)
#: ... and never further back than this: after a quiet spell (views agreed), a replica
#: still alive has claimed within it, and older claims were read before or do not matter.
HOLDERS_RECENT = timedelta(seconds=15)

#: A read of the live replicas: the holders (the latest instant each claimed), and each
#: recent record's (holder -> started, whether it leases a job of ours).
_Read = tuple[dict[str, datetime], dict[str, tuple[datetime, bool]]]

_GRACE = timedelta(seconds=GRACE)
#: The most a live replica's claim goes out ahead of its instant (see _lead).
_AHEAD = timedelta(seconds=LEAD_MAX + LEAD)
_SECOND = timedelta(seconds=1)


class Peers:
    """This replica's view of the live replicas, and its share of an instant's jobs."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        replica_id: str,
        jobs: Mapping[str, str],
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._replica_id = replica_id
        #: This replica's leased jobs (name -> spec) and tasks (name -> ""), to tell a
        #: replica running some.
        self._jobs = jobs
        #: The live replicas, sorted; this one is always among them.
        self.view: tuple[str, ...] = (replica_id,)
        #: The latest instant each replica was seen claiming.
        self._seen: dict[str, datetime] = {}
        #: Replicas put on record (the sweep's record) within RECORD_WITHIN, with a job of
        #: ours: counted alive before they claim anything (replicas starting together).
        self._recorded: set[str] = set()
        #: What the last read learnt of each record: holder -> (started, leases a job of
        #: ours). A record whose ``started`` is still the same is not read again.
        self._records: dict[str, tuple[datetime, bool]] = {}
        #: Replicas that claimed nothing at an instant, with it: left out until seen later.
        self._suspected: dict[str, datetime] = {}
        #: When to read next, on the wall clock (like instants, exact to the microsecond).
        self._read_at: datetime | None = None
        self._last_read: datetime | None = None
        #: The claims the next read of the holders starts from (instants): a day back
        #: for the first read, then a little before the last read that succeeded.
        self._holders_since: datetime | None = None
        #: The wait before the next read while some replica is suspected.
        self._recheck = CHECK_GAP
        #: The least time from the last read to one a check asks for: FIRST_GAP while
        #: reads change the view, doubled after each that did not, up to CHECK_GAP.
        self._gap = FIRST_GAP
        self._reading = False
        #: An instant whose rest this replica took: the next read tells who claimed none.
        self._check: datetime | None = None
        #: Some instant may be shared (enough leased jobs): only then do views matter
        #: enough for the reads while they settle.
        self._may_share = len(jobs) >= SPREAD_FROM * 2
        #: The last claim of this replica's share won none of it.
        self._unseen = False
        #: The instant of the last look for a rest that reached back a day.
        self._wide_at: datetime | None = None

    def set_count(self, leased: int) -> None:
        """This replica now runs ``leased`` leased jobs (schedules made of data came or
        went): whether an instant may be shared follows."""
        self._may_share = leased >= SPREAD_FROM * 2

    @property
    def lead(self) -> float:
        """Seconds ahead of an instant this replica claims its share: `LEAD` while
        the others seem not to see it (its last share was all taken by others), else 0."""
        return LEAD if self._unseen else 0.0

    # -- the view -------------------------------------------------------------------------

    def next_wake(self) -> datetime | None:
        """When the next read of the live replicas is due (wall clock), or ``None``."""
        return None if self._reading else self._read_at

    def tick(self, now: datetime) -> None:
        """Read the live replicas if it is time (the first time: now)."""
        if self._reading or not self._jobs:
            return
        if self._last_read is None:
            self._read_at = now
        if self._read_at is None or now < self._read_at:
            return
        self._reading = True
        self._last_read = now
        check, self._check = self._check, None
        if self._holders_since is None:
            since = now - SEEN_WITHIN  # the first read: a day of claims
        elif check is not None:
            since = check  # who claimed at the instant checked, or later
        else:  # the claims since the last read, but no older than a few instants
            since = max(self._holders_since, now - HOLDERS_RECENT)

        recorded_since = int((now - RECORD_WITHIN).timestamp() * 1000)
        jobs, store, me, known = self._jobs, self._store, self._replica_id, self._records
        # After the first read, only the replicas known (seen within a day, suspected, in
        # the view) or on record now are asked about: a probe each.
        first = self._holders_since is None
        known_replicas = {*self._seen, *self._suspected, *self.view}

        def read() -> _Read:
            # Replicas on record that lease some job of ours: at start, before any claim.
            starts = store.replica_starts(seen_since_ms=recorded_since)
            holders = store.holders(since, among=None if first else known_replicas | set(starts))
            records = {h: known[h] for h, at in starts.items() if h in known and known[h][0] == at}
            new = [holder for holder in starts if holder not in records and holder != me]
            records |= store.leasing(new, jobs, seen_since_ms=recorded_since)
            return holders, records

        def done(result: _Read | BaseException) -> None:
            self._reading = False
            # Read again only for a check (one asked for while this read ran: at once),
            # while reads still change the view (replicas starting together: a few reads
            # FIRST_GAP, then twice as long, apart), or while some replica is suspected.
            self._read_at = self._clock.now() if self._check is not None else None
            if isinstance(result, BaseException):
                log.warning("reading the live replicas failed: %s", result)
                return
            holders, self._records = result
            self._recorded = {holder for holder, (_, ours) in self._records.items() if ours}
            self._holders_since = now - HOLDERS_OVERLAP
            self._merge(holders, now, check)
            if self._gap < CHECK_GAP and self._read_at is None and self._may_share:
                self._read_at = _after_claims(self._clock.now() + self._gap)
            if self._suspected and self._read_at is None:
                self._read_at = _after_claims(self._clock.now() + self._recheck)
                self._recheck = min(self._recheck * 2, RECHECK_MAX)

        self._control.run(read, done)

    def _merge(self, holders: dict[str, datetime], now: datetime, check: datetime | None) -> None:
        """Add what a read at ``now`` found (the holders since the last read, and since
        ``check``): a replica seen stays seen until a day without a claim.

        A claim of an instant still to come (as the read saw it) is not counted: a clock
        far ahead, or rows left by earlier runs of a test whose fake clock starts anew.
        """
        since = now - SEEN_WITHIN
        # A claim sent ahead of its instant (at most AHEAD) counts: seen now.
        holders = {r: min(at, now) for r, at in holders.items() if at <= now + _AHEAD}
        seen = {replica: at for replica, at in self._seen.items() if at >= since}
        for replica, at in holders.items():
            if at > seen.get(replica, at - SEEN_WITHIN):
                seen[replica] = at
        self._seen = seen
        if check is not None:
            late = [
                replica
                for replica in self.view
                if replica != self._replica_id
                and (replica not in holders or holders[replica] < check)
            ]
            if late:
                log.info(
                    "replica %s: %s claimed nothing at %s: left out of the shares until "
                    "seen claiming again",
                    self._replica_id,
                    ", ".join(late),
                    check.isoformat(),
                )
            for replica in late:
                self._suspected[replica] = check
            if late:
                self._recheck = CHECK_GAP
        self._update()

    def _update(self) -> None:
        for replica, instant in list(self._suspected.items()):
            if self._seen.get(replica, instant) > instant:
                del self._suspected[replica]  # it claims again
        alive = self._seen.keys() | self._recorded
        view = tuple(sorted({self._replica_id} | (alive - self._suspected.keys())))
        self._gap = FIRST_GAP if view != self.view else min(self._gap * 2, CHECK_GAP)
        if view != self.view:
            log.debug("replica %s: live replicas %s", self._replica_id, ", ".join(view))
            self.view = view

    # -- shares ---------------------------------------------------------------------------

    def share(
        self, instant: datetime, states: Sequence[JobState]
    ) -> tuple[list[JobState], list[JobState]] | None:
        """Split the jobs due at ``instant`` into this replica's share and the rest;
        ``None`` when they are too few to share (claim them whole)."""
        view = self.view
        # Counted as two at least: a replica alone in its view may not be alone, and it
        # learns the others only by claiming a share that they take part of.
        if len(states) < SPREAD_FROM * max(2, len(view)):
            return None
        # Every replica deals the jobs in this order: their names'.
        ordered = sorted(states, key=_name)
        count = len(view)
        first = _first(instant, count)
        me = view.index(self._replica_id)
        mine: list[JobState] = []
        rest: list[JobState] = []
        for i, state in enumerate(ordered):
            (mine if (first + i) % count == me else rest).append(state)
        return mine, rest

    def rest_within(self, instant: datetime) -> int:
        """How far back (seconds of ``due_s``) this replica's look for the rest of
        ``instant`` reaches: `REST_RECENT`, and once every `REST_WIDE_EVERY` of instants
        the whole `lease.UNCLAIMED_WITHIN` (a day).

        A row is due at an instant with ``due_s`` equal to it, unless it missed earlier
        instants (every look of theirs failed: the database was out): the wide look finds
        those within a minute. Each claim leaves an entry behind in the index on
        ``due_s`` until the table is vacuumed; a look over a day walked them all at every
        instant on every replica (62 % of a core on a server with autovacuum off)."""
        wide = self._wide_at
        if wide is None or instant >= wide + REST_WIDE_EVERY or instant < wide:
            self._wide_at = instant
            return lease.UNCLAIMED_WITHIN
        return REST_RECENT

    def rest_after(self, instant: datetime) -> timedelta:
        """How long after ``instant`` this replica looks for the rest of it: `GRACE` times
        one plus its turn, which goes round the view with a hash of the instants (the
        replica that deals the first job of ``instant`` looks first)."""
        view = self.view
        turn = (view.index(self._replica_id) - _first(instant, len(view))) % len(view)
        return _GRACE * (1 + turn)

    def claimed_share(
        self, instant: datetime, share: Sequence[JobState], won: set[str], *, whole: bool
    ) -> None:
        """This replica claimed its ``share`` of ``instant`` and won the jobs in ``won``.

        Fewer than asked: another replica claimed part of this one's share, so their
        views differ (or it is alone in its view and others run too): check it. An
        instant claimed ``whole`` (too few jobs to share) is lost to the first claimer
        as a rule: only a win says something (this replica is seen now).
        """
        if whole:
            self._unseen = self._unseen and not won
            return
        self._unseen = bool(share) and not won
        if len(won) < len(share):
            self._check_after(instant)

    def claimed_rest(self, instant: datetime, won: set[str]) -> None:
        """This replica took the jobs in ``won`` of the rest of ``instant`` after the
        grace: some replicas did not claim their share in time. Check which."""
        if won:
            self._check_after(instant)

    def _check_after(self, instant: datetime) -> None:
        """Read the holders once the grace of ``instant`` passed (every replica's share is
        claimed by then): a replica of the view that claimed nothing at ``instant`` (dead,
        draining, saturated, slow) is suspected; one that claimed a share of a view of its
        own is seen."""
        self._check = instant
        at = instant + _GRACE
        if self._last_read is not None:
            at = max(at, _after_claims(self._last_read + self._gap))
        if self._read_at is None or at < self._read_at:
            self._read_at = at


def _after_claims(when: datetime) -> datetime:
    """The first moment at or after ``when`` that lies a grace past a whole second.

    Each row keeps only its latest claim, so a read sent just as an instant's claims
    go out could find a live replica's rows of the last instant already claimed again
    by others and its own claims of this one not yet made, and take it for gone. A
    grace past the instant, every replica's share of it is claimed.
    """
    at = when.replace(microsecond=0) + _GRACE
    return at if at >= when else at + _SECOND


def _first(instant: datetime, count: int) -> int:
    """The replica (its place in a view of ``count``) that deals the first job of
    ``instant`` and looks first for its rest: a hash of the instant, so that it goes round
    at instants a minute or an hour apart too (their seconds are multiples of the view's
    size more often than not)."""
    digest = hashlib.blake2b(str(int(instant.timestamp())).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def _name(state: JobState) -> str:
    return state.job.name
