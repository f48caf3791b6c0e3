"""When a lease row's timing changed: ``spec_ms`` (revision 0014), written beside the
schedule's own change."""

from __future__ import annotations

from collections.abc import Collection

import sqlalchemy as sa
from sqlalchemy import Connection

from ._dialect import _now_ms_or
from ._exceptions import translate_errors
from ._schema import lease_table as _t

__all__ = ["retime_schedule_leases"]

#: Names per statement (an IN list every database takes).
_BATCH = 500


def retime_schedule_leases(
    conn: Connection, ids: Collection[str], *, now_ms: int | None = None
) -> None:
    """Mark the lease rows of schedules ``ids`` as retimed and committed at ``now_ms``
    (``spec_ms`` and ``committed_ms``; the database's clock when ``None``), in ``conn``'s
    transaction: their timing changed — a spec or instant (`redeploy_schedule_leases`
    marks those itself), or a start/end that moved the schedule's instants without
    redeploying it. Missed instants are counted from it, and a schedule that no replica
    has run yet is owed its instants from it. A schedule without a lease row (never run)
    is left alone: nothing counts it."""
    names = sorted(set(ids))
    now = _now_ms_or(now_ms)
    with translate_errors("change schedules"):
        for start in range(0, len(names), _BATCH):
            chunk = names[start : start + _BATCH]
            conn.execute(
                _t.update().where(_t.c.name.in_(chunk)).values(spec_ms=now, committed_ms=now)
            )


def spec_changed_ms(
    new_spec: sa.ColumnElement[str | None], now_ms: sa.ColumnElement[int]
) -> sa.Case[int]:
    """``spec_ms`` of a row whose ``spec`` becomes ``new_spec`` at ``now_ms``: now when it
    had another spec on record (NULL, a row of before revision 0002, is no change), as it
    was otherwise. For an upsert's SET: read before the spec is written."""
    changed = sa.and_(_t.c.spec.is_not(None), new_spec.is_not(None), _t.c.spec != new_spec)
    return sa.case((changed, now_ms), else_=_t.c.spec_ms)
