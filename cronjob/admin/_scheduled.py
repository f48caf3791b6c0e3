"""Schedules made of data as the operator's side reads them: the ``cronjob_schedule``
rows (see `cronjob.schedules`), their timing, and who runs their task.

A schedule is a leased job named by its id, so `status`, `pause`, `resume`, `trigger`
and `history` take its id as they take a job's name. What this module adds:

- **One read.** [status][cronjob.admin.status] reads the whole table, tombstones
  included, in one query (`read`), and joins it with the lease rows by name.
- **Who runs it.** A schedule is run by the live replicas whose record lists its task
  (``ReplicaRow.tasks``); none of them while some replica is live is a problem
  (`no_replica`), never a retirement: the schedule is data, not code that was removed.
- **Its policies.** A schedule's own (`cronjob.schedules`, stored on its row) lie over
  its task's, as the replicas' record describes them (`policies_of`).
- **Removed schedules.** `cronjob.schedules.remove` leaves a tombstone and the
  schedule's lease row (a round in flight ends on record). Such a row is neither a job nor
  retired: `status` hides it, unless a round of it still holds its lease (then it is
  shown, running, until the round ends). `pause`, `resume` and `trigger` refuse a
  removed schedule's id (`refuse_removed`); `history` still reads its rounds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from datetime import datetime

import lease

from .._bounds import at_spec, timing
from .._exceptions import ScheduleError
from .._schedule import Schedule
from ..schedules._policies import described
from ._base import UnknownJob

__all__ = [
    "no_replica",
    "policies_of",
    "read",
    "refuse_removed",
    "runners",
    "shown_spec",
    "timing_of",
]


def read(
    store: lease.LeaseStore,
    *,
    ids: Iterable[str] | None = None,
    task: str | None = None,
    prefix: str | None = None,
    removed: bool = False,
    args: bool = True,
) -> list[lease.ScheduleRow]:
    """The schedules on record, by id, in one query (tombstones too with ``removed``;
    without ``args``, their arguments left unread)."""
    with store.engine.connect() as conn:
        return lease.read_schedules(
            conn, ids=ids, task=task, prefix=prefix, removed=removed, args=args
        )


def refuse_removed(store: lease.LeaseStore, name: str) -> lease.ScheduleRow | None:
    """The live schedule ``name``, or ``None`` if ``name`` is no schedule's id.

    Raises:
        UnknownJob: ``name`` is a removed schedule's id (a tombstone): nothing of it
            runs any more, so there is nothing to pause, resume or run now.
    """
    found = read(store, ids=[name], removed=True)
    if not found:
        return None
    if found[0].removed:
        raise UnknownJob(
            f"schedule {name!r} was removed (cronjob.schedules.remove): nothing of it runs "
            "any more; its history stays (cronjob history)"
        )
    return found[0]


def shown_spec(row: lease.ScheduleRow) -> str:
    """The spec as tools show it: the spec, or ``@at <instant>`` for a one-off."""
    return at_spec(row.at) if row.at is not None else row.spec or ""


def timing_of(row: lease.ScheduleRow) -> Schedule | None:
    """The schedule of ``row`` (its spec within its start and end, or its one instant),
    parsed once per distinct timing (schedules share specs); ``None`` if this release
    cannot parse the spec (a newer one's)."""
    return _timing(row.spec, row.at, row.start, row.end)


@functools.lru_cache(maxsize=4096)
def _timing(
    spec: str | None, at: datetime | None, start: datetime | None, end: datetime | None
) -> Schedule | None:
    if spec is None and at is None:
        return None
    try:
        return timing(spec, at, start, end)
    except ScheduleError:
        return None


def policies_of(row: lease.ScheduleRow | None, task: Mapping[str, object]) -> Mapping[str, object]:
    """The policies of the schedule ``row`` as operators see them: its task's (``task``,
    as the replicas' record describes them) with its own laid over; ``task`` for no
    schedule (``None``) or one without policies of its own."""
    if row is None or row.policies is None:
        return task
    return {**task, **described(row.policies)}


def runners(task: str, replicas: Iterable[lease.ReplicaRow]) -> tuple[str, ...]:
    """The replicas of ``replicas`` whose record lists task ``task``, by id."""
    return tuple(sorted(r.holder for r in replicas if task in r.tasks))


def no_replica(task: str) -> str:
    """The problem of a schedule whose task no live replica registers."""
    return f"no replica runs task {task}"
