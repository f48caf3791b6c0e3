"""Give-backs: the leases won that will not run here, handed back in one statement.

A claim won rounds that will not run on this replica: it came back too late to keep its
leases, a drain began meanwhile, or no thread could take them. Their leases are given
back (one statement per token, [lease.LeaseStore.give_back_all][]), left owed as rounds
cut short at their first attempt: another replica's sweep runs them as second runs.
The claims, the second runs and the dispatcher hand back through this one part.

Dispatcher thread (the statements on the control thread), except `GiveBacks.give_back`:
on the control thread, for a claim whose result came once the dispatcher had gone.
"""

from __future__ import annotations

import logging
from datetime import datetime

import lease

from ._control import Control
from ._state import JobState

__all__ = ["GiveBacks"]

log = logging.getLogger("cronjob")

#: The most job names one log line lists.
_NAMES_PER_LINE = 100


class GiveBacks:
    """Gives back leases won that will not run here.

    Args:
        store: The lease store.
        control: Runs the statements.
    """

    def __init__(self, *, store: lease.LeaseStore, control: Control) -> None:
        self._store = store
        self._control = control

    def hand_back(
        self, states: list[JobState], token: int, instant: datetime, why: str, level: int
    ) -> None:
        """Give back the leases of rounds of ``instant`` won with ``token`` that will not
        run here (``why``: a drain began, or the claim came back too late), first or
        second runs, in one statement; left owed as rounds cut short at their first
        attempt, another replica's sweep runs them (again) as second runs. Logged with
        every name, a hundred a line (one line of 10,000 would be split by log
        collectors): the fault suite's check reads them."""
        names = [state.job.name for state in states]
        for first in range(0, len(names), _NAMES_PER_LINE):
            log.log(
                level,
                "the claim of %s %s: given back, not run here: %s",
                instant.isoformat(),
                why,
                ", ".join(repr(name) for name in names[first : first + _NAMES_PER_LINE]),
            )
        self.give_back_names(names, token)

    def give_back_names(self, names: list[str], token: int) -> None:
        """Give back the leases of ``names`` won with ``token``, in one statement."""
        self._control.run(lambda: self._store.give_back_all(names, token), lambda _result: None)

    def give_back(self, claims: lease.ClaimBatch | None) -> None:
        """Give back leases won after the dispatcher has gone (on the control thread)."""
        if claims is None or not claims.names:
            return
        try:
            self._store.give_back_all(claims.names, claims.token)
        except lease.LeaseError as exc:
            log.warning("giving back %d lease(s) won at stop failed: %s", len(claims.names), exc)
