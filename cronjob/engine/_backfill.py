"""Backfills: the instants of the past an operator asked for (``cronjob backfill``), run
on the replicas that register the job, one at a time, oldest first.

A wing of the sweep (see ``_wings``): each sweep hands it the open requests it read
(`BackfillTaker.swept`), and `BackfillTaker.step` takes the backfill requests of each of
this replica's leased jobs ([lease.Backfills][] says the rule by which one is taken). Per job:

- a request whose round runs (its lease held) leaves the job alone: one at a time;
- a request whose round was cut short, or died with its replica (running, its lease
  free), is queued again as attempt 2; its second run cut short is given up;
- else the oldest queued instant is taken: it runs under the job's lease as a manual
  round does (the dispatcher's ``start_manual``), ``ctx.instant`` the instant, ``why``
  ``'backfill'``; or it is closed as on record; or it waits.

A job with instants queued keeps the sweeps going on an in-process clock (`waiting`);
the end of a backfill's round sweeps at once (see ``Sweeper``), so a backfill on a live
replica moves at the pace of its rounds, not of the 15 s grid.

Dispatcher thread only; the statements run on the control thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import timedelta

import lease

from .._clock import Clock
from ._control import Control
from ._keeper import too_late
from ._ports import Starter, Timetable
from ._state import JobState
from ._wings import Wing

__all__ = ["BackfillTaker"]

log = logging.getLogger("cronjob")

#: How long after the instant that follows it a backfill's instant is past the
#: schedule's reach: its claim, late as it may be, was sent by then.
PASSED_GRACE = timedelta(seconds=60)


class BackfillTaker(Wing):
    """Takes the instants of backfills for the dispatcher's jobs.

    Args:
        clock: The scheduler's clock.
        store: The lease store.
        control: Runs the statements.
        timetable: Told whether a drain began (no instant is taken then).
        starter: Starts a backfill's round, as a manual round.
        states: The jobs' states by name (the dispatcher's).
        replica_id: The holder named when an instant is taken.
        taking: The ids of requests being taken (shared with the sweep's own requests).
        give_up: Gives a request up, on record (the sweep's requests').
        sweep_soon: Asks the sweep to run at once.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        store: lease.LeaseStore,
        control: Control,
        timetable: Timetable,
        starter: Starter,
        states: Mapping[str, JobState],
        replica_id: str,
        taking: set[int],
        give_up: Callable[[lease.TriggerRow], None],
        sweep_soon: Callable[[], None],
    ) -> None:
        self._clock = clock
        self._control = control
        self._timetable = timetable
        self._starter = starter
        self._states = states
        self._replica_id = replica_id
        self._backfills = lease.Backfills(store)
        self._triggers = lease.Triggers(store)
        #: The ids of requests being taken (shared with the sweeper's own requests).
        self._taking = taking
        self._give_up = give_up
        self._sweep_soon = sweep_soon
        #: The last sweep found instants queued for a job of this replica.
        self.waiting = False

    def step(self, state: JobState, rows: list[lease.TriggerRow]) -> None:
        """Move the backfill of ``state``'s job on by one step (see the module docstring).
        ``rows`` are its open backfill requests, as a sweep read them."""
        queued = sorted(
            (row for row in rows if row.state is lease.TriggerState.QUEUED),
            key=lambda row: (row.instant, row.id),
        )
        self.waiting = self.waiting or bool(rows)
        for row in rows:
            if row.state is lease.TriggerState.QUEUED:
                continue
            if not row.lease_free and row.lease_token == row.token:
                return  # its round runs: one at a time
            if row.lease_free and row.attempt >= 2:
                self._give_up(row)  # its second run died, or was cut short
            elif row.lease_free:
                self._requeue(row)
            return
        if not queued or state.busy or state.run is not None or self._timetable.draining:
            return
        self._take(state, queued[0])

    def request_ended(self, request: lease.TriggerRow) -> None:
        """A request's round ended on this replica: after a backfill's, sweep at once, so
        its next instant is taken without waiting for the 15 s grid."""
        if request.backfill:
            self._sweep_soon()

    def swept(self, requests: list[lease.TriggerRow]) -> None:
        """A sweep read the open ``requests``: step each backfill of a leased job of this
        replica (`waiting` is told anew by the steps)."""
        self.waiting = False
        if self._timetable.draining:
            return
        backfills: dict[str, list[lease.TriggerRow]] = {}
        for row in requests:
            if row.backfill and row.id not in self._taking:
                state = self._states.get(row.name)
                if state is not None and state.job.leased:
                    backfills.setdefault(row.name, []).append(row)
        for name, queue in backfills.items():
            self.step(self._states[name], queue)

    def _requeue(self, row: lease.TriggerRow) -> None:
        backfills = self._backfills
        self._taking.add(row.id)

        def done(_result: object) -> None:
            self._taking.discard(row.id)
            self._sweep_soon()  # its second run may be taken now

        self._control.run(lambda: backfills.requeue(row), done)

    def _take(self, state: JobState, row: lease.TriggerRow) -> None:
        starter, backfills, holder = self._starter, self._backfills, self._replica_id
        triggers = self._triggers
        claimed_at = self._clock.monotonic()
        self._taking.add(row.id)

        def done(result: int | BaseException | None) -> None:
            self._taking.discard(row.id)
            if isinstance(result, BaseException):
                log.error("job %r: taking a backfill's instant failed: %s", row.name, result)
                return
            if result is None:
                return  # it waits, or was on record (closed), or another replica took it
            if self._timetable.draining or too_late(claimed_at, self._clock.monotonic()):
                name = row.name
                self._control.run(
                    lambda: triggers.end(row.id, name, result, leased=True, outcome="cut short"),
                    lambda _result: None,
                )
                return
            log.info(
                "job %r: backfilling instant %s, asked by %s",
                row.name,
                row.instant,
                row.requested_by,
            )
            starter.start_manual(state, row, token=result, claimed_at=claimed_at)

        assert row.instant is not None
        following = state.job.schedule.next(row.instant)
        passed = following is not None and following + PASSED_GRACE <= self._clock.now()
        self._control.run(lambda: backfills.take(row, holder, passed=passed), done)
