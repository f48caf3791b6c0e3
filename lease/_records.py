"""What the holders leave on record beside their leases: round ends, history, replicas.

The values passed to and read from [LeaseStore][lease.LeaseStore] for revision 0002's
columns and tables (see `lease._schema`), and the statements' pieces that do not
depend on the store's clock. The store runs the statements.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import RowMapping

from ._schema import ERROR_LENGTH, replica_table, round_table

__all__ = [
    "COUNTED_FAILURES",
    "DEFAULT_HISTORY_DAYS",
    "DEFAULT_HISTORY_PER_NAME",
    "NOT_COUNTED",
    "Ending",
    "ReplicaRow",
    "RoundRow",
    "bounded_error",
    "replica_from",
    "round_from",
    "round_values",
]

#: Rounds older than this many days are pruned.
DEFAULT_HISTORY_DAYS: Final = 14
#: At most this many rounds of one name are kept.
DEFAULT_HISTORY_PER_NAME: Final = 1000

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_SECOND: Final = timedelta(seconds=1)
_CUT: Final = " [...]"


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRow:
    """One round that ended: a row of the history (``cronjob_round``)."""

    name: str
    instant: datetime
    attempt: int
    holder: str
    #: Why it ran, in the holder's words (at most 16 characters).
    why: str
    #: On the holder's clock.
    started: datetime
    ended: datetime
    #: ``'succeeded'``, ``'failed'``, ``'cut short'``, ``'given up'``, ``'timed_out'``,
    #: ``'missed_deadline'`` or ``'retrying'`` (an attempt followed by another).
    outcome: str
    error: str | None = None
    trace_id: str | None = None
    #: Who asked for a manual round (``why`` ``'manual'``, revision 0004); else ``None``.
    requested_by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ending:
    """The end of a round to record with [LeaseStore.finish_many][lease.LeaseStore.finish_many]."""

    name: str
    token: int
    ended: datetime
    #: ``False`` for a round that raised an error of its own (it still ran to its end).
    succeeded: bool = True
    #: The failure's summary (bounded with `bounded_error` before it is stored).
    error: str | None = None
    #: The history row to add, or ``None`` (history off).
    record: RoundRow | None = None
    #: The outcome in the record's words (see `COUNTED_FAILURES`); ``None``: the
    #: record's, else ``'succeeded'`` or ``'failed'`` per `succeeded`.
    outcome: str | None = None
    #: This attempt failed and the round runs again under the same lease (``'retrying'``):
    #: the row stays ``running`` and held, its attempt becomes 2 (a run after the first:
    #: cut short from now on, it is given up), and only the history row is added.
    retrying: bool = False
    #: The round is on record, but its job still runs (it ignored its timeout, and its
    #: process is about to end): the row is written as any end's, except that it stays
    #: ``running`` and held until the lease expires, its attempt 2 (never run a second
    #: time), so no replica starts the job while it may still run.
    holding: bool = False

    @property
    def word(self) -> str:
        """The outcome written to the lease row's ``last_outcome``."""
        if self.outcome is not None:
            return self.outcome
        if self.record is not None:
            return self.record.outcome
        return "succeeded" if self.succeeded else "failed"


#: The outcomes of a round that ran to its end that count as one more failure in a row
#: (``failures`` on the lease row); ``'succeeded'`` resets it. The others a policy adds
#: leave it as it is: ``'retrying'`` (an attempt, not the round's end) and
#: ``'missed_deadline'`` (the round never ran), ``'superseded'`` (a newer instant
#: cancelled it: ``overlap="cancel_other"``).
COUNTED_FAILURES: Final = frozenset({"failed", "timed_out"})
#: The outcomes that leave the failures in a row as they are.
NOT_COUNTED: Final = frozenset({"retrying", "missed_deadline", "superseded"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaRow:
    """One holder's record (``cronjob_replica``)."""

    holder: str
    host: str
    pid: int
    version: str
    #: On the lease clock.
    started: datetime
    seen: datetime
    #: The names it registered: ``name -> (spec, leased)``.
    jobs: Mapping[str, tuple[str, bool]]
    #: The policies of the jobs that have any (``name -> Policy.describe()``, JSON-ready);
    #: a job without options, or a row written by an older release, has none here.
    policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The tasks it registered (whose schedules are data); with their policies in
    #: ``policies``. A row written by an older release has none.
    tasks: frozenset[str] = frozenset()


def bounded_error(text: str | None) -> str | None:
    """``text`` cut to `ERROR_LENGTH` characters, marked when cut,
    with characters no database stores (NUL, lone surrogates) replaced."""
    if text is None:
        return None
    clean = text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if len(clean) > ERROR_LENGTH:
        clean = clean[: ERROR_LENGTH - len(_CUT)] + _CUT
    return clean


def round_values(row: RoundRow) -> dict[str, Any]:
    """The column values of ``row`` for an INSERT into the history."""
    trace_id, error = row.trace_id, row.error
    return {
        "name": row.name,
        "instant": _epoch_seconds(row.instant),
        "attempt": row.attempt,
        "holder": row.holder,
        "why": row.why[:16],
        "started_ms": (row.started - _EPOCH) // _MS,
        "ended_ms": (row.ended - _EPOCH) // _MS,
        "outcome": row.outcome[:16],
        "error": None if error is None else bounded_error(error),
        "trace_id": None if trace_id is None else trace_id[:32],
        "requested_by": row.requested_by,
    }


#: The instant written out last and its epoch seconds: the rows of a batch are mostly of
#: one instant (thousands of rounds that started together).
_last_instant: tuple[datetime, int] = (_EPOCH, 0)


def _epoch_seconds(instant: datetime) -> int:
    """``instant`` in whole epoch seconds; the last one asked is kept (by identity)."""
    global _last_instant
    last = _last_instant
    if last[0] is instant:
        return last[1]
    seconds = (instant - _EPOCH) // _SECOND
    _last_instant = (instant, seconds)
    return seconds


def round_from(row: RowMapping) -> RoundRow:
    """A history row as read."""
    return RoundRow(
        name=row["name"],
        instant=_EPOCH + timedelta(seconds=int(row["instant"])),
        attempt=int(row["attempt"]),
        holder=row["holder"],
        why=row["why"],
        started=_EPOCH + int(row["started_ms"]) * _MS,
        ended=_EPOCH + int(row["ended_ms"]) * _MS,
        outcome=row["outcome"],
        error=row["error"],
        trace_id=row["trace_id"],
        requested_by=row.get("requested_by"),
    )


def _parsed(
    text: object,
) -> tuple[dict[str, tuple[str, bool]], dict[str, Mapping[str, Any]], frozenset[str]]:
    """A ``jobs`` column's jobs (``{name: (spec, leased)}``), policies and tasks; a value
    that is not what we write reads as none."""
    jobs: dict[str, tuple[str, bool]] = {}
    policies: dict[str, Mapping[str, Any]] = {}
    tasks: set[str] = set()
    try:
        listed = json.loads(text) if isinstance(text, str | bytes) else None
    except ValueError:
        listed = None
    if isinstance(listed, dict):
        for name, entry in listed.items():
            if not isinstance(entry, dict):
                continue
            if isinstance(entry.get("spec"), str):
                jobs[str(name)] = (entry["spec"], bool(entry.get("leased", True)))
            elif entry.get("task") is True:
                tasks.add(str(name))
            else:
                continue
            policy = entry.get("policy")
            if isinstance(policy, dict) and policy:
                policies[str(name)] = policy
    return jobs, policies, frozenset(tasks)


def replica_from(row: RowMapping) -> ReplicaRow:
    """A replica's row as read; a ``jobs`` value that is not what we write reads as none."""
    jobs, policies, tasks = _parsed(row["jobs"])
    return ReplicaRow(
        holder=row["holder"],
        host=row["host"],
        pid=int(row["pid"]),
        version=row["version"],
        started=_EPOCH + int(row["started_ms"]) * _MS,
        seen=_EPOCH + int(row["seen_ms"]) * _MS,
        jobs=jobs,
        policies=policies,
        tasks=tasks,
    )


#: How many of a reader's jobs `lists_one_of` looks for in a record's text.
_SAMPLES: Final = 8


def job_needles(jobs: Mapping[str, str]) -> list[str]:
    """What `lists_one_of` looks for: for a few of ``jobs`` (name -> spec, spread
    over their names' order), the entry `jobs_json` writes for the job leased on
    that spec, as it starts after the ``{`` or ``,`` before it."""
    names = sorted(jobs)
    step = max(1, len(names) // _SAMPLES)
    entries = [
        f"{json.dumps(name)}:{{{json.dumps('spec')}:{json.dumps(jobs[name])},"
        f"{json.dumps('leased')}:true"
        for name in names[::step][:_SAMPLES]
    ]
    return [before + entry for entry in entries for before in "{,"]


def lists_one_of(text: object, jobs: Mapping[str, str], needles: Iterable[str]) -> bool:
    """Whether a record's ``jobs`` column (``text``) lists one of ``jobs`` as leased.

    A record of the same deployment lists every job as the reader's own record does:
    one of ``needles`` (`job_needles`) is in its text, found without parsing it
    (the text of 100,000 jobs is ~5 MB, parsed ~40 MB and a tenth of a second). Any other
    record is parsed and its leased names compared with ``jobs``. A needle cannot match
    inside a value (within a JSON string its quotes would be escaped), nor the end of
    another key (it starts with the ``{`` or ``,`` that comes before a key).
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return False
    if any(needle in text for needle in needles):
        return True
    listed, _policies, tasks = _parsed(text)
    return any(leased and name in jobs for name, (_spec, leased) in listed.items()) or any(
        name in jobs for name in tasks
    )


def jobs_json(
    jobs: Mapping[str, tuple[str, bool]],
    policies: Mapping[str, Mapping[str, Any]] | None = None,
    tasks: Iterable[str] = (),
) -> str:
    """The ``jobs`` column of a replica: ``{name: {"spec": ..., "leased": ...}}``, and
    ``"policy": {...}`` beside them for a job that has one. An older release's reader
    takes ``spec`` and ``leased`` and ignores the key it does not know. A task is
    ``{name: {"task": true}}``: with no ``spec``, an older reader skips it."""
    entries: dict[str, dict[str, Any]] = {}
    listed: list[tuple[str, dict[str, Any]]] = [
        (name, {"spec": spec, "leased": leased}) for name, (spec, leased) in jobs.items()
    ]
    listed += [(name, {"task": True}) for name in tasks]
    for name, entry in sorted(listed, key=lambda pair: pair[0]):
        policy = None if policies is None else policies.get(name)
        if policy:
            entry["policy"] = dict(policy)
        entries[name] = entry
    return json.dumps(entries, separators=(",", ":"))


_r = round_table
_p = replica_table


def prune_statement(*, cutoff_ms: int, per_name: int) -> sa.Delete:
    """One DELETE of the rounds that ended before ``cutoff_ms``, and of each name's
    rounds past its ``per_name`` newest.

    The ranked ids sit in a derived table of their own: MySQL/MariaDB refuse a subquery
    on the table a DELETE changes, unless it is materialized first.
    """
    rank = sa.func.row_number().over(partition_by=_r.c.name, order_by=_r.c.id.desc())
    ranked = sa.select(_r.c.id.label("id"), rank.label("rank")).subquery("ranked")
    surplus = sa.select(ranked.c.id).where(ranked.c.rank > per_name).subquery("surplus")
    return _r.delete().where(
        sa.or_(_r.c.ended_ms < cutoff_ms, _r.c.id.in_(sa.select(surplus.c.id)))
    )
