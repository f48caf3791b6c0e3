"""The outbox and the once-table: publications handed to another system, and bodies run
once per id (revision 0010).

- ``cronjob_outbox``: one row per publication a holder promised (an id, the lease name
  and instant it belongs to, what to send). Written in the holder's fenced transaction
  before it sends, marked sent once the other system accepted it. Until then anyone may
  retry it, one at a time: a retry *claims* the row by a conditional update of its next
  try time (`claim_publication`), so two retriers never send a row at once.
- ``cronjob_once``: one row per id whose body ran or runs: an insert-if-new starts it
  (`begin_once`), its end marks it done (`finish_once`) or deletes it (`release_once`,
  the body failed: a redelivery runs it again). A row still running past a stale time
  may be taken over by a redelivery (the worker that ran it died).

The package knows ids, names, instants and opaque payloads, nothing of brokers. Every
time is epoch milliseconds given by the caller (its clock). Each function takes the
caller's `Connection` and runs in its transaction, except `begin_once` (an
insert-if-new needs a transaction of its own) which takes an `Engine`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import postgresql

from ._exceptions import translate_errors
from ._schema import ERROR_LENGTH, once_table, outbox_table, schedule_table

__all__ = [
    "ONCE_DONE",
    "NAMES_PER_STATEMENT",
    "ONCE_RUNNING",
    "OutboxRow",
    "OutboxSummary",
    "begin_once",
    "claim_publication",
    "defer_publications",
    "due_publications",
    "finish_once",
    "mark_published",
    "orphaned_publications",
    "outbox_summary",
    "prune_outbox",
    "record_publication",
    "release_once",
    "resolve_obsolete",
]

#: ``cronjob_once.state`` of a body that runs (or whose worker died running it).
ONCE_RUNNING: Final = "running"
#: ``cronjob_once.state`` of a body that ran to its end: never run again.
ONCE_DONE: Final = "done"

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


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxSummary:
    """The publications not yet sent: how many, and when the oldest was recorded."""

    unsent: int
    oldest_ms: int | None


def _row(found: sa.RowMapping) -> OutboxRow:
    return OutboxRow(
        id=found["id"],
        name=found["name"],
        instant=_EPOCH + timedelta(milliseconds=found["instant_ms"]),
        target=found["target"],
        payload=json.loads(found["payload"]),
        created_ms=found["created_ms"],
        next_try_ms=found["next_try_ms"],
        tries=found["tries"],
        sent_ms=found["sent_ms"],
        error=found["error"],
        task=found["task"],
        obsolete_ms=found["obsolete_ms"],
    )


def _ms(instant: datetime) -> int:
    return round((instant - _EPOCH).total_seconds() * 1000)


def record_publication(
    conn: Connection,
    *,
    id: str,
    name: str,
    instant: datetime,
    target: str,
    payload: Mapping[str, Any],
    now_ms: int,
    hold_ms: int,
    task: str | None = None,
) -> tuple[OutboxRow, bool]:
    """Put a publication on record unless it is already (insert-if-new, by ``id``).

    The caller holds the lease of ``name`` for ``instant`` (it is the only writer of this
    id), so a read then an insert cannot race another insert of the same id.

    Args:
        hold_ms: How long the recorder keeps the row to itself: a new row's next try
            time is ``now_ms + hold_ms``.
        task: The task of the schedule ``name`` is, if it is one: once the schedule is
            gone, whoever registers the task sends the row (see `due_publications`).

    Returns:
        The row, and whether it was new. A row already on record is returned as it is
        (sent or not): a second run of the round finds what the first recorded.
    """
    with translate_errors("record a publication"):
        found = conn.execute(sa.select(_o).where(_o.c.id == id)).mappings().first()
        if found is not None:
            return _row(found), False
        values = {
            "id": id,
            "name": name,
            "instant_ms": _ms(instant),
            "target": target,
            "payload": json.dumps(dict(payload), sort_keys=True),
            "created_ms": now_ms,
            "next_try_ms": now_ms + hold_ms,
            "tries": 0,
            "sent_ms": None,
            "error": None,
            "task": task,
            "obsolete_ms": None,
        }
        conn.execute(_o.insert().values(values))
    return _row(values), True  # type: ignore[arg-type]


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


def due_publications(
    conn: Connection,
    *,
    now_ms: int,
    limit: int,
    names: Collection[str] | None = None,
    tasks: Collection[str] = (),
) -> list[OutboxRow]:
    """The unsent publications whose next try time has come (at or before ``now_ms``),
    the longest due first, at most ``limit``.

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
    with translate_errors("read the unsent publications"):
        if names is None:
            rows = conn.execute(query.order_by(*order).limit(limit)).mappings()
            return [_row(found) for found in rows]
        listed, by_task = sorted(set(names)), sorted(set(tasks))
        if conn.dialect.name == "postgresql":
            among = query.where(
                sa.or_(_in(_o.c.name, listed, "names"), _in(_o.c.task, by_task, "tasks"))
            )
            rows = conn.execute(among.order_by(*order).limit(limit)).mappings()
            return [_row(found) for found in rows]
        found: dict[str, OutboxRow] = {}
        for column, values in ((_o.c.name, listed), (_o.c.task, by_task)):
            for start in range(0, len(values), NAMES_PER_STATEMENT):
                chunk = values[start : start + NAMES_PER_STATEMENT]
                among = query.where(column.in_(chunk)).order_by(*order).limit(limit)
                for row in conn.execute(among).mappings():
                    found[row["id"]] = _row(row)
    return sorted(found.values(), key=lambda row: (row.next_try_ms, row.id))[:limit]


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


def begin_once(
    engine: Engine,
    id: str,
    *,
    task: str,
    holder: str,
    now_ms: int,
    stale_ms: int,
) -> tuple[int | None, str]:
    """Start the body of ``id``, unless it ran or runs: an insert-if-new, in a transaction
    of its own.

    A row that has been running since ``now_ms - stale_ms`` or before (its worker died,
    or runs still far longer than it should) is taken over: its token changes, so the
    first worker's end changes nothing.

    Returns:
        A token to end the body with (`finish_once`, `release_once`) and `ONCE_RUNNING`;
        or ``None`` and the state found: `ONCE_DONE` (it ran), `ONCE_RUNNING` (it runs
        elsewhere, not stale yet).
    """
    token = secrets.randbits(63)
    row = {
        "id": id,
        "task": task,
        "state": ONCE_RUNNING,
        "token": token,
        "holder": holder,
        "started_ms": now_ms,
        "ended_ms": None,
    }
    with translate_errors("begin a body run once"):
        try:
            with engine.begin() as conn:
                conn.execute(_n.insert().values(row))
            return token, ONCE_RUNNING
        except sa.exc.IntegrityError:
            pass  # on record: done, running, or stale
        with engine.begin() as conn:
            found = conn.execute(
                sa.select(_n.c.state, _n.c.token, _n.c.started_ms).where(_n.c.id == id)
            ).first()
            if found is None:  # released meanwhile (its body failed): run it
                conn.execute(_n.insert().values(row))
                return token, ONCE_RUNNING
            state, old, started_ms = found
            if state != ONCE_RUNNING or started_ms > now_ms - stale_ms:
                return None, str(state)
            taken = conn.execute(
                _n.update()
                .where(_n.c.id == id, _n.c.token == old, _n.c.state == ONCE_RUNNING)
                .values(token=token, holder=holder, started_ms=now_ms)
            )
            return (token, ONCE_RUNNING) if taken.rowcount == 1 else (None, ONCE_RUNNING)


def finish_once(conn: Connection, id: str, token: int, *, now_ms: int) -> bool:
    """Mark the body of ``id`` done; ``False`` if ``token`` no longer holds it (taken
    over as stale)."""
    with translate_errors("finish a body run once"):
        done = conn.execute(
            _n.update()
            .where(_n.c.id == id, _n.c.token == token, _n.c.state == ONCE_RUNNING)
            .values(state=ONCE_DONE, ended_ms=now_ms)
        )
    return done.rowcount == 1


def release_once(conn: Connection, id: str, token: int) -> bool:
    """Forget the body of ``id`` (it failed), so that a redelivery runs it again;
    ``False`` if ``token`` no longer holds it."""
    with translate_errors("release a body run once"):
        done = conn.execute(
            _n.delete().where(_n.c.id == id, _n.c.token == token, _n.c.state == ONCE_RUNNING)
        )
    return done.rowcount == 1
