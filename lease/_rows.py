"""The values the lease store reads and hands out (rows, claims, surveys, writes), and
the checks that turn what a database returns, or a caller passes, into them."""

from __future__ import annotations

import enum
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeGuard

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import RowMapping

from ._schema import (
    NAME_LENGTH,
    NEVER,
    UNFINISHED_CONDITION,
)
from ._text import unstorable

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_SECOND: Final = timedelta(seconds=1)
_TOKEN_LIMIT: Final = 2**63


class LeaseState(enum.StrEnum):
    """How the latest claimed round of a lease stands."""

    #: Never claimed.
    NEW = "new"
    #: Claimed; running while its lease is held, cut short once the lease expired.
    RUNNING = "running"
    #: Ran to its end, and the end is on record.
    DONE = "done"
    #: Cut short: its holder gave the lease back before the end.
    CUT = "cut"


_UNFINISHED: Final = (LeaseState.RUNNING.value, LeaseState.CUT.value)
#: The survey's filter (first rounds not run to their end, not paused), its values
#: written into the statement (not bound): the index of those rows alone (revision 0009)
#: is used only by a statement whose condition is its own, word for word on SQLite, and
#: known when it is planned.
UNFINISHED_ROWS: Final = sa.text(UNFINISHED_CONDITION)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRow:
    """One row of the lease table, as read."""

    name: str
    #: The latest claimed instant; ``None`` if never claimed.
    instant: datetime | None
    attempt: int
    state: LeaseState
    token: int
    holder: str | None
    #: Lease expiry in epoch milliseconds on the lease clock; ``None`` when not held.
    expires_ms: int | None
    #: The end of the latest round that ran to its end: instants up to it stay skipped.
    skipped_through: datetime | None
    prev_instant: datetime | None
    prev_state: LeaseState | None
    prev_attempt: int | None
    #: What the holders registered under the name (revision 0002; ``None`` before).
    spec: str | None = None
    #: The latest claim, the latest end on record, the latest success (lease clock).
    last_start: datetime | None = None
    last_end: datetime | None = None
    last_success: datetime | None = None
    #: How the latest round on record ended (``'succeeded'``, ``'failed'``,
    #: ``'cut short'``, ``'given up'``, or a policy's ``'timed_out'``,
    #: ``'missed_deadline'``, ``'retrying'``), and the failure's summary.
    last_outcome: str | None = None
    last_error: str | None = None
    #: Rounds in a row that failed, timed out or were given up (an attempt to be
    #: retried and a missed start deadline neither count nor reset it).
    failures: int = 0
    #: Paused since (lease clock), by whom, why (revision 0003); ``None`` when not
    #: paused. A paused row is never claimed.
    paused: datetime | None = None
    paused_by: str | None = None
    pause_reason: str | None = None
    #: When a replica first wrote the row — the name's first deployment — on the lease
    #: clock (revision 0005). ``None`` on a row an older release wrote, until a replica of
    #: this release registers the name (`LeaseStore.ensure` then fills it).
    deployed: datetime | None = None
    #: The next instant at which the row may need a claim (revision 0006): never later
    #: than the row's real next instant, so the rest of an instant can be found by it
    #: (`LeaseStore.unclaimed`). ``None`` on a row no replica of this release has
    #: claimed or registered yet.
    due: datetime | None = None
    #: When the row's timing last changed, on the lease clock (revision 0014): a
    #: registered job's spec deployed in place of another, a data schedule's spec,
    #: instant or start/end. ``None`` when no change is on record.
    spec_changed: datetime | None = None
    #: Missed instants acknowledged by an operator (revision 0016): every instant up to
    #: ``acked_through`` that no round ran stops counting as missed; when (lease clock),
    #: by whom, why. ``None`` when none was acknowledged.
    acked_through: datetime | None = None
    acked: datetime | None = None
    acked_by: str | None = None
    ack_reason: str | None = None
    #: When a schedule made of data's timing was committed — added, added again, its
    #: spec, instant or window changed — on the lease clock or the writer's ``now=``
    #: (revision 0017). ``None`` on a registered job's row and on one an older release
    #: wrote.
    committed: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """A lease claimed for one instant: the caller now runs that round."""

    name: str
    instant: datetime
    #: 1 for a first run, 2 for a second run (`LeaseStore.claim_rerun`).
    attempt: int
    #: The fencing token: pass it to renew/give_back/finish/holds.
    token: int
    #: The round this claim gave up, as ``(instant, attempt)``, when the row's previous
    #: round was unfinished (``running`` or ``cut``); ``None`` otherwise.
    superseded: tuple[datetime, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimBatch:
    """What one [LeaseStore.claim_batch][lease.LeaseStore.claim_batch] (first runs) or
    [LeaseStore.claim_reruns][lease.LeaseStore.claim_reruns] (second runs) won: rounds of
    one instant, all under one new token (drawn once per call).

    Thousands of names are claimed together at scale: one value for all of them, not a
    [Claim][lease.Claim] each ([claims][lease.ClaimBatch.claims] makes those).
    """

    instant: datetime
    #: The fencing token of every lease claimed (0 when none was).
    token: int
    #: The names claimed, in the order they were asked for.
    names: tuple[str, ...]
    #: The names whose row's previous round was unfinished (``running`` or ``cut``),
    #: each with the round the claim gave up, as ``(instant, attempt)``; for second
    #: runs, the round their instant's first claim gave up.
    superseded: Mapping[str, tuple[datetime, int]]
    #: 1 for first runs, 2 for second runs.
    attempt: int = 1
    #: The names whose row's previous round had ended (first runs), each with when that
    #: round held the lease from (its instant, or its start if later) and its end, as
    #: ``(held_from, ended)``: an instant of the job between the two had its claims
    #: refused.
    ended: Mapping[str, tuple[datetime, datetime]] = field(default_factory=dict)

    def claims(self) -> list[Claim]:
        """One [Claim][lease.Claim] per name claimed, in order."""
        return [
            Claim(
                name=name,
                instant=self.instant,
                attempt=self.attempt,
                token=self.token,
                superseded=self.superseded.get(name),
            )
            for name in self.names
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class CutShort:
    """A round cut short, which may run a second time (see
    [LeaseStore.claim_rerun][lease.LeaseStore.claim_rerun])."""

    name: str
    instant: datetime
    #: ``True`` if its holder gave the lease back (state ``cut``); ``False`` if the lease
    #: expired under a round still marked running (its holder died or lost the database).
    given_back: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Survey:
    """What [LeaseStore.survey][lease.LeaseStore.survey] found: the rounds cut short, and
    when the next one may appear without another write (the earliest expiry of a lease held
    now)."""

    cut_short: list[CutShort]
    #: The earliest ``expires_ms`` of a first round still held, as a lease-clock time;
    #: ``None`` if no such lease is held.
    next_expiry: datetime | None


class WriteKind(enum.Enum):
    """What a write did to the leases it names (see [LeaseWrite][lease.LeaseWrite])."""

    #: Claimed or renewed: held until ``expires_ms``.
    HELD = "held"
    #: Their rounds ran to their end: free, and nothing left to run a second time.
    RELEASED = "released"
    #: Given back by a round cut short: free now, and owed a second run.
    GIVEN_BACK = "given_back"
    #: A round was requested now (run-now, see `lease.Triggers`): ``leases``
    #: holds ``(name, 0)``; a sweep takes it.
    REQUESTED = "requested"
    #: Schedules made of data changed (told as their transaction commits; ``leases`` is
    #: empty): a reader of the change counter waits for the commit with a locking read.
    SCHEDULES = "schedules"


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseWrite:
    """A write to the leases, as told to [LeaseStore.watch][lease.LeaseStore.watch]'s callbacks."""

    kind: WriteKind
    #: The ``(name, token)`` pairs written.
    leases: tuple[tuple[str, int], ...]
    #: For `WriteKind.HELD`: when the leases expire (epoch ms on the lease clock),
    #: or ``None`` when the store reads the database's clock and cannot tell.
    expires_ms: int | None = None
    #: For a claim: the instant claimed (epoch seconds); ``None`` for a renewal.
    instant: int | None = None


class _MalformedRow(ValueError):
    pass


def _parse_row(row: RowMapping) -> LeaseRow:
    """Validate a row as this package writes it; raise _MalformedRow saying what is off."""

    def integer(column: str, *, nullable: bool = False, low: int | None = None) -> int | None:
        value = row[column]
        if value is None and nullable:
            return None
        if not _is_int(value) or (low is not None and value < low):
            raise _MalformedRow(f"{column} {value!r}")
        return int(value)

    def state(column: str, *, nullable: bool = False) -> LeaseState | None:
        value = row[column]
        if value is None and nullable:
            return None
        try:
            return LeaseState(value)
        except ValueError:
            raise _MalformedRow(f"{column} {value!r}") from None

    instant = integer("instant", low=NEVER)
    current = state("state")
    attempt = integer("attempt")
    if attempt not in (1, 2):
        raise _MalformedRow(f"attempt {attempt!r}")
    if (instant == NEVER) != (current is LeaseState.NEW):
        raise _MalformedRow(f"state {row['state']!r} with instant {instant!r}")
    token = integer("token", low=0)
    holder = row["holder"]
    if holder is not None and not isinstance(holder, str):
        raise _MalformedRow(f"holder {holder!r}")
    expires_ms = integer("expires_ms", nullable=True)
    skipped_through = integer("skipped_through", nullable=True, low=0)
    prev_instant = integer("prev_instant", nullable=True, low=NEVER)
    prev_attempt = integer("prev_attempt", nullable=True)
    if prev_attempt not in (None, 1, 2):
        raise _MalformedRow(f"prev_attempt {prev_attempt!r}")
    previous_state = state("prev_state", nullable=True)
    # The catch-up acts on it: a value this package never writes is not guessed at.
    deployed_ms = row.get("deployed_ms")
    if deployed_ms is not None and (not _is_int(deployed_ms) or deployed_ms < 0):
        raise _MalformedRow(f"deployed_ms {deployed_ms!r}")
    assert instant is not None and current is not None and token is not None
    try:
        return LeaseRow(
            name=row["name"],
            instant=None if instant == NEVER else _from_seconds(instant),
            attempt=attempt,
            state=current,
            token=token,
            holder=holder,
            expires_ms=expires_ms,
            skipped_through=None if skipped_through is None else _from_seconds(skipped_through),
            prev_instant=(
                None
                if prev_instant is None or prev_instant == NEVER
                else _from_seconds(prev_instant)
            ),
            prev_state=previous_state,
            prev_attempt=prev_attempt,
            spec=_text_or_none(row.get("spec")),
            last_start=_ms_or_none(row.get("last_start_ms")),
            last_end=_ms_or_none(row.get("last_end_ms")),
            last_success=_ms_or_none(row.get("last_success_ms")),
            last_outcome=_text_or_none(row.get("last_outcome")),
            last_error=_text_or_none(row.get("last_error")),
            failures=int(row.get("failures") or 0) if _is_int(row.get("failures") or 0) else 0,
            paused=_ms_or_none(row.get("paused_ms")),
            paused_by=_text_or_none(row.get("paused_by")),
            pause_reason=_text_or_none(row.get("pause_reason")),
            deployed=None if deployed_ms is None else _EPOCH + deployed_ms * _MS,
            due=_seconds_or_none(row.get("due_s")),
            spec_changed=_ms_or_none(row.get("spec_ms")),
            acked_through=_seconds_or_none(row.get("acked_s")),
            acked=_ms_or_none(row.get("acked_ms")),
            acked_by=_text_or_none(row.get("acked_by")),
            ack_reason=_text_or_none(row.get("ack_reason")),
            committed=_ms_or_none(row.get("committed_ms")),
        )
    except OverflowError as exc:  # an epoch past datetime's range
        raise _MalformedRow(str(exc)) from None


def _seconds_or_none(value: object) -> datetime | None:
    """Epoch seconds as a datetime; anything else (or out of range) as ``None``."""
    if not _is_int(value):
        return None
    try:
        return _EPOCH + value * _SECOND
    except OverflowError:
        return None


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _ms_or_none(value: object) -> datetime | None:
    """Epoch milliseconds as a datetime; anything else (or out of range) as ``None``."""
    if not _is_int(value):
        return None
    try:
        return _EPOCH + value * _MS
    except OverflowError:
        return None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_rows(
    key: str, records: list[dict[str, Any]], *columns: sa.Column[Any]
) -> sa.TableValuedAlias:
    """PostgreSQL: ``records`` as the rows of ``json_to_recordset`` over one JSON text
    parameter, typed as ``columns`` (each record keyed by their names).

    Thousands of pairs or history rows in one parameter whose text is the same at any
    count. Dumped by `json.dumps` (C), not as arrays: psycopg dumps an array
    element by element in Python, and a history row is eleven of them (10,000 rows:
    30 → 17 µs per round for finish and history together). Every value is a string
    (checked storable: no NUL), an int or ``None``.
    """
    text = sa.bindparam(key, json.dumps(records), type_=sa.Text(), unique=True)
    return (
        sa.func.json_to_recordset(sa.cast(text, postgresql.JSON()))
        .table_valued(*(sa.column(column.name, column.type) for column in columns))
        .render_derived(with_types=True)
    )


def _json_recordset(key: str, *columns: sa.Column[Any]) -> sa.TableValuedAlias:
    """PostgreSQL: `_json_rows` with the JSON text bound when the statement runs (the
    parameter ``key``), so that a statement built on it once is compiled once and its
    text parsed once by the driver, at any count of rows."""
    text = sa.bindparam(key, type_=sa.Text())
    return (
        sa.func.json_to_recordset(sa.cast(text, postgresql.JSON()))
        .table_valued(*(sa.column(column.name, column.type) for column in columns))
        .render_derived(with_types=True)
    )


def _names(names: Iterable[str]) -> list[str]:
    """Validate names; return them once each, in their first order."""
    if isinstance(names, str):
        raise TypeError("names must be a collection of names, not a single string")
    unique: dict[str, None] = {}
    valid = _VALID_NAMES
    for name in names:
        if name in valid:  # checked before (a str: only str hash equal to a str)
            unique[name] = None
            continue
        if not isinstance(name, str) or not 0 < len(name) <= NAME_LENGTH:
            raise ValueError(
                f"a lease name must be a string of 1 to {NAME_LENGTH} characters, not {name!r}"
            )
        if name != name.strip():
            # MySQL and MariaDB ignore trailing spaces when comparing strings, so
            # "job " would share the lease of "job".
            raise ValueError(f"a lease name must not start or end with whitespace: {name!r}")
        problem = unstorable(name)
        if problem is not None:
            # Refused before any statement: in the batch, it would fail every name.
            raise ValueError(f"lease name {name!r} {problem}")
        unique[name] = None
        if len(valid) < _VALID_NAMES_MAX and type(name) is str:
            valid.add(name)
    return list(unique)


#: Names `_names` found valid, not checked again: every claim and every end names
#: them again (10,000 names each instant at scale). Bounded: past it, names are checked
#: each time, as before.
_VALID_NAMES: set[str] = set()
_VALID_NAMES_MAX = 100_000


def _check_token(token: int) -> int:
    if type(token) is int and 0 <= token < _TOKEN_LIMIT:  # the common case, at once
        return token
    if not _is_int(token) or not 0 <= token < _TOKEN_LIMIT:
        raise ValueError(f"a token must be an integer in [0, 2**63), not {token!r}")
    return token


def _new_token() -> int:
    # Never 0, the token of a row no one has claimed yet.
    return secrets.randbelow(_TOKEN_LIMIT - 1) + 1


def _require_aware(when: datetime, what: str) -> None:
    if not isinstance(when, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(when).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime (UTC), not naive {when!r}")


def _instant_seconds(instant: datetime) -> int:
    _require_aware(instant, "instant")
    if instant.microsecond:
        raise ValueError(f"an instant has whole seconds, not {instant.isoformat()}")
    return (instant - _EPOCH) // _SECOND


def _seconds_floor(when: datetime, what: str) -> int:
    if type(when) is not datetime or when.tzinfo is not UTC:  # the common case checked at once
        _require_aware(when, what)
    return (when - _EPOCH) // _SECOND


def _to_ms(now: datetime) -> int:
    _require_aware(now, "the clock's now")
    return (now - _EPOCH) // _MS


def _from_seconds(epoch: int) -> datetime:
    return _EPOCH + timedelta(seconds=epoch)
