"""The worker's side of the fault scenario "a worker killed inside a ``once`` body"
(tests/faults/test_outbox_faults.py), shared by the Celery and Dramatiq workers
(tests/celery_worker.py, tests/dramatiq_worker.py): each wraps `body` in its target's
``once`` and calls `deliver` from its task, writing lines with its own ``log``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from cronjob.contrib import OccurrenceBusy

#: The job the fault tests' once task runs for (the workers register it, every second, so
#: its occurrences are firings of something a worker knows).
ONCE_KILLED = "once-killed"

Log = Callable[[dict[str, Any]], None]


def body(log: Log, occurrence_id: str, marker: str) -> str:
    """Write a ``body`` line; on the first run (no ``marker`` file yet), sleep until the
    test kills the worker."""
    log({"body": occurrence_id, "pid": os.getpid(), "at": time.time()})
    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(120)
    return "ran"


def deliver(log: Log, occurrence_id: str, run: Callable[[], str | None]) -> None:
    """Run one delivery (``run``: the ``once`` body) and write its outcome: ``ran``, ``done``
    (it had run) or ``busy`` (running elsewhere; re-raised, so the task system retries)."""
    line = {"delivery": occurrence_id, "pid": os.getpid(), "at": time.time()}
    try:
        outcome = run()
    except OccurrenceBusy:
        log({**line, "outcome": "busy"})
        raise
    log({**line, "outcome": outcome or "done"})
