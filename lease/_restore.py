"""A lease row that disappeared under its round, written back as that round cut short."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from ._core import _StoreCore, _t
from ._exceptions import translate_errors
from ._rows import LeaseState, LeaseWrite, WriteKind, _instant_seconds, _names

__all__ = ["CutRound"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CutRound:
    """A round whose lease row was found gone as it ran: what its row is written back as."""

    #: The round's instant and attempt (1 or 2).
    instant: datetime
    attempt: int
    #: The job's next instant after it (the row's ``due_s``), or ``None``.
    due: datetime | None = None

    def __post_init__(self) -> None:
        if self.attempt not in (1, 2):
            raise ValueError(f"a round's attempt is 1 or 2, not {self.attempt!r}")


class _Restore(_StoreCore):
    """The write-back of gone rows: a part of [LeaseStore][lease.LeaseStore]."""

    def restore_cut(self, rounds: Mapping[str, CutRound]) -> list[str]:
        """Write back the row of each name in ``rounds`` that has none, as its round cut
        short: that instant and attempt, state ``cut``, the lease free, deployed now,
        ``due_s`` the round's ``due``. A name whose row is there (written back by someone
        else meanwhile, or never gone) is left as it is. One transaction.

        A first run's row so written is owed its second run by the rule of rounds cut
        short (its end is not on record), unless a later instant is claimed first; a
        second run's is given up, as a second run cut short is. The watchers are told
        of the rows written as of a give-back: a sweep may find them.

        Returns:
            The names written back, sorted.

        Raises:
            ValueError: a name is empty or too long, an instant is not an aware datetime
                of whole seconds.
        """
        wanted = _names(rounds)
        if not wanted:
            return []
        now = self._now()
        params: list[dict[str, Any]] = []
        for name in sorted(wanted):
            cut = rounds[name]
            given_up = cut.attempt == 2
            params.append(
                {
                    "name": name,
                    "instant": _instant_seconds(cut.instant),
                    "attempt": cut.attempt,
                    "state": (LeaseState.DONE if given_up else LeaseState.CUT).value,
                    "token": 0,
                    "due_s": None if cut.due is None else _instant_seconds(cut.due),
                    "last_outcome": "given up" if given_up else "cut short",
                }
            )
        values: dict[str, Any] = {"deployed_ms": now, "last_end_ms": now}
        dialect = self._engine.dialect.name
        stmt: sa.Executable
        if dialect in ("postgresql", "sqlite"):
            insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_t)
            stmt = insert.values(values).on_conflict_do_nothing(index_elements=[_t.c.name])
        else:
            # Not INSERT IGNORE, which turns data errors into warnings: a no-op update.
            my = mysql.insert(_t).values(values)
            stmt = my.on_duplicate_key_update(name=_t.c.name)
        with translate_errors("write back lease rows"), self._transaction() as conn:
            present = set(conn.execute(sa.select(_t.c.name).where(_t.c.name.in_(wanted))).scalars())
            todo = [p for p in params if p["name"] not in present]
            if todo:
                conn.execute(stmt, todo)
        written = [p["name"] for p in todo]
        if written:  # after the commit: a sweep it wakes must find them
            leases = tuple((name, 0) for name in written)
            self._tell(LeaseWrite(kind=WriteKind.GIVEN_BACK, leases=leases))
        return written
