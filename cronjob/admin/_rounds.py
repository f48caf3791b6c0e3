"""A job's recent rounds, from the history the replicas keep (``cronjob history``).

Re-exported by [cronjob.admin][]; see `cronjob.admin._status` for the clock and the
errors it shares with the status.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

import sqlalchemy as sa

from .._records import FAILED_OUTCOMES, RoundRecord, record_of
from ._base import UnknownJob
from ._base import aware as _aware
from ._base import store_on as _store
from ._base import to_ms as _ms

__all__ = ["HISTORY_LIMIT", "history"]

#: The most rounds `history` returns at once.
HISTORY_LIMIT: Final = 10_000


def history(
    database: str | sa.Engine,
    name: str,
    *,
    limit: int = 50,
    failed: bool = False,
    since: datetime | None = None,
) -> list[RoundRecord]:
    """The latest rounds of job ``name`` that ended, newest first.

    Args:
        database: a URL, or an engine (not disposed).
        name: the job.
        limit: at most this many rounds (1 to `HISTORY_LIMIT`).
        failed: only rounds that failed, timed out, missed their start deadline or
            were given up (`FAILED_OUTCOMES`).
        since: only rounds that ended at or after this aware time.

    Raises:
        UnknownJob: no job ``name`` is on record (no lease row, no round, no replica
            registering it).
        ValueError: ``limit`` is out of range, ``since`` is naive.
        TablesMissing, SchemaOutdated, SchemaNewer: as [status][cronjob.admin.status].
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= HISTORY_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {HISTORY_LIMIT}, not {limit!r}")
    since_ms = None if since is None else _ms(_aware(since, "since"))
    outcomes = tuple(outcome.value for outcome in FAILED_OUTCOMES) if failed else None
    with _store(database) as store:
        found = store.rounds(name, limit=limit, outcomes=outcomes, since_ms=since_ms)
        if not found and not store.known(name):
            raise UnknownJob(f"no job named {name!r} is on record")
    return [record_of(row) for row in found]
