"""Putting publications on record in the outbox: one (`record_publication`), or many at
once (`record_publications`, a group of holders' records in one transaction).

Each is an insert-if-new by id: a row already on record is returned as it is, never
written over (a second run of a round finds what the first recorded). The caller holds
the lease of each publication's name (it is the only writer of that id), so a read then
an insert cannot race another insert of the same id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from ._exceptions import translate_errors
from ._outbox import OutboxRow, _ms, _row
from ._rows import _json_recordset
from ._schema import outbox_table

__all__ = ["RECORDS_PER_STATEMENT", "Publication", "record_publication", "record_publications"]

#: The most rows one statement of `record_publications` writes or reads (twelve
#: parameters a row: well below every driver's limit).
RECORDS_PER_STATEMENT: Final = 500

_o = outbox_table
_READ: Final = sa.select(_o).where(_o.c.id.in_(sa.bindparam("ids", expanding=True)))
_INSERT: Final = _o.insert()
#: An insert that does nothing when the id is on record, by dialect (where it has one
#: that says so without ignoring other errors; PostgreSQL's is `_INSERT_IF_NEW_PG`); run
#: with many rows, one statement of them all (SQLAlchemy's "insertmanyvalues"),
#: returning the ids it wrote.
_INSERT_IF_NEW: Final[dict[str, sa.Insert]] = {
    "sqlite": sqlite.insert(_o).on_conflict_do_nothing(index_elements=[_o.c.id]).returning(_o.c.id),
}
#: The columns a new row is written with (the others start NULL).
_WRITTEN: Final = (
    _o.c.id,
    _o.c.name,
    _o.c.instant_ms,
    _o.c.target,
    _o.c.payload,
    _o.c.created_ms,
    _o.c.next_try_ms,
    _o.c.tries,
    _o.c.task,
)
_RECORDS: Final = _json_recordset("records", *_WRITTEN)
#: PostgreSQL: the insert-if-new of the rows of one JSON parameter (see
#: ``_json_recordset``), one statement text at any count. SQLAlchemy's "insertmanyvalues"
#: renders a statement of twelve parameters a row, compiled and parsed by the driver anew
#: for each count: about 50 µs of CPU a record in groups of 166 (a hand-off's at 10,000 a
#: minute), against 20 here, the rows' JSON included.
_INSERT_IF_NEW_PG: Final = (
    postgresql.insert(_o)
    .from_select(
        [column.name for column in _WRITTEN],
        sa.select(*(_RECORDS.c[column.name] for column in _WRITTEN)),
    )
    .on_conflict_do_nothing(index_elements=[_o.c.id])
    .returning(_o.c.id)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Publication:
    """A publication to put on record (see `record_publication` for each field).

    Attributes:
        id: Its id (the message's own id).
        name: The lease name it belongs to (the caller holds its lease).
        instant: The instant it belongs to (aware).
        target: What it is sent to.
        payload: The JSON-able data to record.
        now_ms: When it is recorded (the recorder's clock): its ``created_ms``.
        hold_ms: How long the recorder keeps it to itself: its next try time is
            ``now_ms + hold_ms``.
        task: The task of the schedule ``name`` is, if it is one.
    """

    id: str
    name: str
    instant: datetime
    target: str
    payload: Mapping[str, Any]
    now_ms: int
    hold_ms: int
    task: str | None = None


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
    id), so a read then an insert cannot race another insert of the same id. On
    PostgreSQL and SQLite a new row (the usual case) takes one statement, an insert that
    does nothing when the id is on record already (then read); on MariaDB/MySQL the
    read comes first.

    Args:
        hold_ms: How long the recorder keeps the row to itself: a new row's next try
            time is ``now_ms + hold_ms``.
        task: The task of the schedule ``name`` is, if it is one: once the schedule is
            gone, whoever registers the task sends the row (see `due_publications`).

    Returns:
        The row, and whether it was new. A row already on record is returned as it is
        (sent or not): a second run of the round finds what the first recorded.
    """
    publication = Publication(
        id=id,
        name=name,
        instant=instant,
        target=target,
        payload=payload,
        now_ms=now_ms,
        hold_ms=hold_ms,
        task=task,
    )
    (recorded,) = record_publications(conn, [publication])
    return recorded


def record_publications(
    conn: Connection, publications: Sequence[Publication]
) -> list[tuple[OutboxRow, bool]]:
    """Put each of ``publications`` on record unless it is already, as
    `record_publication` does for one, in as few statements as the dialect allows.

    The caller holds the lease of every publication's name. On PostgreSQL and SQLite one
    multi-row insert that does nothing for an id on record, then, only if some were, one
    read of those; on MariaDB/MySQL one read of the ids on record first, then one
    multi-row insert of the others: per `RECORDS_PER_STATEMENT` publications. An id given
    twice is written once; the second is returned as on record.

    Returns:
        For each publication, in the order given: its row, and whether this call wrote
        it. A row already on record is returned as it is (sent or not).
    """
    found: dict[str, tuple[OutboxRow, bool]] = {}
    with translate_errors("record a publication"):
        for start in range(0, len(publications), RECORDS_PER_STATEMENT):
            _record(conn, publications[start : start + RECORDS_PER_STATEMENT], found)
    return [_once(found, publication.id) for publication in publications]


def _once(found: dict[str, tuple[OutboxRow, bool]], id: str) -> tuple[OutboxRow, bool]:
    """``id``'s row and whether it was written, then as on record for a repeat of it."""
    row, new = found[id]
    found[id] = (row, False)
    return row, new


def _record(
    conn: Connection, chunk: Sequence[Publication], found: dict[str, tuple[OutboxRow, bool]]
) -> None:
    """Record ``chunk`` (see `record_publications`) into ``found``: id -> (row, new)."""
    values = {p.id: _values(p) for p in chunk if p.id not in found}
    if not values:
        return
    dialect = conn.dialect.name
    upsert = _INSERT_IF_NEW.get(dialect)
    if dialect == "postgresql" or upsert is not None:
        if upsert is None:
            result = conn.execute(_INSERT_IF_NEW_PG, _json_records(values))
        else:
            result = conn.execute(upsert, list(values.values()))
        written = {row[0] for row in result}
        on_record = [id for id in values if id not in written]
        if on_record:
            for row in conn.execute(_READ, {"ids": on_record}).mappings():
                found[row["id"]] = (_row(row), False)
    else:
        for row in conn.execute(_READ, {"ids": list(values)}).mappings():
            found[row["id"]] = (_row(row), False)
        new = [value for id, value in values.items() if id not in found]
        if new:
            conn.execute(_INSERT, new)
        written = {value["id"] for value in new}
    for id in written:
        found[id] = (_row(values[id]), True)  # type: ignore[arg-type]


def _json_records(values: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The parameter of `_INSERT_IF_NEW_PG`: the new rows' written columns, as JSON."""
    names = [column.name for column in _WRITTEN]
    return {"records": json.dumps([{name: row[name] for name in names} for row in values.values()])}


def _values(publication: Publication) -> dict[str, Any]:
    """The row a new ``publication`` is written as."""
    return {
        "id": publication.id,
        "name": publication.name,
        "instant_ms": _ms(publication.instant),
        "target": publication.target,
        "payload": json.dumps(dict(publication.payload), sort_keys=True),
        "created_ms": publication.now_ms,
        "next_try_ms": publication.now_ms + publication.hold_ms,
        "tries": 0,
        "sent_ms": None,
        "error": None,
        "task": publication.task,
        "obsolete_ms": None,
    }
