"""The instants a catch-up policy passes over, put on record as skipped by it.

When start-up or the end of an outage finds instants of a job that no replica ran, the
job's policy decides (`cronjob.engine._recovery`): ``catch_up="latest"`` runs the most
recent one and passes over those before it; ``"oldest"`` runs the oldest within the
window and passes over those after it; ``"none"`` runs none; an instant older than
the job's ``catch_up_window`` is not run, and ``"all"`` runs those within it only. What
is passed over was skipped on purpose: a note in the history (``why``
`lease.SKIP_NOTE`, the policy in its outcome: ``catch_up=latest``, ``catch_up=oldest``,
``catch_up=none`` or ``catch_up_window``) says which, from its ``started`` (the first
instant) through its ``instant`` (the last), and ``cronjob status`` counts them as
skipped by the policy, not missed. Replicas that catch up together write one note
(`lease.LeaseStore.note_skipped`).

The dispatcher thread makes the notes; the control thread writes them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Final

import lease

from ._metrics import catch_up_floor

if TYPE_CHECKING:
    from .._schedule import Schedule
    from ._control import Control

__all__ = [
    "BY_LATEST",
    "BY_NONE",
    "BY_OLDEST",
    "BY_WINDOW",
    "skip_after",
    "skip_note",
    "write_notes",
]

log = logging.getLogger("cronjob")

#: The outcomes of the notes: the policy that passed the instants over.
BY_LATEST: Final = "catch_up=latest"
BY_NONE: Final = "catch_up=none"
BY_WINDOW: Final = "catch_up_window"
BY_OLDEST: Final = "catch_up=oldest"


def skip_note(
    name: str,
    schedule: Schedule,
    row: lease.LeaseRow,
    instant: datetime,
    now: datetime,
    *,
    policy: str,
    holder: str,
    through: bool = False,
) -> lease.RoundRow | None:
    """The note that ``policy`` passed over the instants of job ``name`` before
    ``instant`` (and ``instant`` itself with ``through``: a policy that runs none of
    them), after what its ``row`` says ran or was accounted for and within the day
    before ``now`` (as `cronjob.engine._metrics.missed_before` counts them); ``None``
    when there is none. ``holder`` is the replica that decided; ``now`` its clock."""
    first = schedule.next(catch_up_floor(row, now))
    last = instant if through else schedule.prev(instant)
    return _note(name, first, last, now, policy=policy, holder=holder)


def skip_after(
    name: str, schedule: Schedule, ran: datetime, latest: datetime, now: datetime, *, holder: str
) -> lease.RoundRow | None:
    """The note that ``catch_up="oldest"`` passed over the instants of job ``name`` after
    the one it runs (``ran``) through ``latest`` (the most recent one owed); ``None``
    when there is none."""
    return _note(name, schedule.next(ran), latest, now, policy=BY_OLDEST, holder=holder)


def _note(
    name: str,
    first: datetime | None,
    last: datetime | None,
    now: datetime,
    *,
    policy: str,
    holder: str,
) -> lease.RoundRow | None:
    """The note that ``policy`` passed over job ``name``'s instants ``first`` through
    ``last``; ``None`` when there is none."""
    if first is None or last is None or last < first:
        return None
    return lease.RoundRow(
        name=name,
        instant=last,
        attempt=1,
        holder=holder,
        why=lease.SKIP_NOTE,
        started=first,
        ended=max(now, last),
        outcome=policy,
    )


def write_notes(control: Control, store: lease.LeaseStore, notes: Sequence[lease.RoundRow]) -> None:
    """Write ``notes`` on the control thread; a failure is logged (the instants then
    count as missed in ``cronjob status``, as before the notes existed)."""
    if not notes:
        return
    batch = list(notes)

    def done(result: int | BaseException) -> None:
        if isinstance(result, BaseException):
            log.warning("noting %d job(s)' skipped instants failed: %s", len(batch), result)

    control.run(lambda: store.note_skipped(batch), done)
