"""Tools for testing code that uses :mod:`cronjob` without waiting for real time.

``FakeClock`` drives every scheduler that shares it; ``crash`` stops a scheduler as a
killed process would. A lost lease's forced exit is observed by passing ``on_fatal`` to
the scheduler::

    exits = []
    with cronjob.Scheduler(url, registry=reg, clock=clock, on_fatal=exits.append) as s:
        ...
"""

from __future__ import annotations

from ._fakeclock import FakeClock as FakeClock
from ._scheduler import Scheduler

__all__ = ["FakeClock", "crash"]


def crash(scheduler: Scheduler) -> None:
    """Stop ``scheduler`` as a killed process would.

    No lease is given back and no round's end is recorded; renewals stop. Rounds still
    running are told to stop (so test threads end) but whatever they do afterwards is not
    recorded and their fenced transactions are refused. Lease expiry and the other
    replicas' sweeps then play out on the clock.
    """
    scheduler._crash()
