"""The lease rows of schedules made of data, written beside the schedule rows in the
writer's transaction (see ``lease._schedules``): one for each new schedule, and a
redeployed one for each schedule whose timing changed.

Each carries the moment the schedule's timing was committed (``committed_ms``, revision
0017): the writer's ``now`` when it gives one (a test's fake clock), else the database's
clock. The catch-up owes the schedule its instants after that moment, also those that
passed while no replica ran (see ``cronjob.engine._committed``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import sqlalchemy as sa
from sqlalchemy import Connection

from ._dialect import _now_ms_or
from ._exceptions import translate_errors
from ._schedules import _BATCH, _among
from ._schema import NEVER, lease_table

__all__ = ["leased_names", "redeploy_schedule_leases", "schedule_lease_rows"]

_t = lease_table


def leased_names(conn: Connection, ids: Collection[str]) -> set[str]:
    """Of ``ids``, those with a lease row."""
    found: set[str] = set()
    listed = sorted(ids)
    with translate_errors("read leases"):
        for start in range(0, len(listed), _BATCH):
            chunk = listed[start : start + _BATCH]
            found.update(
                conn.execute(
                    sa.select(_t.c.name).where(_among(_t.c.name, chunk, conn.dialect.name))
                ).scalars()
            )
    return found


def redeploy_schedule_leases(
    conn: Connection,
    specs: Mapping[str, str],
    *,
    unpause: Collection[str] = (),
    now_ms: int | None = None,
) -> None:
    """The lease rows of schedules whose timing changed (``specs``: id -> spec text): the
    new spec on record, retimed (``spec_ms``) and committed (``committed_ms``) at
    ``now_ms`` (the database's clock when ``None``), deployment cleared, so the first
    replica that runs it marks it deployed then (`LeaseStore.ensure`). The catch-up owes
    the new timing its instants after the commit, none before it (nor any of the old
    timing). The ids of ``unpause`` (removed schedules added again) lose the pause their
    old row kept."""
    if not specs:
        return
    now = _now_ms_or(now_ms)
    stmt = (
        _t.update()
        .where(_t.c.name == sa.bindparam("b_name"))
        .values(spec=sa.bindparam("b_spec"), deployed_ms=None, spec_ms=now, committed_ms=now)
    )
    params = [{"b_name": id_, "b_spec": spec} for id_, spec in sorted(specs.items())]
    unpaused = sorted(unpause)
    with translate_errors("change schedules"):
        for start in range(0, len(params), _BATCH):
            conn.execute(stmt, params[start : start + _BATCH])
        for start in range(0, len(unpaused), _BATCH):
            chunk = unpaused[start : start + _BATCH]
            conn.execute(
                _t.update()
                .where(_among(_t.c.name, chunk, conn.dialect.name))
                .values(paused_ms=None, paused_by=None, pause_reason=None)
            )


def schedule_lease_rows(
    conn: Connection,
    specs: Mapping[str, str],
    *,
    paused_by: str | None = None,
    now_ms: int | None = None,
) -> None:
    """Give each id of ``specs`` (id -> spec text) a lease row if it has none: never
    claimed, committed at ``now_ms`` (the database's clock when ``None``), its deployment
    left to the first replica that runs it (`LeaseStore.ensure`). With ``paused_by``, the
    ids' rows are paused (those not paused yet), since ``now_ms``."""
    if not specs:
        return
    ids = sorted(specs)
    have = leased_names(conn, ids)
    now = _now_ms_or(now_ms)
    with translate_errors("add schedules"):
        paused = {} if paused_by is None else {"paused_ms": now, "paused_by": paused_by}
        new = [{"name": id_, "spec": specs[id_]} for id_ in ids if id_ not in have]
        insert = _t.insert().values(
            instant=NEVER, attempt=1, state="new", token=0, committed_ms=now, **paused
        )
        for start in range(0, len(new), _BATCH):
            conn.execute(insert, new[start : start + _BATCH])
        kept = [id_ for id_ in ids if id_ in have]
        if paused and kept:
            for start in range(0, len(kept), _BATCH):
                conn.execute(
                    _t.update()
                    .where(
                        _among(_t.c.name, kept[start : start + _BATCH], conn.dialect.name),
                        _t.c.paused_ms.is_(None),
                    )
                    .values(paused)
                )
