"""Jobs for the fault scenario of ``isolation="process"`` (``cronjob run
tests.faults.jobs_isolated``): module-level functions, so a round's child process imports
them by name. Events go to ``$FAULTS_LOG`` as ``jobs_spec`` writes them.

- ``hung``: every 10 s, ``timeout=3``, in a child process that ignores SIGTERM and its
  cancellation and never returns: only SIGKILL ends it.
- ``tick``: every 2 s (odd seconds), 0.1 s of work on a thread, to see the replica go on.
"""

from __future__ import annotations

import signal
import time

import cronjob

from .jobs_spec import emit

#: The hung job's period and timeout (seconds).
HUNG_EVERY = 10
HUNG_TIMEOUT = 3


def hang(ctx: cronjob.Round) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    emit("start", ctx, isolated=True)
    noticed = False
    while True:
        if ctx.cancelled and not noticed:
            noticed = True
            emit("cancelled", ctx, cause=type(ctx.cause).__name__)
        time.sleep(0.05)


def tick(ctx: cronjob.Round) -> None:
    emit("start", ctx)
    if ctx.wait(0.1):
        emit("end", ctx, outcome="cut")
        ctx.check()
    emit("end", ctx, outcome="done")


cronjob.register(
    hang, f"*/{HUNG_EVERY} * * * * *", "hung", timeout=HUNG_TIMEOUT, isolation="process"
)
cronjob.register(tick, "1/2 * * * * *", "tick")
