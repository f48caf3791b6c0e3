"""The scheduler's options: their defaults and their checks.

[Scheduler][cronjob.Scheduler] takes its options from the caller and
checks them here as it is built, on the caller's thread, so that bad input fails at the
earliest moment (before any database is reached); what a part does with an option lives
in that part. Nothing here keeps state.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Final

from .._history import History

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_HISTORY",
    "DEFAULT_MAX_WORKERS",
    "check_options",
    "default_replica_id",
]

#: Default bound on how long ``drain`` waits for cancelled rounds to end.
DEFAULT_DRAIN_TIMEOUT = 5.0
#: Default number of worker threads for sync rounds.
DEFAULT_MAX_WORKERS = 64
#: The round history kept unless told otherwise: 14 days, 1,000 rounds per job.
DEFAULT_HISTORY: Final = History()


def check_options(*, history: History | None, max_workers: int, drain_timeout: float) -> None:
    """Refuse options the scheduler cannot run with.

    Raises:
        TypeError: ``history`` is neither a [cronjob.History][] nor ``None``.
        ValueError: ``max_workers`` is below 1, or ``drain_timeout`` is negative.
    """
    if history is not None and not isinstance(history, History):
        raise TypeError(f"history must be a cronjob.History or None, not {history!r}")
    if max_workers < 1:
        raise ValueError(f"max_workers must be at least 1, got {max_workers}")
    if drain_timeout < 0:
        raise ValueError(f"drain_timeout must not be negative, got {drain_timeout}")


def default_replica_id() -> str:
    """This replica's id when none is given: ``host-pid-random``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
