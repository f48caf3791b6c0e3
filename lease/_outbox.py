"""The outbox: publications handed to another system (revision 0010); the once-table's
rows are `lease._once`'s, pruned here with the outbox's.

- ``cronjob_outbox``: one row per publication a holder promised (an id, the lease name
  and instant it belongs to, what to send). Written in the holder's fenced transaction
  before it sends, marked sent once the other system accepted it. Until then anyone may
  retry it, one at a time: a retry *claims* the row by a conditional update of its next
  try time (`claim_publication`), so two retriers never send a row at once.

The package knows ids, names, instants and opaque payloads, nothing of brokers. Every
time is epoch milliseconds given by the caller (its clock). Each function takes the
caller's `Connection` and runs in its transaction, except `prune_outbox`, which takes an
`Engine`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import postgresql

from ._exceptions import translate_errors
from ._once import ONCE_DONE
from ._rows import _json_recordset
from ._schema import ERROR_LENGTH, once_table, outbox_table, schedule_table

__all__ = [
    "NAMES_PER_STATEMENT",
    "OutboxRow",
    "OutboxSummary",
    "claim_publication",
    "defer_publications",
    "due_publications",
    "held_publications",
    "mark_published",
    "mark_published_many",
    "next_publication_ms",
    "orphaned_publications",
    "outbox_summary",
    "prune_outbox",
    "resolve_obsolete",
]

#: The most names one statement of `due_publications` carries where they are bound one
#: parameter each (SQLite, MariaDB): well below every driver's limit.
NAMES_PER_STATEMENT: Final = 10_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_o = outbox_table
_n = once_table
#: Neither sent nor resolved obsolete: someone still has to send it.
_UNSENT = sa.and_(_o.c.sent_ms.is_(None), _o.c.obsolete_ms.is_(None))


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRow:
    """A publication on record.

    Attributes:
        id: Its id (the message's own id).
        name: The lease name it belongs to.
        instant: The instant it belongs to (aware UTC, to the millisecond).
        target: What it is sent to (free text: ``"rq"``, ``"celery"``…).
        payload: The JSON-able data it was recorded with.
        created_ms: When it was recorded (the recorder's clock).
        next_try_ms: Before this time nobody else may try to send it.
        tries: Attempts to send it that failed.
        sent_ms: When the other system accepted it; ``None`` while unsent.
        error: The latest failure to send it, cut to `lease._schema.ERROR_LENGTH`.
        task: The task of the schedule it belongs to, whose publisher sends it; ``None``
            for a registered job's (or a row an earlier release recorded).
        obsolete_ms: When it was resolved obsolete (`resolve_obsolete`); ``None`` else.
        problem: Why the row could not be decoded (its payload is not a JSON object, its
            instant cannot be read), or ``None``: a row read with one is never sent, and
            its ``payload`` is empty (its ``instant`` the epoch when that is what failed).
            Reading never raises for one row: the others are read as usual.
    """

    id: str
    name: str
    instant: datetime
    target: str
    payload: Mapping[str, Any]
    created_ms: int
    next_try_ms: int
    tries: int
    sent_ms: int | None
    error: str | None
    task: str | None = None
    obsolete_ms: int | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxSummary:
    """The publications not yet sent: how many, and when the oldest was recorded."""

    unsent: int
    oldest_ms: int | None


def _row(found: sa.RowMapping) -> OutboxRow:
    """The row as found; one that does not decode has its `OutboxRow.problem` set."""
    problem, payload, instant = None, {}, _EPOCH
    try:
        instant = _EPOCH + timedelta(milliseconds=found["instant_ms"])
    except (TypeError, ValueError, OverflowError) as exc:
        problem = f"its instant ({found['instant_ms']!r} ms) cannot be read: {exc}"
    try:
        decoded = json.loads(found["payload"])
    except (TypeError, ValueError, RecursionError) as exc:
        problem = problem or f"its payload is not JSON: {exc}"
    else:
        if isinstance(decoded, dict):
            payload = decoded
        else:
            problem = problem or f"its payload is not a JSON object: {type(decoded).__name__}"
    return OutboxRow(
        id=found["id"],
        name=found["name"],
        instant=instant,
        target=found["target"],
        payload=payload,
        created_ms=found["created_ms"],
        next_try_ms=found["next_try_ms"],
        tries=found["tries"],
        sent_ms=found["sent_ms"],
        error=found["error"],
        task=found["task"],
        obsolete_ms=found["obsolete_ms"],
        problem=problem,
    )


def _ms(instant: datetime) -> int:
    return round((instant - _EPOCH).total_seconds() * 1000)


def claim_publication(
    conn: Connection,
    id: str,
    *,
    seen_next_try_ms: int,
    next_try_ms: int,
    error: str | None = None,
) -> bool:
    """Take the next try of an unsent publication: move its next try time from the value
    the caller read (``seen_next_try_ms``) to ``next_try_ms``, counting a failure when
    ``error`` is given.

    Returns:
        Whether this caller took it: ``False`` if it was sent meanwhile, or another
        caller moved its next try first (only one of several retriers wins a row).
    """
    values: dict[str, Any] = {"next_try_ms": next_try_ms}
    if error is not None:
        values["tries"] = _o.c.tries + 1
        values["error"] = error[:ERROR_LENGTH]
    with translate_errors("claim a publication"):
        done = conn.execute(
            _o.update()
            .where(
                _o.c.id == id,
                _UNSENT,
                _o.c.next_try_ms == seen_next_try_ms,
            )
            .values(values)
        )
    return done.rowcount == 1


def mark_published(conn: Connection, id: str, *, now_ms: int) -> bool:
    """Mark a publication sent (the other system accepted it); ``False`` if it already
    was (by another retrier) or is not on record."""
    with translate_errors("mark a publication sent"):
        done = conn.execute(
            _o.update()
            .where(_o.c.id == id, _o.c.sent_ms.is_(None))
            .values(sent_ms=now_ms, error=None)
        )
    return done.rowcount == 1


#: The most rows one statement of `mark_published_many` marks (elsewhere than on
#: PostgreSQL its ids are bound one parameter each, twice: well below every driver's
#: limit).
MARKS_PER_STATEMENT: Final = 500

#: PostgreSQL: the marks as the rows of one JSON parameter (``[{"id", "sent_ms"}]``),
#: one statement text at any count. A ``CASE`` of a bound value per id is compiled anew
#: for each count and parsed anew by the driver: about 35 µs of CPU per mark in groups
#: of 166 (a hand-off's at 10,000 a minute), against 4 here.
_MARKS: Final = _json_recordset("marks", _o.c.id, _o.c.sent_ms)
_MARK_MANY_PG: Final = (
    _o.update()
    .where(_o.c.id == _MARKS.c.id, _o.c.sent_ms.is_(None))
    .values(sent_ms=_MARKS.c.sent_ms, error=None)
)


def mark_published_many(conn: Connection, marks: Mapping[str, int]) -> int:
    """Mark several publications sent, each at its own time (``marks``: id -> the ms the
    other system accepted it), in one statement per `MARKS_PER_STATEMENT` ids; those
    already sent (by another retrier) or not on record are left as they are. Returns how
    many were marked now."""
    ids = list(marks)
    marked = 0
    postgres = conn.dialect.name == "postgresql"
    with translate_errors("mark publications sent"):
        for start in range(0, len(ids), MARKS_PER_STATEMENT):
            chunk = ids[start : start + MARKS_PER_STATEMENT]
            if postgres:
                rows = [{"id": id, "sent_ms": marks[id]} for id in chunk]
                done = conn.execute(_MARK_MANY_PG, {"marks": json.dumps(rows)})
                marked += done.rowcount
                continue
            sent = (
                sa.literal(marks[chunk[0]], sa.BigInteger)
                if len({marks[i] for i in chunk}) == 1
                else sa.case({i: sa.literal(marks[i], sa.BigInteger) for i in chunk}, value=_o.c.id)
            )
            done = conn.execute(
                _o.update()
                .where(_o.c.id.in_(chunk), _o.c.sent_ms.is_(None))
                .values(sent_ms=sent, error=None)
            )
            marked += done.rowcount
    return marked


def due_publications(
    conn: Connection,
    *,
    now_ms: int,
    limit: int,
    names: Collection[str] | None = None,
    tasks: Collection[str] = (),
) -> list[OutboxRow]:
    """The unsent publications whose next try time has come (at or before ``now_ms``),
    the longest due first, at most ``limit``. A row that does not decode is among them,
    its `OutboxRow.problem` set.

    Args:
        names: Only the publications of these lease names (those the caller can send):
            rows nobody here can send never fill the ``limit`` ahead of those it can.
            ``None``: every name (and ``tasks`` is not looked at).
        tasks: With ``names``, also the publications recorded with one of these tasks
            (a removed schedule's, sent by its task's publisher).

    Any number of names and tasks: on PostgreSQL they travel as one array parameter each
    (one statement); elsewhere in statements of at most `NAMES_PER_STATEMENT` each,
    whose rows are merged, so a statement never carries more parameters than a driver
    binds (PostgreSQL's 65,535).
    """
    query = sa.select(_o).where(_UNSENT, _o.c.next_try_ms <= now_ms)
    order = (_o.c.next_try_ms, _o.c.id)
    found: dict[str, OutboxRow] = {}
    with translate_errors("read the unsent publications"):
        for among in _among(conn, query, names, tasks):
            for row in conn.execute(among.order_by(*order).limit(limit)).mappings():
                found[row["id"]] = _row(row)
    return sorted(found.values(), key=lambda row: (row.next_try_ms, row.id))[:limit]


def held_publications(
    conn: Connection, name: str, *, now_ms: int, hold_ms: int, limit: int
) -> list[OutboxRow]:
    """The unsent publications of the lease name ``name`` still held by whoever recorded
    them, untouched since: held past ``now_ms``, their next try still their record time
    plus ``hold_ms`` (``next_try_ms == created_ms + hold_ms``), no try counted. Every
    later attempt (a retry, a sweep's claim, a send given up on) moves the next try or
    counts a try, so a row found here is one whose recorder has not come back to it: for
    a recorder that died (its lease given up), nobody is sending it. Oldest instant
    first, at most ``limit``; one statement, over the index of ``(sent_ms,
    next_try_ms)`` (the held rows of every name)."""
    query = (
        sa.select(_o)
        .where(
            _UNSENT,
            _o.c.next_try_ms > now_ms,
            _o.c.name == name,
            _o.c.tries == 0,
            _o.c.next_try_ms == _o.c.created_ms + hold_ms,
        )
        .order_by(_o.c.instant_ms, _o.c.id)
        .limit(limit)
    )
    with translate_errors("read the held publications"):
        return [_row(found) for found in conn.execute(query).mappings()]


def next_publication_ms(
    conn: Connection,
    *,
    now_ms: int,
    names: Collection[str] | None = None,
    tasks: Collection[str] = (),
) -> int | None:
    """The earliest next try time after ``now_ms`` of the unsent publications (of
    ``names`` and ``tasks``, as `due_publications` takes them): when the next one comes
    due (a hold or a back-off ends), or ``None`` if none is waiting. One small statement
    (a few elsewhere than PostgreSQL for more than `NAMES_PER_STATEMENT` names)."""
    query = sa.select(sa.func.min(_o.c.next_try_ms)).where(_UNSENT, _o.c.next_try_ms > now_ms)
    with translate_errors("read the unsent publications"):
        found = [conn.execute(among).scalar() for among in _among(conn, query, names, tasks)]
    times = [int(at) for at in found if at is not None]
    return min(times) if times else None


def _among(
    conn: Connection,
    query: sa.Select[Any],
    names: Collection[str] | None,
    tasks: Collection[str],
) -> list[sa.Select[Any]]:
    """``query`` limited to the rows of ``names`` or ``tasks`` (see `due_publications`):
    one statement on PostgreSQL, as many as the chunks of names elsewhere."""
    if names is None:
        return [query]
    listed, by_task = sorted(set(names)), sorted(set(tasks))
    if conn.dialect.name == "postgresql":
        return [
            query.where(sa.or_(_in(_o.c.name, listed, "names"), _in(_o.c.task, by_task, "tasks")))
        ]
    return [
        query.where(column.in_(values[start : start + NAMES_PER_STATEMENT]))
        for column, values in ((_o.c.name, listed), (_o.c.task, by_task))
        for start in range(0, len(values), NAMES_PER_STATEMENT)
    ]


def _in(column: sa.ColumnElement[Any], values: list[str], key: str) -> sa.ColumnElement[bool]:
    """``column IN values`` on PostgreSQL: one array parameter, whatever the count."""
    array = sa.bindparam(key, values, type_=postgresql.ARRAY(sa.String()))
    return column.in_(sa.select(sa.func.unnest(array)))


def orphaned_publications(conn: Connection, *, now_ms: int, limit: int) -> list[OutboxRow]:
    """The unsent due publications (as `due_publications` reads them) whose lease name is
    no schedule on record (a removed schedule's tombstone does not count): those of a
    removed schedule, or of a registered job. At most ``limit``, the longest due first.
    The caller decides which of them nobody can send any more (`resolve_obsolete`)."""
    _s = schedule_table
    live = sa.select(_s.c.id).where(_s.c.id == _o.c.name, _s.c.removed == 0).exists()
    query = sa.select(_o).where(_UNSENT, _o.c.next_try_ms <= now_ms, ~live)
    with translate_errors("read the unsent publications"):
        rows = conn.execute(query.order_by(_o.c.next_try_ms, _o.c.id).limit(limit))
        return [_row(found) for found in rows.mappings()]


def resolve_obsolete(conn: Connection, id: str, *, seen_next_try_ms: int, now_ms: int) -> bool:
    """Resolve the unsent publication ``id`` as obsolete at ``now_ms``: nobody sends it
    after, and `outbox_summary` does not count it. Conditional, as `claim_publication`:
    ``False`` if it was sent, resolved or claimed (its next try moved) meanwhile."""
    with translate_errors("resolve a publication obsolete"):
        done = conn.execute(
            _o.update()
            .where(_o.c.id == id, _UNSENT, _o.c.next_try_ms == seen_next_try_ms)
            .values(obsolete_ms=now_ms)
        )
    return done.rowcount == 1


def defer_publications(
    conn: Connection, ids: Collection[str], *, now_ms: int, next_try_ms: int
) -> int:
    """Move the next try of the unsent publications ``ids`` that are due (at or before
    ``now_ms``) to ``next_try_ms``, without counting a try: they were not tried (their
    target refused another one just now). A row claimed meanwhile (its next try already
    past ``now_ms``) or sent is left alone. One statement; returns how many moved.
    """
    if not ids:
        return 0
    with translate_errors("defer publications"):
        done = conn.execute(
            _o.update()
            .where(
                _o.c.id.in_(sorted(ids)),
                _UNSENT,
                _o.c.next_try_ms <= now_ms,
            )
            .values(next_try_ms=next_try_ms)
        )
    return int(done.rowcount)


def outbox_summary(conn: Connection) -> OutboxSummary:
    """How many publications are unsent, and when the oldest of them was recorded; those
    resolved obsolete are not counted."""
    with translate_errors("count the unsent publications"):
        count, oldest = conn.execute(
            sa.select(sa.func.count(), sa.func.min(_o.c.created_ms)).where(_UNSENT)
        ).one()
    return OutboxSummary(unsent=int(count), oldest_ms=None if oldest is None else int(oldest))


def prune_outbox(engine: Engine, *, before_ms: int) -> int:
    """Delete the publications sent or resolved obsolete, and the once-rows done, before
    ``before_ms``, in a
    transaction of its own; returns how many rows went. Unsent publications and running
    bodies stay."""
    with translate_errors("prune the outbox"), engine.begin() as conn:
        sent = conn.execute(
            _o.delete().where(
                sa.or_(
                    sa.and_(_o.c.sent_ms.is_not(None), _o.c.sent_ms < before_ms),
                    sa.and_(_o.c.obsolete_ms.is_not(None), _o.c.obsolete_ms < before_ms),
                )
            )
        ).rowcount
        done = conn.execute(
            _n.delete().where(_n.c.state == ONCE_DONE, _n.c.ended_ms < before_ms)
        ).rowcount
    return int(sent) + int(done)
