"""The check of the lease rows and of the clock: a job whose lease row has gone gets it
back, and a replica whose clock is far off the database's says so.

- **Rows**: claims only update rows, so a row deleted by hand or lost to a restored backup
  would stop its job on every replica without a word. A missing row is never won, so a
  claim that missed jobs names the rows to read: every minute (`CHECK_EVERY`) the check
  reads those (`suspect`), at most `CHECK_MAX` of them, and every hour
  (`FULL_CHECK_EVERY`) every job's row; not at start, where `ensure` has just made every
  missing row. At 100,000 jobs on ten replicas, a check of every row every minute was a
  sixth of what the lease table read per instant. A recreated row is logged.
- Claims miss many jobs when the replicas' views of each other disagree, or a loaded
  replica claims its share after the others took it as the rest: all were won by
  others. Reading every such row each minute on every replica (or, before, every row)
  was most of what the table read per instant then. So each check reads at most
  `CHECK_MAX` of the names, a different draw each minute and on each replica (a hash of
  the replica, the check's number and the name). A gone row is missed by every claim of
  its job on every replica: a job due every minute is among the names every minute and
  drawn within minutes; one due hourly, at its instants only, and may wait for the
  hourly check of every row.
- **Lost under its round**: a renewal that finds a round's lease gone reads that row at
  once (`RowCheck.lost`), not drawn nor waiting for the minute: a gone row is written
  back as that round cut short ([lease.LeaseStore.restore_cut][]), so its second run
  follows the rule of rounds cut short and the job's next instant is claimed on time,
  whatever the number of jobs.
- **Clock**: every minute, this replica's clock against the database's; 2 s off is logged
  as an error (`lease.CLAIM_AHEAD_LIMIT`).

Dispatcher thread only; statements run on the control thread.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime

import lease

from .._clock import Clock
from ._control import Control
from ._state import JobState

__all__ = ["CHECK_EVERY", "CHECK_MAX", "CLOCK_SKEW_WARNING", "FULL_CHECK_EVERY", "RowCheck"]

log = logging.getLogger("cronjob")

#: Seconds between two checks of the clock against the database's, and of the lease rows
#: of the jobs that claims missed since the last.
CHECK_EVERY = 60.0
#: Seconds between two checks of every job's lease row (the first this long after start).
FULL_CHECK_EVERY = 3600.0
#: The most names a check reads (one query); of more, a draw that changes each minute.
CHECK_MAX = 500
#: The most names kept for the next check (past it, new ones are not kept).
SUSPECTS_MAX = 100_000
#: A replica whose wall clock is further than this from the database's is logged.
CLOCK_SKEW_WARNING = 2.0


class RowCheck:
    """Checks the lease rows of ``names`` (the sweeper's, updated in place) and the clock."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        names: Mapping[str, None],
        states: Mapping[str, JobState],
        salt: str = "",
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._names = names
        self._states = states
        #: Mixed into each draw: replicas started together draw different names.
        self._salt = salt
        #: When the next check is due, and the next check of every row (monotonic); None
        #: until the database is ready.
        self._check_at: float | None = None
        self._full_at: float | None = None
        self._checking = False
        #: The names a claim missed since the last check.
        self._suspects: set[str] = set()
        #: The checks made: each draws its own `CHECK_MAX` of more names.
        self._count = 0
        #: Rounds whose lease a renewal found gone, not yet read: name -> (instant, attempt).
        self._lost: dict[str, tuple[datetime, int]] = {}
        self._restoring = False

    def begin(self) -> None:
        """The database is ready and the start-up's `ensure` made every missing row:
        check the clock now, every row in an hour."""
        self._check_at = self._clock.monotonic()
        self._full_at = self._check_at + FULL_CHECK_EVERY

    def tick(self, now: float) -> None:
        """Check if it is time (``now`` monotonic)."""
        if self._check_at is not None and now >= self._check_at and not self._checking:
            self._check()

    def suspect(self, names: Iterable[str], *, at_once: bool = False) -> None:
        """A claim missed ``names``: read their rows at the next check (``at_once``: now,
        unless a check ran within `CHECK_EVERY`). Too many: every row then."""
        if self._check_at is None:
            return
        if len(self._suspects) < SUSPECTS_MAX:
            self._suspects.update(names)
        if at_once:
            self.tick(self._clock.monotonic())

    def lost(self, name: str, instant: datetime, attempt: int) -> None:
        """A renewal found the lease of job ``name``'s round of ``instant`` (``attempt``)
        gone: read its row now (with those of other such rounds told meanwhile) and, if it
        is missing, write it back as that round cut short, its ``due`` the job's next
        instant. A row taken by another claim is left as it is."""
        self._lost[name] = (instant, attempt)
        if not self._restoring:
            self._restore()

    def _restore(self) -> None:
        rounds, self._lost = self._lost, {}
        self._restoring = True
        clock, store, states = self._clock, self._store, self._states

        def restore() -> list[str]:
            missing = store.missing(rounds)
            if not missing:
                return []
            now = clock.now()
            cut = {}
            for name in missing:
                instant, attempt = rounds[name]
                state = states.get(name)
                due = state.job.schedule.next(max(now, instant)) if state else None
                cut[name] = lease.CutRound(instant=instant, attempt=attempt, due=due)
            return store.restore_cut(cut)

        def done(result: list[str] | BaseException) -> None:
            self._restoring = False
            if isinstance(result, BaseException):
                # The minute's check finds the row, as it finds any missed claim's.
                log.warning("reading the rows of lost leases failed: %s", result)
                self._suspects.update(rounds)
            elif result:
                log.warning(
                    "the lease row of %d job(s) was gone under its running round (deleted "
                    "by hand? a database restored from an older backup?), written back with "
                    "that round cut short: %s",
                    len(result),
                    ", ".join(f"{name!r} instant {rounds[name][0].isoformat()}" for name in result),
                )
            if self._lost:
                self._restore()

        self._control.run(restore, done)

    def _check(self) -> None:
        """Recreate missing lease rows (every job's when the full check is due, else the
        ones claims missed); compare this replica's clock with the database's."""
        self._checking = True
        mono = self._clock.monotonic()
        full = self._full_at is not None and mono >= self._full_at
        if full:
            names = list(self._names)
            self._full_at = mono + FULL_CHECK_EVERY
        else:
            suspects = [name for name in self._suspects if name in self._names]
            names = _draw(suspects, f"{self._salt}:{self._count}")
        self._count += 1
        self._suspects = set()
        clock, store, states = self._clock, self._store, self._states

        def check() -> tuple[list[str], float]:
            missing = store.missing(names) if names else []
            if missing:
                now = clock.now()  # read here: a whole Job is swapped in when it changes
                due = {n: s.job.schedule.next(now) for n in missing if (s := states.get(n))}
                store.ensure(missing, due=due)
            before = clock.now()
            db_now = store.now_ms() / 1000
            after = clock.now()
            return missing, (before.timestamp() + after.timestamp()) / 2 - db_now

        def done(result: tuple[list[str], float] | BaseException) -> None:
            self._checking = False
            self._check_at = self._clock.monotonic() + CHECK_EVERY
            if isinstance(result, BaseException):
                log.warning("checking the lease rows failed: %s", result)
                if full:
                    self._full_at = self._check_at
                else:
                    self._suspects.update(names)
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


def _draw(names: list[str], salt: str) -> list[str]:
    """``names`` if they are `CHECK_MAX` or fewer, else `CHECK_MAX` of them, by a hash of
    ``salt`` (the replica and the check's number) and each name: another draw at each
    check and on each replica, the same on every run."""
    if len(names) <= CHECK_MAX:
        return names
    prefix = f"{salt}:".encode()

    def rank(name: str) -> bytes:
        return hashlib.blake2b(prefix + name.encode(), digest_size=8).digest()

    return sorted(names, key=rank)[:CHECK_MAX]
