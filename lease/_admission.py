"""Admissions: the descriptor a stream worker pins at an occurrence's first claim, and
what the lease database says a name is now (for the worker's checks).

`admit` is an insert-if-new: of the workers that claim one occurrence at once, the first
insert wins and every other adopts the row it finds. `count_failure` counts a failed run
against the pinned retry budget. `definition` reads, in one transaction, what names a
schedule now: a schedule row that is not removed, else the job of that name that a
replica on record registers (its spec as that replica recorded it). `once_state` reads
whether a body run once was ever started for an id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy import Engine

from ._exceptions import translate_errors
from ._schema import admission_table, once_table, replica_table, schedule_table

__all__ = [
    "Admission",
    "Definition",
    "admit",
    "count_failure",
    "definition",
    "once_state",
    "read_admission",
]

_a = admission_table


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """An admitted occurrence and its pinned descriptor (``cronjob_admission``)."""

    id: str
    schedule: str
    #: The name the handler is registered under.
    handler: str
    timeout_ms: int
    retries: int
    #: Runs that failed so far.
    failures: int
    admitted_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Definition:
    """What names a schedule now.

    Attributes:
        name: The schedule's (or job's) name.
        task: A data schedule's task; the job's own name for a registered job.
        spec: Its spec (zone included as ``CRON_TZ=``); ``None`` for a one-off.
        at: A one-off schedule's instant; ``None`` for a spec.
        start, end: A data schedule's bounds; ``None``: unbounded.
    """

    name: str
    task: str
    spec: str | None
    at: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None


def _admission(row: sa.RowMapping) -> Admission:
    return Admission(**{key: row[key] for key in Admission.__slots__})


def read_admission(engine: Engine, id: str) -> Admission | None:
    """The admission of occurrence ``id``; ``None`` if it was never admitted."""
    with translate_errors("read an admission"), engine.begin() as conn:
        row = conn.execute(sa.select(_a).where(_a.c.id == id)).mappings().first()
    return None if row is None else _admission(row)


def admit(
    engine: Engine,
    id: str,
    *,
    schedule: str,
    handler: str,
    timeout_ms: int,
    retries: int,
    now_ms: int,
) -> tuple[Admission, bool]:
    """Pin the descriptor of occurrence ``id`` unless one is pinned: an insert-if-new.

    Returns:
        The admission on record, and ``True`` if this call wrote it (the first claim);
        ``False``: another claim won, and its descriptor is the one to adopt.
    """
    made = Admission(
        id=id,
        schedule=schedule,
        handler=handler,
        timeout_ms=timeout_ms,
        retries=retries,
        failures=0,
        admitted_ms=now_ms,
    )
    row = {key: getattr(made, key) for key in Admission.__slots__}
    with translate_errors("admit an occurrence"):
        try:
            with engine.begin() as conn:
                conn.execute(_a.insert().values(row))
            return made, True
        except sa.exc.IntegrityError:
            pass  # admitted by another claim: adopt its descriptor
    found = read_admission(engine, id)
    if found is None:  # never deleted: only a hand-edited table gets here
        raise RuntimeError(f"occurrence {id}: admission neither written nor found")
    return found, False


def count_failure(engine: Engine, id: str) -> int:
    """Count one failed run of admitted occurrence ``id``; the failures so far (0 when it
    was never admitted)."""
    with translate_errors("count a failure"), engine.begin() as conn:
        conn.execute(_a.update().where(_a.c.id == id).values(failures=_a.c.failures + 1))
        found = conn.execute(sa.select(_a.c.failures).where(_a.c.id == id)).scalar()
    return int(found or 0)


def _when(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def definition(engine: Engine, name: str, *, live_since_ms: int | None = None) -> Definition | None:
    """What names ``name`` now: its schedule row (not removed), else the job of that name
    that a replica on record registers (seen at or after ``live_since_ms``, when given;
    any replica record by default: a replica's record says what it registers, whatever
    its clock, and a replica that stops takes its record off); ``None``: neither (the
    schedule was removed, or never there). A replica record that does not parse is
    skipped."""
    s, p = schedule_table, replica_table
    with translate_errors("read a schedule's definition"), engine.begin() as conn:
        row = conn.execute(
            sa.select(s.c.task, s.c.spec, s.c.at_s, s.c.start_s, s.c.end_s).where(
                s.c.id == name, s.c.removed == 0
            )
        ).first()
        if row is not None:
            task, spec, at_s, start_s, end_s = row
            return Definition(
                name=name,
                task=task,
                spec=spec,
                at=_when(at_s),
                start=_when(start_s),
                end=_when(end_s),
            )
        query = sa.select(p.c.jobs)
        if live_since_ms is not None:
            query = query.where(p.c.seen_ms >= live_since_ms)
        listed = conn.execute(query).scalars()
        for text in listed:
            try:
                entry = json.loads(text).get(name)
            except (ValueError, AttributeError):
                continue
            if isinstance(entry, dict) and isinstance(entry.get("spec"), str):
                return Definition(name=name, task=name, spec=entry["spec"])
    return None


def once_state(engine: Engine, id: str) -> str | None:
    """The state of the body run once for ``id`` (``ONCE_RUNNING``, ``ONCE_DONE``), or
    ``None``: never started, or started, failed and forgotten."""
    with translate_errors("read a body run once"), engine.begin() as conn:
        state = conn.execute(
            sa.select(once_table.c.state).where(once_table.c.id == id)
        ).scalar_one_or_none()
    return None if state is None else str(state)
