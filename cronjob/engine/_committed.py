"""From when the catch-up owes a leased job its instants: its first deployment, or, for a
schedule made of data, the commit of its timing.

A registered job is owed nothing from before its first deployment (its lease row's
first write by a replica, `lease.LeaseRow.deployed`): the instants before were never its
to run. A schedule made of data is owed its instants from its commit
(`lease.LeaseRow.committed`, revision 0017): the moment the schedules API wrote it —
added, added again after a removal, its spec, instant or window changed — even if no
replica ran then. Added at 09:30 while every replica was down, back at 11:30: an hourly
schedule is owed 10:00 and 11:00, and its catch-up policy picks among them (``"latest"``
11:00, ``"all"`` both, ``"oldest"`` 10:00, ``"none"`` neither).

The commit is not used when:

- it is not on record (a registered job; a schedule an older release wrote): owed from
  the first deployment, as before revision 0017;
- the row's timing changed after it (``spec_changed`` later): a release that writes no
  commit changed the schedule, and left the commit of the timing before behind.

When both the commit and the deployment are on record, the earlier counts. A change of
spec or instant clears the deployment (the next replica to run the schedule marks it
again), so a deployment earlier than the commit is either one a window change kept (its
timing's instants did not change: owed as before the change) or one read off another
clock than the commit (a test's fake clock for the replicas, the database's for a write
given no ``now=``); a replica cannot run a schedule before its commit. In production both
are on the lease clock.

Dispatcher thread only (pure functions of a row).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lease

__all__ = ["owed_from"]


def owed_from(row: lease.LeaseRow) -> datetime | None:
    """The moment after which ``row``'s job is owed its instants by the catch-up (an
    instant at that very moment belongs before it), or ``None`` when it is unknown (the
    job owes nothing it has not run). See the module docstring."""
    committed = row.committed
    if committed is None or (row.spec_changed is not None and row.spec_changed > committed):
        return row.deployed
    if row.deployed is not None and row.deployed < committed:
        return row.deployed
    return committed
