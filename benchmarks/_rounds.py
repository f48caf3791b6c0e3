"""A job that only counts its rounds, for the benchmarks that run the scheduler in-process."""

from __future__ import annotations

import threading

import cronjob


class RoundCounter:
    """Register :meth:`job` for any number of jobs; :attr:`rounds` counts the rounds run
    by all of them (the workers run them on many threads, hence the lock)."""

    def __init__(self) -> None:
        self.rounds = 0
        self._lock = threading.Lock()

    def job(self, ctx: cronjob.Round) -> None:
        """One round: counted, nothing else."""
        with self._lock:
            self.rounds += 1
