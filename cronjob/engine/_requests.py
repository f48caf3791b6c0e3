"""Requests: the rounds an operator asked for, taken with the sweep.

Each sweep reads the open requests ([lease.Triggers][]) and hands them to `Requests.take`,
which takes those of this replica's jobs (a backfill's are the backfill wing's, see
``_backfill``):

- ``cronjob trigger``: a manual round under the job's lease (refused if held), its second
  run if cut short (given up after a second cut), or a per-instance job's round asked of
  this replica; started as the dispatcher starts a manual round (``start_manual``);
- ``resume --catch-up``: the instant skipped while paused, claimed as any catch-up.

Requests older than `lease.REQUEST_TTL` expire.

Dispatcher thread only; the statements run on the control thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import lease

from .._clock import Clock
from ._control import Control
from ._keeper import too_late
from ._ports import Claimer, Starter, Timetable
from ._state import JobState, Reason

__all__ = ["Requests"]

log = logging.getLogger("cronjob")


class Requests:
    """Takes the open requests a sweep read that this replica may run.

    Args:
        clock: The scheduler's clock.
        store: The lease store.
        control: Runs the statements.
        timetable: The heap a caught-up job is taken off; whether a drain began.
        starter: Starts the manual rounds taken.
        claims: Claims the instant a resume asks to catch up.
        states: The jobs' states by name (the dispatcher's).
        replica_id: This replica's id: the holder of the requests it takes.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        timetable: Timetable,
        starter: Starter,
        claims: Claimer,
        states: Mapping[str, JobState],
        replica_id: str,
    ) -> None:
        self._clock = clock
        self._control = control
        self._timetable = timetable
        self._starter = starter
        self._claims = claims
        self._states = states
        self._replica_id = replica_id
        self._triggers = lease.Triggers(store)
        #: Requests being taken (ids), so a sweep that overlaps does not take them twice
        #: (the backfill wing's too).
        self.taking: set[int] = set()

    def take(self, rows: list[lease.TriggerRow]) -> None:
        """Take the open requests a sweep read that this replica may run (a backfill's
        are the backfill wing's)."""
        if self._timetable.draining:
            return
        now = self._clock.now()
        expired: list[int] = []
        for row in rows:
            if row.backfill:
                continue
            state = self._states.get(row.name)
            pending = row.state is lease.TriggerState.PENDING
            if pending and (now - row.requested).total_seconds() > lease.REQUEST_TTL:
                expired.append(row.id)
                continue
            if state is None or row.id in self.taking:
                continue
            leased = state.job.leased
            if row.replica is not None:  # a per-instance job's round, asked of one replica
                if pending and not leased and row.replica == self._replica_id:
                    self._take(state, row, leased=False)
            elif not leased:
                continue
            elif row.instant is not None:
                if pending:
                    self._catch_up(state, row)
            elif pending:
                self._take(state, row, leased=True)
            elif row.lease_free and (row.attempt >= 2 or row.lease_token != row.token):
                self.give_up(row)  # its second run died, or a later claim took the lease
            elif row.lease_free and row.attempt == 1:
                self._take(state, row, leased=True)  # cut short, or died: attempt 2
        if expired:
            triggers = self._triggers
            self._control.run(lambda: triggers.close(expired, expired=True), lambda _result: None)

    def _take(self, state: JobState, row: lease.TriggerRow, *, leased: bool) -> None:
        starter, triggers, holder = self._starter, self._triggers, self._replica_id
        claimed_at = self._clock.monotonic()
        self.taking.add(row.id)

        def done(result: int | BaseException | None) -> None:
            self.taking.discard(row.id)
            if isinstance(result, BaseException):
                log.error("job %r: taking the request for a round now failed: %s", row.name, result)
                return
            if result is None:
                log.info(
                    "job %r: the request for a round now (asked by %s) was not run here: "
                    "another replica took it, or a round held the lease, or the job is paused",
                    row.name,
                    row.requested_by,
                )
                return
            token = result if leased else None
            late = too_late(claimed_at, self._clock.monotonic())
            if self._timetable.draining or late:
                name = row.name
                self._control.run(
                    lambda: triggers.end(row.id, name, result, leased=leased, outcome="cut short"),
                    lambda _result: None,
                )
                return
            log.info(
                "job %r: running a round now%s, asked by %s at %s",
                row.name,
                " a second time (the first was cut short)" if row.attempt else "",
                row.requested_by,
                row.requested.isoformat(),
            )
            starter.start_manual(state, row, token=token, claimed_at=claimed_at)

        self._control.run(lambda: triggers.take(row, holder, leased=leased), done)

    def give_up(self, row: lease.TriggerRow) -> None:
        """End ``row``'s request on record as given up."""
        triggers, token = self._triggers, row.token or 0
        self.taking.add(row.id)

        def done(_result: object) -> None:
            self.taking.discard(row.id)

        self._control.run(
            lambda: triggers.end(row.id, row.name, token, leased=True, outcome="given up"), done
        )

    def _catch_up(self, state: JobState, row: lease.TriggerRow) -> None:
        """Claim the instant ``row`` asks to catch up (skipped while paused), as any
        catch-up: at most once, never after a later instant started."""
        timetable, triggers = self._timetable, self._triggers
        assert row.instant is not None
        if state.busy:
            return  # a round of it is being claimed or runs: a later sweep tries again
        instant = row.instant
        self.taking.add(row.id)

        def done(_result: object) -> None:
            self.taking.discard(row.id)

        self._control.run(lambda: triggers.close([row.id], expired=False), done)
        timetable.take(state)
        self._claims.claim(instant, [state], reason=Reason.CATCH_UP)
