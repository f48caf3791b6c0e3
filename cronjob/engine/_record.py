"""This replica as the sweep puts it on record (``cronjob_replica``): who, where, since
when, which jobs and tasks, and their policies, for the peers, `cronjob status` and the
page."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

import lease

from .._clock import Clock
from ._state import JobState

__all__ = ["replica_record"]


def replica_record(
    replica_id: str,
    clock: Clock,
    states: Mapping[str, JobState],
    tasks: Mapping[str, Mapping[str, Any]] | None = None,
) -> lease.ReplicaRow:
    """This replica as the sweep puts it on record: who, where, since when, which jobs
    and their policies."""
    from .._version import __version__

    now = clock.now()
    # One (spec, leased) pair for the jobs that share it: the record lives as long as the
    # replica, and 100,000 jobs on a few specs would keep 100,000 equal tuples.
    pairs: dict[tuple[str, bool], tuple[str, bool]] = {}
    jobs: dict[str, tuple[str, bool]] = {}
    for state in states.values():
        pair = (state.job.schedule.spec, state.job.leased)
        jobs[state.job.name] = pairs.setdefault(pair, pair)
    # Each job's options, for the status and the page (which load no app module).
    policies: dict[str, Mapping[str, Any]] = {
        s.job.name: described for s in states.values() if (described := s.job.policy.describe())
    }
    tasks = tasks or {}
    policies |= {name: described for name, described in tasks.items() if described}
    return lease.ReplicaRow(
        holder=replica_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        version=__version__,
        started=now,
        seen=now,
        jobs=jobs,
        policies=policies,
        tasks=frozenset(tasks),
    )
