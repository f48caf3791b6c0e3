"""Schedules made of data added again after their removal: owed nothing from before.

A removed schedule's lease row stays (its round in flight ends on record). Added again,
the schedule starts a new life: a round of its former life not run to its end (cut short
by a drain after the removal, or whose holder died) is never run a second time.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Connection

from ._exceptions import translate_errors
from ._rows import _UNFINISHED
from ._schedules import _BATCH, _among
from ._schema import lease_table

__all__ = ["forgo_former_rounds"]

_t = lease_table


def forgo_former_rounds(conn: Connection, ids: Collection[str]) -> None:
    """Mark the round of each lease row of ``ids`` (schedules added again after their
    removal) that did not run to its end as run twice (``attempt`` 2), in ``conn``'s
    transaction: no sweep finds it cut short, so it never runs a second time. A round
    still held runs on to its end as before; the next claim starts a new attempt 1."""
    names = sorted(ids)
    with translate_errors("add schedules again"):
        for start in range(0, len(names), _BATCH):
            chunk = names[start : start + _BATCH]
            conn.execute(
                _t.update()
                .where(
                    _among(_t.c.name, chunk, conn.dialect.name),
                    _t.c.attempt == 1,
                    _t.c.state.in_(_UNFINISHED),
                )
                .values(attempt=2)
            )
