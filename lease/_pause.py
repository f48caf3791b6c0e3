"""The pause: set or lifted on a job's lease row, with a note in the history."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import Connection

from ._core import _h, _StoreCore, _t
from ._dialect import _db_now_ms
from ._exceptions import translate_errors
from ._records import (
    RoundRow,
    round_values,
)
from ._rows import _EPOCH, _MS, _names
from ._schema import REASON_LENGTH
from ._text import check_holder

#: Up to this many names, `paused_names` lists them in its statement.
_LISTED_AT_MOST: Final = 500


class _Pause(_StoreCore):
    """The pause: a part of [LeaseStore][lease.LeaseStore]."""

    def set_paused(
        self,
        names: Iterable[str] | None,
        *,
        paused: bool,
        by: str,
        reason: str | None = None,
        now_ms: int | None = None,
    ) -> list[str]:
        """Pause (``paused``) or resume ``names`` (``None``: every row but the chores'),
        and note each change in the history; one transaction. Returns the names whose
        state changed, sorted: a name already in that state, or without a row, is left
        as it was.

        A paused row is refused by `claim` and `claim_rerun` and left out of
        `survey`'s rounds cut short; a round already running is not touched. On
        resume, ``skipped_through`` is raised to now (in seconds), so the instants skipped
        while paused are never caught up at start-up (the catch-up rule honours it).
        The note is a row of ``cronjob_round`` with ``why`` ``'pause'`` or ``'resume'``,
        outcome ``'paused'`` or ``'resumed'``, ``holder`` = ``by``, ``instant`` = now.

        Raises:
            ValueError: ``by`` is empty or too long, ``reason`` is too long
                (`REASON_LENGTH`), a name is empty or too long.
        """
        wanted = None if names is None else _names(names)
        check_holder(by)
        if reason is not None and len(reason) > REASON_LENGTH:
            raise ValueError(
                f"a pause reason is at most {REASON_LENGTH} characters, not {len(reason)}"
            )
        if wanted == []:
            return []
        now = self.now_ms() if now_ms is None else now_ms
        verb = "pause" if paused else "resume"
        with translate_errors(f"{verb} jobs"), self._transaction() as conn:
            return _set_paused(conn, wanted, paused=paused, by=by, reason=reason, now_ms=now)


def paused_names(conn: Connection, names: Collection[str] | None = None) -> set[str]:
    """The names whose lease row is paused (by anyone), of ``names`` when given.

    One statement on ``conn``, in its transaction. Few rows are paused, so a long list of
    names is intersected with all the paused ones rather than sent as a list.
    """
    stmt = sa.select(_t.c.name).where(_t.c.paused_ms.is_not(None))
    if names is not None and len(names) <= _LISTED_AT_MOST:
        stmt = stmt.where(_t.c.name.in_(sorted(names)))
    with translate_errors("read paused leases"):
        found = set(conn.execute(stmt).scalars())
    return found if names is None else found & set(names)


def set_paused_on(
    conn: Connection,
    names: Iterable[str],
    *,
    paused: bool,
    by: str,
    reason: str | None = None,
) -> list[str]:
    """[LeaseStore.set_paused][lease.LeaseStore.set_paused] for ``names`` on ``conn``, in
    its transaction (the caller commits or rolls back), at the database's clock; for a
    caller that writes on a connection it was lent (Django's), where a store's own
    transactions and session settings have no place.

    Returns the names whose state changed, sorted.

    Raises:
        ValueError: as `LeaseStore.set_paused`.
    """
    wanted = _names(names)
    check_holder(by)
    if reason is not None and len(reason) > REASON_LENGTH:
        raise ValueError(f"a pause reason is at most {REASON_LENGTH} characters, not {len(reason)}")
    if not wanted:
        return []
    verb = "pause" if paused else "resume"
    with translate_errors(f"{verb} jobs"):
        now = int(conn.execute(sa.select(_db_now_ms())).scalar_one())
        return _set_paused(conn, wanted, paused=paused, by=by, reason=reason, now_ms=now)


def _set_paused(
    conn: Connection,
    wanted: list[str] | None,
    *,
    paused: bool,
    by: str,
    reason: str | None,
    now_ms: int,
) -> list[str]:
    """The pause's statements on ``conn``: the rows of ``wanted`` (``None``: all but the
    chores') locked in name order, changed, and noted in the history."""
    now = now_ms
    which = _t.c.paused_ms.is_(None) if paused else _t.c.paused_ms.is_not(None)
    where = [which, ~_t.c.name.startswith(" ")]
    if wanted is not None:
        where.append(_t.c.name.in_(wanted))
    if paused:
        values: dict[Any, Any] = {
            _t.c.paused_ms: now,
            _t.c.paused_by: by,
            _t.c.pause_reason: reason,
        }
    else:
        seconds = now // 1000
        values = {
            _t.c.paused_ms: None,
            _t.c.paused_by: None,
            _t.c.pause_reason: None,
            _t.c.skipped_through: sa.case(
                (_t.c.skipped_through > seconds, _t.c.skipped_through), else_=seconds
            ),
        }
    verb = "pause" if paused else "resume"
    found = sorted(
        # In name order, as a batch of ends of several groups locks its rows.
        conn.execute(
            sa.select(_t.c.name).where(*where).order_by(_t.c.name).with_for_update()
        ).scalars()
    )
    if not found:
        return []
    conn.execute(_t.update().where(_t.c.name.in_(found), which).values(values))
    at = _EPOCH + now * _MS
    notes = [
        RoundRow(
            name=name,
            instant=at.replace(microsecond=0),
            attempt=1,
            holder=by,
            why=verb,
            started=at,
            ended=at,
            outcome=f"{verb}d",
        )
        for name in found
    ]
    conn.execute(_h.insert(), [round_values(note) for note in notes])
    return found
