"""The sweep: finds rounds cut short and runs each a second time; and the minute check.

- **Sweep**: every ~15 s, one query over this replica's leased jobs finds the rounds cut
  short (not run to its end, or its end not on record; no second run yet; no later
  instant claimed since), run a second time (attempt 2), those of one instant claimed in
  one statement (`cronjob.engine._reruns`): one replica wins each.
- **Replica record**: each sweep puts this replica on record as seen now, in its own
  statement on PostgreSQL, its transaction elsewhere ([lease.LeaseStore.survey][]):
  whole (host, pid, version, start, jobs) until a sweep wrote it, then its ``seen`` only.
- **Per-instance pauses**: read with each sweep (a lease row ``cronjob pause`` wrote);
  their instants skipped while paused.
- **Requests** (``cronjob trigger``, ``resume --catch-up``): each sweep reads the open
  requests ([lease.Triggers][]) and hands them to `cronjob.engine._requests` (which
  takes those of this replica's jobs), then to the wings (a backfill's instants, see
  ``_wings``). On PostgreSQL a request's ``NOTIFY`` wakes the sweep at once (see
  `cronjob.engine._listen`).
- **Check** (`cronjob.engine._rowcheck`): a job whose lease row has gone gets it back,
  logged: every job's row every hour, and every minute the rows of the jobs a claim of
  this replica missed since (a missing row is never won: a claim tells). Every minute, a
  clock 2 s off the database's is logged as an error (`lease.CLAIM_AHEAD_LIMIT`).

On a fake clock (every replica in this process, see
[Clock.in_process][cronjob.Clock.in_process]) the sweeper watches the lease writes of the
process ([lease.LeaseStore.watch][]) and sends no statement while nothing can be found: a
sweep that found nothing runs again only once a lease is given back, or a lease held without
its end recorded may have expired (a replica crashed); it then runs on its 15 s grid, so
tests see the same sweeps at the same fake times. The check runs at start (the clock),
then only when a claim of this replica missed a job that no replica of the process holds
(its row may be gone), at most once a minute.

Dispatcher thread only (``_on_write`` excepted); statements run on the control thread.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import lease

from .._clock import Clock
from ._control import Control
from ._listen import Listener
from ._requests import Requests
from ._reruns import Reruns
from ._rowcheck import RowCheck
from ._state import JobState
from ._wings import Wing

__all__ = ["Sweeper"]

log = logging.getLogger("cronjob")

#: Seconds between two sweeps for rounds cut short.
SWEEP_EVERY = 15.0

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _earliest(*times: datetime | None) -> datetime | None:
    return min((t for t in times if t is not None), default=None)


class Sweeper:
    """Sweeps for rounds cut short, and checks rows and clocks, for ``names``; keeps
    ``replica`` on record with each sweep.

    Args:
        clock: The scheduler's clock.
        store: The lease store.
        control: Runs the statements.
        states: The jobs' states by name (the dispatcher's).
        reruns: Claims and starts the second runs of the rounds a sweep found cut short.
        requests: Takes the requests a sweep read.
        wings: Told of the requests each sweep read, after ``requests`` (the list is
            the façade's, filled before the dispatcher starts).
        replica_id: This replica's id.
        names: The leased jobs swept.
        post: Runs a callable on the dispatcher thread (from any thread).
        replica: This replica as put on record by each sweep.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        states: Mapping[str, JobState],
        reruns: Reruns,
        requests: Requests,
        wings: Sequence[Wing],
        replica_id: str,
        names: list[str],
        post: Callable[[Callable[[], None]], object],
        replica: lease.ReplicaRow | None = None,
    ) -> None:
        self._clock = clock
        self._replica = replica
        #: A sweep put the whole record on record: later ones refresh its ``seen`` only.
        self._recorded = False
        #: The sweeps began (the database was ready): the record may be on the table.
        self._began = False
        self._store = store
        self._control = control
        self._states = states
        self._replica_id = replica_id
        self._names = dict.fromkeys(names)  # ordered; snapshot per sweep (names_changed)
        # Local timers, on the clock's monotonic time; none until the database is ready.
        self._sweep_at: float | None = None
        self._sweeping = False
        self._again = False  # sweep again at once: a backfill's round ended meanwhile
        #: The check of the lease rows and the clock (it rides on the sweep's wake-ups).
        self.rows = RowCheck(
            clock=clock,
            store=store,
            control=control,
            names=self._names,
            states=states,
            salt=replica_id,
        )
        # Idle sweeps skipped on an in-process clock: the leases of these names told held
        # (name -> (token, expires_ms)), give-backs seen, whether the sweep waits for
        # one of those, and the earliest expiry the last sweep read.
        self._post = post
        # Only watched on an in-process clock: a set of 100,000 names is 4 MB.
        self._wanted: set[str] = set(names) if clock.in_process else set()
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, int | None]] = {}
        self._claimed: dict[str, int] = {}  # name -> latest instant claimed (epoch s)
        self._given_back = 0
        self._suspended = False
        self._read_expiry: datetime | None = None
        self._last_sweep: float | None = None
        self._unwatch = store.watch(self._on_write) if clock.in_process else None
        self._triggers = lease.Triggers(store)
        self._requests = requests
        self._wings = wings
        self._reruns = reruns
        # PostgreSQL tells of a request at once (NOTIFY): sweep then, not 15 s later.
        self._listener = (
            Listener(store.engine, lambda: post(self.sweep_now))
            if Listener.applies(store.engine, clock)
            else None
        )
        #: The per-instance jobs: a pause of theirs is read with each sweep.
        self._local = [name for name, state in states.items() if not state.job.leased]

    def begin(self) -> None:
        """The database is ready (and start-up's catch-up sent): sweep and check now."""
        self._began = True
        self._sweep_at = self._clock.monotonic()
        self.rows.begin()
        if self._listener is not None:
            self._listener.start()

    def sweep_now(self) -> None:
        """A request was written (the listener heard it): sweep at once, unless one runs
        (it reads the requests too) or the sweep has not begun."""
        if self._sweep_at is not None and not self._sweeping:
            self._sweep_at = self._clock.monotonic()

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
        self.rows.tick(now)
        names = list(self._names)  # this thread's: the control thread reads the copy
        self._sweeping = True
        given_back = self._given_back

        def done(found: tuple[lease.Survey, list[lease.TriggerRow]] | BaseException) -> None:
            self._sweeping = False
            self._last_sweep = mono = self._clock.monotonic()
            self._sweep_at = mono + SWEEP_EVERY
            if isinstance(found, BaseException):
                log.warning("sweep for rounds cut short failed: %s", found)
                return
            self._recorded = True
            result, requests = found
            self._requests.take(requests)
            for wing in self._wings:
                wing.swept(requests)
            self._reruns.claim(result.cut_short)
            if self._again:  # a backfill's round ended while this sweep read
                self._again = False
                self._sweep_at = mono
            elif (
                self._unwatch is not None
                and not result.cut_short
                and not any(wing.waiting for wing in self._wings)
            ):
                self._read_expiry = _earliest(result.next_expiry, self._manual_expiry(requests))
                self._suspend(given_back)

        replica, refresh = self._replica, self._recorded  # by the same statement (PostgreSQL)
        store, triggers, local = self._store, self._triggers, self._local

        def read() -> tuple[lease.Survey, list[lease.TriggerRow]]:
            survey = store.survey(names, replica=replica, refresh=refresh)
            if local:  # per-instance jobs' pauses: their rows exist only once paused
                paused = {row.name for row in store.read(local).values() if row.paused}
                self._post(lambda: self._set_paused(paused))
            return survey, triggers.read()

        self._control.run(read, done)

    def sweep_soon(self) -> None:
        """Sweep at once (after the one in flight, if one is)."""
        if self._sweep_at is None:
            return
        if self._sweeping:
            self._again = True
            return
        self._suspended = False
        self._sweep_at = self._clock.monotonic()

    def names_changed(self, added: list[str], dropped: list[str]) -> None:
        """Leased names came or went (schedules made of data): swept from now on, or not."""
        self._names.update(dict.fromkeys(added))
        for name in dropped:
            self._names.pop(name, None)
        if self._unwatch is not None:
            self._wanted = (self._wanted | set(added)) - set(dropped)

    def _set_paused(self, paused: set[str]) -> None:
        """Per-instance jobs paused (``paused``) or not, as a sweep read them."""
        for name in self._local:
            state = self._states[name]
            if state.paused != (name in paused):
                state.paused = name in paused
                log.info(
                    "per-instance job %r is %s on this replica",
                    name,
                    "paused: its instants are skipped" if state.paused else "resumed",
                )

    # -- requests (run-now, catch-up on resume) ------------------------------------------------

    def _manual_expiry(self, rows: list[lease.TriggerRow]) -> datetime | None:
        """The earliest expiry of a lease a manual round of these jobs holds: its round
        may be found cut short then (its replica died), without any write before it."""
        held = [
            row.lease_expires_ms
            for row in rows
            if row.name in self._wanted and row.open and row.lease_expires_ms is not None
        ]
        return None if not held else _EPOCH + timedelta(milliseconds=min(held))

    # -- idle sweeps on an in-process clock ------------------------------------------------

    def _suspend(self, given_back: int) -> None:
        """Sweep next when a lease held may have expired (on the 15 s grid), or after a
        give-back: nothing else can change what the sweep finds."""
        self._suspended = True
        if self._given_back != given_back:  # one slipped in before it could see the flag
            self._resume()
            return
        self._rewake()

    def _rewake(self) -> None:
        """A suspended sweep's wake: the earliest expiry of a lease held, on the grid."""
        if not self._suspended:
            return
        with self._lock:
            expiries = [ms for _, ms in self._held.values()]
        if any(ms is None for ms in expiries):  # held on the database's clock: unknown
            self._resume()
            return
        now_ms = self._store.now_ms()  # the in-process clock's: no statement
        if self._read_expiry is not None:
            expiries.append(round(self._read_expiry.timestamp() * 1000))
        if not expiries:
            self._sweep_at = None
            return
        until = max(0, min(ms for ms in expiries if ms is not None) - now_ms) / 1000
        self._sweep_at = self._on_grid(self._clock.monotonic() + until, strictly=False)

    def _on_write(self, write: lease.LeaseWrite) -> None:
        """A lease write in this process (any thread): keep the held leases; a give-back,
        or a lease held that may expire earlier, moves a suspended sweep."""
        if write.kind is lease.WriteKind.REQUESTED:
            # Counted as a give-back: a sweep in flight that read before the request
            # must not suspend on it (see _suspend).
            with self._lock:
                self._given_back += 1
            if self._suspended:
                self._post(self._resume)
            return
        ours = [(name, token) for name, token in write.leases if name in self._wanted]
        if not ours:
            return
        with self._lock:
            if write.kind is lease.WriteKind.HELD:
                for name, token in ours:
                    self._held[name] = (token, write.expires_ms)
                    if write.instant is not None:
                        self._claimed[name] = max(write.instant, self._claimed.get(name, -1))
            else:
                for name, token in ours:
                    if self._held.get(name, (None,))[0] == token:
                        del self._held[name]
                if write.kind is lease.WriteKind.GIVEN_BACK:
                    self._given_back += 1
        if self._suspended:
            self._post(self._resume if write.kind is lease.WriteKind.GIVEN_BACK else self._rewake)

    def _resume(self) -> None:
        if self._suspended:
            self._suspended = False
            self._sweep_at = self._on_grid(self._clock.monotonic(), strictly=True)

    def claims_missed(self, names: list[str], instant: datetime) -> None:
        """A claim of ``instant`` by this replica did not win ``names``: another replica
        won them, or their rows are paused, or gone. Their rows are read at the next
        check (every minute). On an in-process clock only the jobs that no replica of
        the process claimed then, nor holds, are; and the check runs at once (at most
        once a minute: it is not on a timer there)."""
        if self._unwatch is None:
            self.rows.suspect(names)
            return
        epoch = int(instant.timestamp())
        with self._lock:
            unexplained = [
                name
                for name in names
                if name not in self._held and self._claimed.get(name, -1) < epoch
            ]
        if unexplained:
            self.rows.suspect(unexplained, at_once=True)

    def _on_grid(self, mono: float, *, strictly: bool) -> float:
        """The first time at (or, ``strictly``, after) ``mono`` that a sweep every 15 s
        would run. After a write, strictly: a sweep due at that very moment would have
        been sent before it."""
        last = self._last_sweep if self._last_sweep is not None else mono
        gap = (mono - last) / SWEEP_EVERY
        steps = math.floor(gap) + 1 if strictly else math.ceil(gap)
        return last + max(1, steps) * SWEEP_EVERY

    def close(self, *, leave: bool = False) -> None:
        """Stop watching the lease writes and listening (the scheduler stopped); with
        ``leave`` (a clean stop), take this replica's record off the table too, so that
        it leaves the live list at once (see `_leave`)."""
        if self._unwatch is not None:
            self._unwatch()
        if self._listener is not None:
            # Its wake-up goes through the control thread: a database that hangs holds
            # that thread, whose wait at stop is bounded, not the stop itself.
            self._listener.close(send=lambda wake: self._control.run(wake, lambda _r: None))
        if leave:
            self._leave()

    def _leave(self) -> None:
        """Queue the delete of this replica's record on the control thread, after every
        statement queued before it (a sweep that writes the record among them), so that
        nothing writes it back. Only once a sweep began (none before: nothing to take
        off). A failure is logged: the record then ages out, a minute after the last
        sweep, as a crashed replica's does. The scheduler bounds the wait for it (see
        ``CONTROL_SETTLE_SECONDS``)."""
        replica = self._replica
        if replica is None or not self._began:
            return
        store = self._store

        def leave() -> None:
            try:
                store.remove_replica(replica.holder, started=replica.started)
            except lease.LeaseError as exc:
                log.warning(
                    "replica %s: its record could not be taken off the replica table (%s): "
                    "it is listed as live until a minute after its last sweep",
                    replica.holder,
                    exc,
                )
            else:
                log.debug("replica %s: its record is off the replica table", replica.holder)

        # The dispatcher has gone (its inbox is closed): nothing is posted back.
        self._control.run(leave, lambda _result: None)
