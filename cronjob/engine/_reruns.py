"""Second runs: the rounds a sweep found cut short, claimed and started as attempt 2.

The sweep (`cronjob.engine._sweep`) finds the rounds cut short among this replica's
jobs; `Reruns.claim` claims the second run of those whose job is idle here, in one
statement per instant ([lease.LeaseStore.claim_reruns][]), and starts the rounds won.
A replica that died with thousands of rounds in flight, or an instant's claim given back
because it came back too late, costs one statement, not one per job: under load those
are the statements that would keep the control thread behind.

A second run never starts before its instant: one handed back ahead of it (a drain met
its first run won ahead) is held until the instant, as the first run would have been. A
second run won but not started here (a drain, a claim that came back too late) is handed
back unrun, logged with its names, and stays owed: a later sweep claims it again. A
hand-off's second run owes what its instant's first claim owed (`owe_second_run`).

Dispatcher thread only; the claim runs on the control thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

import lease

from .._clock import Clock
from ._control import Control
from ._giveback import GiveBacks
from ._keeper import too_late
from ._owed import owe_second_run
from ._ports import Claimer, Starter, Timetable
from ._state import JobState, Reason

__all__ = ["Reruns"]

log = logging.getLogger("cronjob")

#: A round cut short, and its job's state on this replica.
_Cut = tuple[lease.CutShort, JobState]


class Reruns:
    """Claims and starts the second runs of rounds cut short, for the dispatcher.

    Args:
        clock: The scheduler's clock.
        store: The lease store.
        control: Runs the claims.
        timetable: The heap the jobs are taken off, and put back on when not won.
        starter: Starts the second runs won.
        claims: Holds second runs won ahead of their instant until it comes.
        give_backs: Gives back the second runs won that will not run here.
        states: The jobs' states by name (the dispatcher's).
        replica_id: The holder named in the claims.
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
        give_backs: GiveBacks,
        states: Mapping[str, JobState],
        replica_id: str,
    ) -> None:
        self._clock = clock
        self._store = store
        self._control = control
        self._timetable = timetable
        self._starter = starter
        self._claims = claims
        self._give_backs = give_backs
        self._states = states
        self._replica_id = replica_id

    def claim(self, found: Sequence[lease.CutShort]) -> None:
        """Claim the second run of each round ``found`` whose job is idle here (none while
        draining), one statement per instant, and start the rounds won."""
        if self._timetable.draining:
            return
        by_instant: dict[datetime, list[_Cut]] = {}
        for cut in found:
            state = self._states.get(cut.name)
            if state is not None and not state.busy:
                by_instant.setdefault(cut.instant, []).append((cut, state))
        for instant, cuts in by_instant.items():
            self._claim_instant(instant, cuts)

    def _claim_instant(self, instant: datetime, cuts: list[_Cut]) -> None:
        timetable = self._timetable
        for _cut, state in cuts:
            timetable.take(state)
        issued, claimed_at = self._clock.now(), self._clock.monotonic()

        def done(result: lease.ClaimBatch | BaseException) -> None:
            won = self._kept(result, instant, claimed_at)
            superseded = {} if isinstance(result, BaseException) else result.superseded
            rounds: list[tuple[JobState, int | None]] = []
            for cut, state in cuts:
                if cut.name not in won:
                    timetable.schedule_after(state, issued)
                    continue
                log.info(
                    "job %r: running the round of %s a second time (%s)",
                    cut.name,
                    instant.isoformat(),
                    "it was cut short"
                    if cut.given_back
                    else "its lease expired: the first round died with its process or lost "
                    "the database",
                )
                state.metrics.rerun()
                # What its first claim owed (even given back unrun), and, if its lease
                # expired, the instants that lease kept.
                gave_up = superseded.get(cut.name)
                owe_second_run(
                    state,
                    instant,
                    issued,
                    self._store.ttl,
                    gave_up=None if gave_up is None else gave_up[0],
                    expired=not cut.given_back,
                )
                rounds.append((state, won[cut.name]))
            if not rounds:
                return
            start = functools.partial(
                self._starter.start_rounds,
                rounds,
                instant,
                attempt=2,
                claimed_at=claimed_at,
                reason=Reason.RERUN,
            )
            if instant > self._clock.now():
                # A round handed back before its instant (a drain met it won ahead):
                # never started before it, as its first run would not have been.
                states = [state for state, _token in rounds]
                token = rounds[0][1]
                assert token is not None
                drop = functools.partial(self._unhold, states, token, instant)
                self._claims.hold(instant, start, drop)
            else:
                start()

        names = [cut.name for cut, _state in cuts]
        store, holder = self._store, self._replica_id
        self._control.run(
            lambda: store.claim_reruns(names, instant, holder), done, self._give_backs.give_back
        )

    def _kept(
        self, result: lease.ClaimBatch | BaseException, instant: datetime, claimed_at: float
    ) -> dict[str, int]:
        """The second runs to start, by name, with their token: those ``result`` won,
        unless the claim failed, came back too late (their leases given back), or a drain
        began meanwhile."""
        if isinstance(result, BaseException):
            log.error("claiming second runs of %s failed: %s", instant.isoformat(), result)
            return {}
        if not result.names:
            return {}
        now = self._clock.monotonic()
        late = too_late(claimed_at, now)
        if self._timetable.draining or late:
            # Handed back unrun, and so still owed: a later sweep claims it again.
            took = now - claimed_at
            why = (
                f"(a second run) came back {took:.1f} s after it was sent, when its leases "
                "may be lost already"
                if late
                else "(a second run) met a drain"
            )
            found = (self._states.get(name) for name in result.names)
            states = [state for state in found if state is not None]
            level = logging.WARNING if late else logging.INFO
            self._give_backs.hand_back(states, result.token, instant, why, level)
            return {}
        return dict.fromkeys(result.names, result.token)

    def _unhold(self, states: list[JobState], token: int, instant: datetime) -> None:
        """A drain began before the instant of second runs won ahead of it: hand them
        back unrun (still owed), their jobs scheduled on."""
        why = "(a second run) was won ahead of its instant, then a drain began"
        self._give_backs.hand_back(states, token, instant, why, logging.INFO)
        for state in states:
            self._timetable.schedule_after(state, instant)
