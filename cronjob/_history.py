"""The round history's retention: [History][cronjob.History], and pruning one replica at a time.

Each replica's finisher (see `cronjob.engine._finisher`) asks `Pruner` after writing
a batch of ends; at most once per clock hour, the replica tries to take that hour's turn
(one claim of a lease of its own, see [lease.LeaseStore.take_turn][]), and the one
replica whose claim wins deletes, in one statement, the rounds older than
`History.days` and each job's rounds past its `History.per_job` newest, then
the replicas gone for a day, on a thread of its own. A deployment whose rounds stop
ending stops growing its history too, so pruning rides on the ends and needs no timer.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import lease

from ._clock import Clock

__all__ = ["History", "Pruner"]

log = logging.getLogger("cronjob")

#: The chore's name in the lease table (see `lease.LeaseStore.take_turn`).
PRUNE_CHORE: Final = "cronjob:prune-history"
#: Seconds between two turns to prune.
PRUNE_EVERY: Final = 3600
#: A replica not seen for this many seconds is deleted from the record.
REPLICA_GONE: Final = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    """How long the round history keeps rounds: ``Scheduler(history=History(...))``.

    ``Scheduler(history=None)`` keeps no history (the jobs' state is still on record).

    Attributes:
        days: rounds that ended longer ago than this are pruned (> 0).
        per_job: at most this many rounds of each job are kept, the newest (>= 1).

    Raises:
        ValueError: a value out of range.
    """

    days: float = lease.DEFAULT_HISTORY_DAYS
    per_job: int = lease.DEFAULT_HISTORY_PER_NAME

    def __post_init__(self) -> None:
        if isinstance(self.days, bool) or not (0 < self.days < math.inf):
            raise ValueError(f"history days must be a positive number, not {self.days!r}")
        if isinstance(self.per_job, bool) or not isinstance(self.per_job, int) or self.per_job < 1:
            raise ValueError(f"history per_job must be a whole number >= 1, not {self.per_job!r}")


class Pruner:
    """Prunes the history when it is this replica's turn (asked by the finisher thread)."""

    def __init__(
        self,
        *,
        store: lease.LeaseStore,
        clock: Clock,
        holder: str,
        history: History,
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self._store = store
        self._stopped = stopped
        self._clock = clock
        self._holder = holder
        self._history = history
        self._last_turn: int | None = None
        self._created = False  # the chore's row, made by the first try of this replica

    def maybe_prune(self) -> None:
        """Take this hour's turn, if not tried yet, and prune if it is ours, on a thread of
        its own (the ranking of a large history takes seconds, which the ends of rounds
        must not wait for). Never raises.

        Not once the scheduler has stopped (``stopped``): the ends of rounds that outlive
        a drain are still written, but a prune begun then would race the engine's
        disposal (its thread waiting out the pool's timeout for a connection); another
        replica, or the next start, takes the turn.
        """
        if self._stopped():
            return
        now = self._clock.now()
        turn = int(now.timestamp()) // PRUNE_EVERY
        if turn == self._last_turn:
            return
        self._last_turn = turn
        instant = datetime.fromtimestamp(turn * PRUNE_EVERY, now.tzinfo)
        self._clock._work_started()  # a fake clock's advance() waits for it
        try:
            threading.Thread(
                target=self._prune, args=(instant,), name="cronjob-prune", daemon=True
            ).start()
        except RuntimeError:  # no thread: try again next hour
            self._clock._work_finished()

    def _prune(self, instant: datetime) -> None:
        try:
            mine = self._store.take_turn(
                PRUNE_CHORE, instant, self._holder, create=not self._created
            )
            self._created = True
            if not mine:
                return
            rounds, replicas = self._store.prune(
                days=self._history.days,
                per_name=self._history.per_job,
                replicas_gone=REPLICA_GONE,
            )
            done = lease.prune_schedules(self._store, days=self._history.days)
            # Publications sent and bodies done as long ago as the history is kept.
            cutoff = self._clock.now().timestamp() * 1000 - self._history.days * 86_400_000
            outbox = lease.prune_outbox(self._store.engine, before_ms=round(cutoff))
        except lease.LeaseError as exc:
            log.warning("pruning the round history failed: %s", exc)
            return
        finally:
            self._clock._work_finished()
        if rounds or replicas or done or outbox:
            log.info(
                "pruned %d round(s) from the history, %d replica(s) gone, %d schedule(s) "
                "over (one-offs run, past their end, removed) and %d outbox row(s)",
                rounds,
                replicas,
                done,
                outbox,
            )
