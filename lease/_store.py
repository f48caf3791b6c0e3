"""Every statement that reads or writes the lease table.

A lease is named by a string and claimed for an *instant* (an aware UTC datetime with
whole seconds). The table keeps one row per name: the latest instant claimed, which run
of it that is (attempt 1, or 2 for a second run), how it stands (:class:`LeaseState`),
the fencing token of the latest claim, who holds the lease and until when.

The lease clock
    Lease times are epoch milliseconds. Without a ``clock``, "now" is read in SQL from
    the database's own clock, once per statement, so replicas whose clocks disagree
    still agree on who holds a lease. With a ``clock`` (a test's fake clock), "now" is
    that clock's reading, bound into the statement.

The rules, with their boundaries
    - A lease is *free* when ``expires_ms IS NULL`` or ``expires_ms <= now``: at
      ``now == expires_ms`` it is free. It is *held* while ``expires_ms > now``.
    - A claim of instant ``t`` succeeds for a name when its lease is free and the row's
      recorded instant is strictly older than ``t`` (an instant is claimed at most once
      as a first run). It sets ``expires_ms = now + ttl``.
    - A renewal, a give-back and a finish need the current token: once another claim
      replaced it, the old holder's writes do nothing (fencing). A renewal also needs
      the lease still held (``expires_ms > now``); a lease that expired is lost even if
      nobody has claimed it yet.
    - A round is *cut short* when its row has ``attempt == 1``, state ``running`` or
      ``cut``, and a free lease: given back, or running with an expired lease (its
      process died, or its end could not be recorded).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import math
import secrets
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypeGuard

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect, Engine, RowMapping
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ._engine import SQLITE_BEGIN_OPTION, refuse_sqlite_memory
from ._exceptions import UnsupportedDatabase, translate_errors
from ._records import (
    NOT_COUNTED,
    Ending,
    ReplicaRow,
    RoundRow,
    bounded_error,
    jobs_json,
    prune_statement,
    replica_from,
    round_from,
    round_values,
)
from ._schema import (
    NAME_LENGTH,
    NEVER,
    REASON_LENGTH,
    lease_table,
    replica_table,
    round_table,
    trigger_table,
)
from ._text import check_holder, unstorable

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "DEFAULT_STATEMENT_TIMEOUT",
    "DEFAULT_TTL",
    "SUPPORTED_DIALECTS",
    "Claim",
    "CutShort",
    "LeaseRow",
    "LeaseState",
    "LeaseStore",
    "LeaseWrite",
    "Survey",
    "WriteKind",
    "check_dialect",
]

logger = logging.getLogger("lease")

#: A lease's time-to-live, in seconds, unless the store is given another.
DEFAULT_TTL: Final = 15.0

#: How long, in seconds, a statement of a store may run or wait for a lock before it
#: gives up, unless the store is given another bound. A healthy lease statement takes
#: milliseconds and waits only for other lease statements, each bounded alike; past
#: this, the database counts as unavailable for the operation, so a stuck statement
#: cannot hold the scheduler's control thread while renewals fall due (every 5 s; a
#: lease is lost after 10 s without one).
DEFAULT_STATEMENT_TIMEOUT: Final = 5.0

#: Callbacks told of the lease writes to a database, by database (see LeaseStore.watch).
_WATCHERS: dict[str, list[Callable[[LeaseWrite], None]]] = {}
_WATCH_LOCK = threading.Lock()

#: The furthest, in seconds, an instant may lie past the lease clock's now to be claimed.
#: Replicas' clocks must agree to within a schedule's granularity (the seed); one running
#: further ahead than this would claim instants the others have not reached yet, and
#: their own claims would then win nothing until real time caught up.
CLAIM_AHEAD_LIMIT: Final = 5.0

#: Dialect names (``engine.dialect.name``) that can carry leases.
SUPPORTED_DIALECTS: Final = ("postgresql", "mysql", "mariadb", "sqlite")

# Past this many names, read() and find_cut_short() read the whole table and keep the
# wanted names client side, instead of sending an IN list of that many parameters
# (the table holds one small row per job; a deployment has hundreds, not millions).
_IN_LIST_LIMIT: Final = 500

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_SECOND: Final = timedelta(seconds=1)
_TOKEN_LIMIT: Final = 2**63

_t = lease_table
_h = round_table
_p = replica_table
_q = trigger_table


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
    #: this release registers the name (:meth:`LeaseStore.ensure` then fills it).
    deployed: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """A lease claimed for one instant: the caller now runs that round."""

    name: str
    instant: datetime
    #: 1 for a first run, 2 for a second run (:meth:`LeaseStore.claim_rerun`).
    attempt: int
    #: The fencing token: pass it to renew/give_back/finish/holds.
    token: int
    #: The round this claim gave up, as ``(instant, attempt)``, when the row's previous
    #: round was unfinished (``running`` or ``cut``); ``None`` otherwise.
    superseded: tuple[datetime, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimBatch:
    """What one :meth:`LeaseStore.claim_batch` won: first runs of one instant, all under
    one new token (drawn once per call).

    Thousands of names are claimed together at scale: one value for all of them, not a
    :class:`Claim` each (:meth:`claims` makes those).
    """

    instant: datetime
    #: The fencing token of every lease claimed (0 when none was).
    token: int
    #: The names claimed, in the order they were asked for.
    names: tuple[str, ...]
    #: The names whose row's previous round was unfinished (``running`` or ``cut``),
    #: each with the round the claim gave up, as ``(instant, attempt)``.
    superseded: Mapping[str, tuple[datetime, int]]

    def claims(self) -> list[Claim]:
        """One :class:`Claim` (attempt 1) per name claimed, in order."""
        return [
            Claim(
                name=name,
                instant=self.instant,
                attempt=1,
                token=self.token,
                superseded=self.superseded.get(name),
            )
            for name in self.names
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class CutShort:
    """A round cut short, which may run a second time (see :meth:`LeaseStore.claim_rerun`)."""

    name: str
    instant: datetime
    #: ``True`` if its holder gave the lease back (state ``cut``); ``False`` if the lease
    #: expired under a round still marked running (its holder died or lost the database).
    given_back: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Survey:
    """What :meth:`LeaseStore.survey` found: the rounds cut short, and when the next one
    may appear without another write (the earliest expiry of a lease held now)."""

    cut_short: list[CutShort]
    #: The earliest ``expires_ms`` of a first round still held, as a lease-clock time;
    #: ``None`` if no such lease is held.
    next_expiry: datetime | None


class WriteKind(enum.Enum):
    """What a write did to the leases it names (see :class:`LeaseWrite`)."""

    #: Claimed or renewed: held until ``expires_ms``.
    HELD = "held"
    #: Their rounds ran to their end: free, and nothing left to run a second time.
    RELEASED = "released"
    #: Given back by a round cut short: free now, and owed a second run.
    GIVEN_BACK = "given_back"
    #: A round was requested now (run-now, see :class:`lease.Triggers`): ``leases``
    #: holds ``(name, 0)``; a sweep takes it.
    REQUESTED = "requested"


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseWrite:
    """A write to the leases, as told to :meth:`LeaseStore.watch`'s callbacks."""

    kind: WriteKind
    #: The ``(name, token)`` pairs written.
    leases: tuple[tuple[str, int], ...]
    #: For :attr:`WriteKind.HELD`: when the leases expire (epoch ms on the lease clock),
    #: or ``None`` when the store reads the database's clock and cannot tell.
    expires_ms: int | None = None
    #: For a claim: the instant claimed (epoch seconds); ``None`` for a renewal.
    instant: int | None = None


def check_dialect(bind: Engine | Connection | Dialect) -> None:
    """Refuse a database that cannot carry leases.

    Raises:
        UnsupportedDatabase: the dialect is not one of :data:`SUPPORTED_DIALECTS`, or
            the engine or connection is on an in-memory SQLite database (see
            :func:`~lease.create_engine`); a bare dialect is judged by its name alone.
    """
    dialect = bind if isinstance(bind, Dialect) else bind.dialect
    if dialect.name not in SUPPORTED_DIALECTS:
        raise UnsupportedDatabase(
            f"the {dialect.name!r} database cannot carry leases; "
            "supported are PostgreSQL, MySQL/MariaDB and SQLite"
        )
    if isinstance(bind, Engine):
        refuse_sqlite_memory(bind.url)
    elif isinstance(bind, Connection):
        refuse_sqlite_memory(bind.engine.url)


class _db_now_ms(FunctionElement[int]):  # lower case, like the SQL functions it renders
    """The database clock's "now" in epoch milliseconds, once per statement."""

    type = sa.BigInteger()
    inherit_cache = True
    name = "lease_now_ms"


# statement_timestamp(), not clock_timestamp(): one value for the whole statement, so the
# "is it free" test and the new expiry in one UPDATE read the same now (clock_timestamp()
# would be read again for each row).
@compiles(_db_now_ms, "postgresql")
def _now_ms_postgresql(element: _db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000) AS BIGINT)"


# UTC_TIMESTAMP is fixed for the statement and needs no time zone conversion, unlike
# UNIX_TIMESTAMP(NOW(3)), which reads NOW in the session's zone and is ambiguous in the
# hour a daylight-saving change repeats.
@compiles(_db_now_ms, "mysql")
@compiles(_db_now_ms, "mariadb")
def _now_ms_mysql(element: _db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"


# 'now' is fixed for the statement (one sqlite3_step) and kept in whole milliseconds;
# ROUND undoes the floating point error of the Julian day arithmetic.
@compiles(_db_now_ms, "sqlite")
def _now_ms_sqlite(element: _db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"


class _MalformedRow(ValueError):
    pass


class LeaseStore:
    """The lease table of one database, read and written on the lease clock.

    Every operation is one statement, or — where the dialect cannot return rows from an
    UPDATE (MySQL, MariaDB; told by ``dialect.update_returning``) — the UPDATE and a
    SELECT of what it wrote in one short transaction. See the module documentation for
    the rules and their exact boundaries.

    Args:
        engine: the database. Not disposed by the store: the caller owns it.
        clock: returns "now" as an aware datetime; ``None`` reads the database's clock.
        ttl: a claimed or renewed lease's time-to-live, in seconds (> 0).
        statement_timeout: how long, in seconds (> 0), a statement of the store may run
            or wait for a lock before it gives up with :class:`DatabaseUnavailable`;
            :data:`DEFAULT_STATEMENT_TIMEOUT` by default. Applied inside the store's own
            transactions only (see :meth:`_transaction`): statements that jobs run on
            the same engine are never bounded. Whole seconds, rounded up, on
            MariaDB/MySQL; SQLite's bound is the engine's busy timeout instead.
        claim_ahead: how far, in seconds, an instant may lie past the lease clock's now
            and still be claimed (:data:`CLAIM_AHEAD_LIMIT`); ``None`` for no limit (a
            store that claims instants of its own choosing, as tests do).

    Raises:
        UnsupportedDatabase: the engine's dialect cannot carry leases.
        ValueError: ``ttl`` or ``statement_timeout`` is not a positive number of seconds,
            or ``claim_ahead`` is negative.

    Every method raises :class:`DatabaseUnavailable` when the database cannot be
    reached, drops the connection, or a statement outlives ``statement_timeout``, and
    :class:`DatabaseError` when it refuses a statement; no SQLAlchemy exception escapes.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], datetime] | None = None,
        ttl: float = DEFAULT_TTL,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
        claim_ahead: float | None = CLAIM_AHEAD_LIMIT,
    ) -> None:
        check_dialect(engine)
        if claim_ahead is not None and not 0 <= claim_ahead < float("inf"):
            raise ValueError(f"claim_ahead must be a number of seconds >= 0, not {claim_ahead!r}")
        if not ttl > 0 or ttl == float("inf"):
            raise ValueError(f"ttl must be a positive number of seconds, not {ttl!r}")
        if not statement_timeout > 0 or statement_timeout == float("inf"):
            raise ValueError(
                f"statement_timeout must be a positive number of seconds, not {statement_timeout!r}"
            )
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        # Who else writes this database in this process (see watch): the URL names it.
        self._key = engine.url.render_as_string(hide_password=True)
        self._clock = clock
        self._ttl_ms = max(1, round(ttl * 1000))
        self._timeout_ms = max(1, round(statement_timeout * 1000))
        self._ahead_ms = None if claim_ahead is None else round(claim_ahead * 1000)
        #: The claim's statement and its RETURNING form, by whether the clock is given
        #: (see _claim_statement).
        self._claim_statements: dict[bool, tuple[sa.Update, sa.Update]] = {}
        if not event.contains(engine, "checkout", _unbind_for_others):
            event.listen(engine, "checkout", _unbind_for_others)

    @property
    def engine(self) -> Engine:
        """The engine the store was given."""
        return self._engine

    @property
    def ttl(self) -> float:
        """A claimed or renewed lease's time-to-live, in seconds."""
        return self._ttl_ms / 1000

    @property
    def statement_timeout(self) -> float:
        """How long, in seconds, a statement of the store may wait before giving up."""
        return self._timeout_ms / 1000

    def check_dialect(self) -> None:
        """Refuse a database that cannot carry leases (see :func:`check_dialect`)."""
        check_dialect(self._engine)

    def now_ms(self) -> int:
        """Read the lease clock: epoch milliseconds (a query unless a clock was given)."""
        if self._clock is not None:
            return _to_ms(self._clock())
        with translate_errors("read the lease clock"), self._transaction(read=True) as conn:
            value = conn.execute(sa.select(_db_now_ms())).scalar_one()
        return int(value)

    def ensure(self, names: Iterable[str], *, specs: Mapping[str, str] | None = None) -> None:
        """Insert a row for each name that has none: never claimed, state ``new``,
        deployed now (``deployed_ms``, on the lease clock: the name's first deployment).

        Existing rows are left as they are, but for their ``spec`` when ``specs`` gives
        one (what the caller registered under the name, shown by status tools): the
        latest caller's spec wins; and for a ``deployed_ms`` left NULL (a row written
        before revision 0005, or by an older release's replica since), which becomes now:
        the name is deployed by then for sure. A deployment on record never moves. One
        statement (run once per batch of parameters), whatever the number of names.

        Raises:
            ValueError: a name is empty, longer than 200 characters, or starts or ends
                with whitespace (MySQL would match "job " to "job").
            TypeError: ``names`` is a single string.
        """
        wanted = _names(names)
        if wanted:
            self._ensure(wanted, specs)

    def _ensure(self, wanted: list[str], specs: Mapping[str, str] | None) -> None:
        defaults: dict[str, Any] = {
            "instant": NEVER,
            "attempt": 1,
            "state": LeaseState.NEW.value,
            "token": 0,
            # One now for the whole statement (the database's, or the given clock's).
            "deployed_ms": self._now(),
        }
        params: list[dict[str, Any]] = [{"name": name} for name in wanted]
        if specs is not None:
            defaults["spec"] = sa.bindparam("spec")
            params = [{"name": name, "spec": specs.get(name)} for name in wanted]
        dialect = self._engine.dialect.name
        stmt: sa.Executable
        if dialect in ("postgresql", "sqlite"):
            insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_t)
            insert = insert.values(defaults)
            deployed = sa.func.coalesce(_t.c.deployed_ms, insert.excluded.deployed_ms)
            if specs is None:
                # Only a row whose deployment is unknown is written to.
                stmt = insert.on_conflict_do_update(
                    index_elements=[_t.c.name],
                    set_={"deployed_ms": deployed},
                    where=_t.c.deployed_ms.is_(None),
                )
            else:
                stmt = insert.on_conflict_do_update(
                    index_elements=[_t.c.name],
                    set_={"spec": insert.excluded.spec, "deployed_ms": deployed},
                )
        else:
            # Not INSERT IGNORE: IGNORE also turns data errors into warnings, so a value
            # the column cannot hold would be truncated and stored instead of refused.
            my = mysql.insert(_t).values(defaults)
            updates: dict[str, Any] = {
                "deployed_ms": sa.func.coalesce(_t.c.deployed_ms, my.inserted.deployed_ms)
            }
            if specs is not None:
                updates["spec"] = my.inserted.spec
            stmt = my.on_duplicate_key_update(updates)
        with translate_errors("ensure leases"), self._transaction() as conn:
            conn.execute(stmt, params)

    def missing(self, names: Iterable[str]) -> list[str]:
        """Return the names, among ``names``, that have no row (in the order given).

        One query reading names only; :meth:`ensure` recreates them.
        """
        wanted = _names(names)
        if not wanted:
            return []
        stmt = sa.select(_t.c.name)
        if len(wanted) <= _IN_LIST_LIMIT:
            stmt = stmt.where(_t.c.name.in_(wanted))
        with translate_errors("read lease names"), self._transaction(read=True) as conn:
            present = set(conn.execute(stmt).scalars())
        return [name for name in wanted if name not in present]

    def read(self, names: Iterable[str]) -> dict[str, LeaseRow]:
        """Read the rows of ``names``, by name; names without a row are left out.

        A malformed row (a state or attempt this package never writes, a value of the
        wrong type, a name differing from the one asked for) is logged as a warning
        naming it and left out; it never raises.
        """
        wanted = _names(names)
        if not wanted:
            return {}
        stmt = sa.select(_t)
        filtered = len(wanted) <= _IN_LIST_LIMIT
        if filtered:
            stmt = stmt.where(_t.c.name.in_(wanted))
        with translate_errors("read leases"), self._transaction(read=True) as conn:
            rows = conn.execute(stmt).mappings().all()
        found: dict[str, LeaseRow] = {}
        wanted_set = set(wanted)
        for row in rows:
            if row["name"] not in wanted_set:
                if filtered:
                    # Matched by the database's collation (e.g. trailing spaces on
                    # MySQL) but not the name asked for: edited by hand.
                    logger.warning(
                        "lease row %r does not match the names asked for; skipped", row["name"]
                    )
                continue
            try:
                found[row["name"]] = _parse_row(row)
            except _MalformedRow as exc:
                logger.warning("lease row %r is malformed (%s); skipped", row["name"], exc)
        return found

    def holders(self, since: datetime) -> dict[str, datetime]:
        """The holders of the latest claims at instants ``since`` or later (whole seconds,
        rounded down), each with the latest instant it claimed. One query for the whole
        table, whatever the number of names.

        Each row keeps only its latest claim, so a holder whose every row was claimed
        again by others since does not appear. A row whose instant is not a number is
        left out (a hand edit; :meth:`read` logs it).
        """
        stmt = (
            sa.select(_t.c.holder, sa.func.max(_t.c.instant))
            .where(
                _t.c.instant >= _seconds_floor(since, "since"),
                _t.c.holder.is_not(None),
                sa.not_(_t.c.name.startswith(" ")),  # chores' rows (see take_turn)
            )
            .group_by(_t.c.holder)
        )
        with translate_errors("read the lease holders"), self._transaction(read=True) as conn:
            rows = conn.execute(stmt).all()
        return {
            holder: _from_seconds(epoch)
            for holder, epoch in rows
            if isinstance(holder, str) and _is_int(epoch) and epoch >= 0
        }

    def read_all(self) -> dict[str, LeaseRow]:
        """Read every row, by name (malformed ones logged and left out, as :meth:`read`;
        the rows of chores, see :meth:`take_turn`, left out too)."""
        with translate_errors("read leases"), self._transaction(read=True) as conn:
            rows = conn.execute(sa.select(_t)).mappings().all()
        found: dict[str, LeaseRow] = {}
        for row in rows:
            if row["name"].startswith(" "):
                continue  # a chore's row (see take_turn), not a lease of a caller's
            try:
                found[row["name"]] = _parse_row(row)
            except _MalformedRow as exc:
                logger.warning("lease row %r is malformed (%s); skipped", row["name"], exc)
        return found

    def rounds(
        self,
        name: str,
        *,
        limit: int,
        outcomes: Collection[str] | None = None,
        since_ms: int | None = None,
    ) -> list[RoundRow]:
        """The latest ``limit`` rounds of ``name`` in the history, newest first.

        ``outcomes`` keeps those outcomes only; ``since_ms`` those that ended at or after
        it (epoch milliseconds). One query, on the index of ``(name, id)``.
        """
        (wanted,) = _names([name])
        stmt = sa.select(_h).where(_h.c.name == wanted).order_by(_h.c.id.desc()).limit(limit)
        if outcomes is not None:
            stmt = stmt.where(_h.c.outcome.in_(list(outcomes)))
        if since_ms is not None:
            stmt = stmt.where(_h.c.ended_ms >= since_ms)
        with translate_errors("read the history"), self._transaction(read=True) as conn:
            rows = conn.execute(stmt).mappings().all()
        return [round_from(row) for row in rows]

    def known(self, name: str) -> bool:
        """Whether ``name`` has a lease row, a round in the history, or a replica that
        registered it (a per-instance job has only the last). One query."""
        (wanted,) = _names([name])
        in_leases = sa.select(_t.c.name).where(_t.c.name == wanted)
        in_rounds = sa.select(_h.c.name).where(_h.c.name == wanted).limit(1)
        with translate_errors("look a name up"), self._transaction(read=True) as conn:
            if conn.execute(sa.union_all(in_leases, sa.select(in_rounds.subquery()))).first():
                return True
            replicas = conn.execute(sa.select(_p)).mappings().all()
        return any(wanted in replica_from(row).jobs for row in replicas)

    def replicas(self, *, seen_since_ms: int) -> list[ReplicaRow]:
        """The holders on record last seen at or after ``seen_since_ms`` (lease clock)."""
        stmt = sa.select(_p).where(_p.c.seen_ms >= seen_since_ms).order_by(_p.c.holder)
        with translate_errors("read replicas"), self._transaction(read=True) as conn:
            return [replica_from(row) for row in conn.execute(stmt).mappings()]

    def record_replica(self, replica: ReplicaRow) -> None:
        """Put ``replica`` on record as seen now (lease clock; its ``seen`` is ignored):
        insert, or refresh. One statement. :meth:`survey` can do it on its way."""
        stmt = self._replica_upsert(replica)
        with translate_errors("record a replica"), self._transaction() as conn:
            conn.execute(stmt)

    def _replica_upsert(self, replica: ReplicaRow) -> sa.Insert:
        check_holder(replica.holder)
        values: dict[str, Any] = {
            "holder": replica.holder,
            "host": replica.host[:255],
            "pid": replica.pid,
            "version": replica.version[:64],
            "started_ms": _to_ms(replica.started),
            "seen_ms": self._now(),
            "jobs": jobs_json(replica.jobs, replica.policies),
        }
        changed = ("host", "pid", "version", "started_ms", "seen_ms", "jobs")
        dialect = self._engine.dialect.name
        if dialect in ("postgresql", "sqlite"):
            insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_p)
            insert = insert.values(values)
            return insert.on_conflict_do_update(
                index_elements=[_p.c.holder],
                set_={column: insert.excluded[column] for column in changed},
            )
        my = mysql.insert(_p).values(values)
        return my.on_duplicate_key_update({column: my.inserted[column] for column in changed})

    def prune(
        self, *, days: float, per_name: int, replicas_gone: float, timeout: float = 60.0
    ) -> tuple[int, int]:
        """Delete the history's rounds that ended more than ``days`` ago and each name's
        rounds past its ``per_name`` newest (one statement), the replicas not seen for
        ``replicas_gone`` seconds (one more), and the requests for a round now made more
        than ``days`` ago (one more: however they stand, they can no longer run, see
        :data:`lease.REQUEST_TTL`), in one transaction.

        Ranking a name's rounds reads the whole history (about 3 s for a million rows
        on a busy 2-core machine), so these statements have a bound of their own,
        ``timeout`` seconds, not :attr:`statement_timeout`.

        Returns:
            How many rounds and replicas were deleted.
        """
        now_ms = self.now_ms()
        cutoff = now_ms - round(days * 86_400_000)
        gone = _p.delete().where(_p.c.seen_ms < now_ms - round(replicas_gone * 1000))
        bound = max(1, round(timeout * 1000))
        with (
            translate_errors("prune the history"),
            self._transaction(timeout_ms=bound) as conn,
        ):
            rounds = conn.execute(prune_statement(cutoff_ms=cutoff, per_name=per_name)).rowcount
            replicas = conn.execute(gone).rowcount
            conn.execute(_q.delete().where(_q.c.requested_ms < cutoff))
        return rounds, replicas

    def claim(self, names: Iterable[str], instant: datetime, holder: str) -> list[Claim]:
        """Claim ``instant`` as a first run, for every name whose lease allows it.

        A name is claimed when its lease is free (``expires_ms`` NULL or ``<= now``), its
        recorded instant is strictly older than ``instant``, and ``instant`` is no more
        than ``claim_ahead`` seconds (:data:`CLAIM_AHEAD_LIMIT`) past the lease clock's
        ``now``: a replica whose clock runs far ahead must not claim instants the others
        have not reached (its claims win nothing; the others run the instants on time).
        A paused row (``paused_ms`` set, see :meth:`set_paused`) is never claimed.
        Each claimed row gets ``attempt = 1``, state ``running``, a new random token (one
        for this call), ``holder`` and ``expires_ms = now + ttl``, and keeps what it held
        before in ``prev_*``. Names without a row are never claimed (see :meth:`ensure`).

        Returns:
            One :class:`Claim` per name claimed, in the order of ``names``; with
            ``superseded`` set when the row's previous round was unfinished.

        Raises:
            ValueError: ``instant`` is not an aware datetime with whole seconds, a name or
                ``holder`` is empty or too long.
        """
        return self.claim_batch(names, instant, holder).claims()

    def claim_batch(self, names: Iterable[str], instant: datetime, holder: str) -> ClaimBatch:
        """:meth:`claim`, with what was won as one :class:`ClaimBatch`: the same
        statement and rules, without a :class:`Claim` made per name.

        Raises:
            ValueError: as :meth:`claim`.
        """
        wanted = _names(names)
        epoch = _instant_seconds(instant)
        check_holder(holder)
        if not wanted:
            return ClaimBatch(instant=instant, token=0, names=(), superseded={})
        return self._claim(wanted, epoch, holder)

    def take_turn(
        self, chore: str, instant: datetime, holder: str, *, create: bool = True
    ) -> bool:
        """Claim ``instant`` of a chore that one holder at a time does (pruning): ``True``
        for the one holder whose claim won.

        The chore's row is named ``" " + chore`` — a name no caller of :meth:`claim`
        can use (it starts with whitespace) — and, with ``create``, made when missing
        (one more statement). Its lease is never finished: it expires, and the next
        instant is claimed as usual.
        """
        epoch = _instant_seconds(instant)
        check_holder(holder)
        name = f" {chore}"
        if not 1 < len(name) <= NAME_LENGTH or name != f" {chore.strip()}":
            raise ValueError(f"a chore is a name without whitespace at its ends, not {chore!r}")
        if create:
            self._ensure([name], None)
        return bool(self._claim([name], epoch, holder).names)

    def _claim(self, wanted: list[str], epoch: int, holder: str) -> ClaimBatch:
        token = _new_token()
        now_ms = self._clock_ms()
        stmt, returning = self._claim_statement(given_clock=now_ms is not None)
        params: dict[str, Any] = {
            "claim_names": json.dumps(wanted) if self._postgres else wanted,
            "claim_epoch": epoch,
            "claim_token": token,
            "claim_holder": holder,
            "claim_ttl": self._ttl_ms,
        }
        if self._ahead_ms is not None:
            params["claim_reached"] = epoch * 1000 - self._ahead_ms
        if now_ms is not None:
            params["claim_now"] = now_ms
        with translate_errors("claim leases"), self._transaction() as conn:
            # Rows as tuples: (name, prev_instant, prev_state, prev_attempt). The instant,
            # the attempt and the token are the ones just written.
            rows = self._update_returning(
                conn,
                stmt,
                _BATCH_COLUMNS,
                # Built only where it is used (no RETURNING): an IN of thousands of names.
                lambda: (_t.c.token == token, _t.c.name.in_(wanted)),
                returning=returning,
                tuples=True,
                **params,
            )
            # Before the commit: a claimer that waited on these rows sees who took them.
            if self._watched():
                self._held([(row[0], token) for row in rows], now_ms, epoch)
        instant = _from_seconds(epoch)
        superseded: dict[str, tuple[datetime, int]] = {}
        won: set[str] = set()
        for name, prev_instant, prev_state, prev_attempt in rows:
            won.add(name)
            if prev_state in _UNFINISHED:
                previous = _previous_round(name, prev_instant, prev_attempt)
                if previous is not None:
                    superseded[name] = previous
        names = tuple(name for name in wanted if name in won)
        return ClaimBatch(instant=instant, token=token, names=names, superseded=superseded)

    def _claim_statement(self, *, given_clock: bool) -> tuple[sa.Update, sa.Update]:
        """The claim's UPDATE, built once per store (and clock kind): every value is a
        bind parameter (``claim_*``), so an instant's claim neither builds the statement
        nor computes its cache key again (SQLAlchemy memoizes it on the object): about
        half a millisecond of CPU per claim, in the path from the instant to the rounds.
        Returns the statement and its ``RETURNING`` form.
        """
        cached = self._claim_statements.get(given_clock)
        if cached is not None:
            return cached
        now: sa.ColumnElement[int] = (
            sa.bindparam("claim_now", type_=sa.BigInteger()) if given_clock else _db_now_ms()
        )
        reached = (
            sa.true()
            if self._ahead_ms is None
            else sa.bindparam("claim_reached", type_=sa.BigInteger()) <= now
        )
        if self._postgres:
            # The names as one JSON text, made an array once (an InitPlan) for the index
            # scan: psycopg dumps an array parameter element by element in Python, which
            # for 10,000 names was most of a claim's own CPU.
            names = sa.cast(sa.bindparam("claim_names", type_=sa.Text()), postgresql.JSON())
            listed = sa.select(sa.func.json_array_elements_text(names)).scalar_subquery()
            named = _t.c.name == sa.any_(sa.func.array(listed))
        else:
            named = _t.c.name.in_(sa.bindparam("claim_names", expanding=True))
        epoch = sa.bindparam("claim_epoch", type_=sa.BigInteger())
        stmt = (
            _t.update()
            .where(named, _t.c.instant < epoch, _is_free(now), reached, _t.c.paused_ms.is_(None))
            .ordered_values(
                # MySQL assigns left to right, each assignment seeing the previous ones:
                # copy the old values before overwriting them.
                (_t.c.prev_instant, _t.c.instant),
                (_t.c.prev_state, _t.c.state),
                (_t.c.prev_attempt, _t.c.attempt),
                (_t.c.instant, epoch),
                (_t.c.attempt, 1),
                (_t.c.state, LeaseState.RUNNING.value),
                (_t.c.token, sa.bindparam("claim_token", type_=sa.BigInteger())),
                (_t.c.holder, sa.bindparam("claim_holder", type_=sa.String())),
                (_t.c.expires_ms, now + sa.bindparam("claim_ttl", type_=sa.BigInteger())),
                (_t.c.last_start_ms, now),
            )
        )
        built = (stmt, stmt.returning(*_BATCH_COLUMNS))
        self._claim_statements[given_clock] = built
        return built

    def claim_rerun(self, name: str, instant: datetime, holder: str) -> Claim | None:
        """Claim the second run (attempt 2) of ``instant``, a round cut short.

        Succeeds only when the row's instant is ``instant``, its attempt is 1, its state
        is ``running`` or ``cut`` (not ``done``), its lease is free, and it is not paused.
        A new token is drawn; ``superseded`` is ``None`` (the round is the same one).

        Returns:
            The claim, or ``None`` when the rule refuses it (another replica re-ran it
            first, it finished, a later instant was claimed, or its lease is held).
        """
        (wanted,) = _names([name])
        epoch = _instant_seconds(instant)
        check_holder(holder)
        token = _new_token()
        now_ms = self._clock_ms()
        now = self._now(now_ms)
        stmt = (
            _t.update()
            .where(
                _t.c.name == wanted,
                _t.c.instant == epoch,
                _t.c.attempt == 1,
                _t.c.state.in_(_UNFINISHED),
                _is_free(now),
                _t.c.paused_ms.is_(None),
            )
            .ordered_values(
                (_t.c.prev_instant, _t.c.instant),
                (_t.c.prev_state, _t.c.state),
                (_t.c.prev_attempt, _t.c.attempt),
                (_t.c.attempt, 2),
                (_t.c.state, LeaseState.RUNNING.value),
                (_t.c.token, token),
                (_t.c.holder, holder),
                (_t.c.expires_ms, now + self._ttl_ms),
                (_t.c.last_start_ms, now),
            )
        )
        with translate_errors("claim a second run"), self._transaction() as conn:
            rows = self._update_returning(
                conn, stmt, _CLAIM_COLUMNS, lambda: (_t.c.token == token, _t.c.name == wanted)
            )
            self._held([(wanted, token)] if rows else [], now_ms, epoch)
        return _claim_from(rows[0]) if rows else None

    def renew(self, held: Collection[tuple[str, int]], holder: str) -> set[str]:
        """Extend every lease in ``held`` (``(name, token)`` pairs) to ``now + ttl``.

        A lease is renewed only while it is still this holder's, with this token, and
        not expired (``expires_ms > now``; at ``now == expires_ms`` it is lost). One
        statement for all of them; none for an empty ``held``.

        Returns:
            The names renewed; every other name in ``held`` has lost its lease.
        """
        check_holder(holder)
        pairs = [(name, _check_token(token)) for name, token in held]
        _names([name for name, _ in pairs])
        if not pairs:
            return set()
        now_ms = self._clock_ms()
        now = self._now(now_ms)
        held_here = sa.and_(
            self._pair_in(pairs),
            _t.c.holder == holder,
            _t.c.expires_ms > now,
        )
        stmt = self._in_name_order(_t.update(), held_here).values(expires_ms=now + self._ttl_ms)
        # Without RETURNING the SELECT after the UPDATE reuses its condition: a renewed
        # row now expires later, so it still holds; a row that was not renewed had
        # expired or changed hands, and still has, or has another token.
        with translate_errors("renew leases"), self._transaction() as conn:
            rows = self._update_returning(conn, stmt, (_t.c.name,), lambda: (held_here,))
        renewed = {row["name"] for row in rows}
        self._held([pair for pair in pairs if pair[0] in renewed], now_ms)
        return renewed

    def give_back(self, name: str, token: int, *, record: RoundRow | None = None) -> bool:
        """Give back the lease of a round cut short: state ``cut``, lease free at once.

        On record, the round ended ``'cut short'`` — or ``'given up'`` for a second run,
        which counts as one more failure in a row. ``record``, if given, is added to the
        history in the same transaction.

        Returns:
            ``True`` when the row still had ``token`` and was ``running``; ``False``
            when another claim replaced it (or the round already ended).
        """
        (wanted,) = _names([name])
        second = _t.c.attempt == 2
        now = self._now()
        stmt = (
            _t.update()
            .where(_t.c.name == wanted, _t.c.token == _check_token(token), _is_running())
            .values(
                state=LeaseState.CUT.value,
                expires_ms=None,
                last_end_ms=now,
                last_outcome=sa.case((second, "given up"), else_="cut short"),
                failures=sa.case(
                    (second, sa.func.coalesce(_t.c.failures, 0) + 1), else_=_t.c.failures
                ),
            )
        )
        with translate_errors("give back a lease"), self._transaction() as conn:
            given = conn.execute(stmt).rowcount == 1
            if record is not None:
                conn.execute(_h.insert(), [round_values(record)])
        if given:  # after the commit: a sweep it wakes must find it
            self._tell(LeaseWrite(kind=WriteKind.GIVEN_BACK, leases=((wanted, token),)))
        return given

    def finish(
        self,
        name: str,
        token: int,
        *,
        ended: datetime,
        succeeded: bool = True,
        error: str | None = None,
        record: RoundRow | None = None,
    ) -> bool:
        """Record that the round ran to its end at ``ended``; the lease is free at once.

        Sets state ``done`` and ``skipped_through`` to ``ended`` in whole seconds
        (rounded down): every instant up to it that the round overran stays skipped.
        The end is recorded even if the lease expired meanwhile, as long as no other
        claim replaced the token. On record too: the outcome (``succeeded``, or failed
        with ``error``, bounded; a :class:`Ending`'s ``outcome`` word, see
        :data:`~lease.COUNTED_FAILURES`), the end and the last success on the lease
        clock, the failures in a row; and ``record``, if given, is added to the history, all in
        the same transaction.

        Returns:
            ``True`` when the row still had ``token`` and was ``running``; ``False``
            when another claim replaced it (or the round already ended).

        Raises:
            ValueError: ``ended`` is not an aware datetime.
        """
        ending = Ending(
            name=name, token=token, ended=ended, succeeded=succeeded, error=error, record=record
        )
        return (name, token) in self._finish([ending], "finish a lease")

    def finish_many(
        self, ends: Collection[tuple[str, int, datetime] | Ending]
    ) -> set[tuple[str, int]]:
        """:meth:`finish` for many rounds at once: :class:`Ending` values, or
        ``(name, token, ended)`` triples for rounds that succeeded without a record.

        One transaction; one UPDATE per distinct ``ended`` second and outcome (usually
        one), each with the same conditions as :meth:`finish`, then one INSERT of every
        history row given. None for an empty ``ends``. An end with ``retrying`` (an
        attempt followed by another, see :class:`Ending`) keeps its lease: the row stays
        ``running``, its attempt becomes 2, and its history row is added.

        Returns:
            The ``(name, token)`` pairs whose end was recorded; every other one had its
            token replaced by another claim (or had already ended).
        """
        return self._finish(ends, "finish leases")

    def _finish(
        self, ends: Collection[tuple[str, int, datetime] | Ending], action: str
    ) -> set[tuple[str, int]]:
        # Grouped by (ended second, outcome word, retrying).
        groups: dict[tuple[int, str, bool], list[Ending]] = {}
        records: list[dict[str, Any]] = []
        endings: list[Ending] = []
        for end in ends:
            if not isinstance(end, Ending):
                name, token, ended = end
                end = Ending(name=name, token=token, ended=ended)
            endings.append(end)
        _names([end.name for end in endings])  # the batch's names checked in one call
        last: tuple[int, str, bool] | None = None
        group: list[Ending] = []
        for end in endings:
            _check_token(end.token)
            key = (_seconds_floor(end.ended, "ended"), end.word, end.retrying)
            if key != last:  # ends of a batch come mostly in runs of one second and outcome
                group = groups.setdefault(key, [])
                last = key
            group.append(end)
            if end.record is not None:
                records.append(round_values(end.record))
        if not groups:
            return set()
        recorded: set[tuple[str, int]] = set()
        released: set[tuple[str, int]] = set()
        now = self._now()
        with translate_errors(action), self._transaction() as conn:
            for (ended_s, word, retrying), group in groups.items():
                pairs = [(end.name, end.token) for end in group]
                mine = self._pair_in(pairs)
                unique = set(pairs)
                if retrying:
                    # The lease stays held (the keeper renews it through the backoff);
                    # only the attempt moves on, so a cut from now on is given up.
                    stmt = self._in_name_order(_t.update(), sa.and_(mine, _is_running()))
                    if conn.execute(stmt.values(attempt=2)).rowcount == len(unique):
                        recorded |= unique
                        continue
                    again = sa.select(_t.c.name, _t.c.token).where(mine, _is_running())
                    recorded.update((name, int(token)) for name, token in conn.execute(again))
                    continue
                outcome: dict[str, Any]
                if word == "succeeded":
                    outcome = {
                        "last_outcome": "succeeded",
                        "last_success_ms": now,
                        "last_error": None,
                        "failures": 0,
                    }
                else:
                    errors = {end.name: bounded_error(end.error) for end in group}
                    error = sa.case(errors, value=_t.c.name, else_=None)
                    outcome = {"last_outcome": word[:16], "last_error": error}
                    if word in NOT_COUNTED:
                        # An attempt to be retried, or a round never run: the failures in
                        # a row, and the latest failure's error, stay as they are.
                        outcome["last_error"] = sa.func.coalesce(error, _t.c.last_error)
                    else:
                        outcome["failures"] = sa.func.coalesce(_t.c.failures, 0) + 1
                stmt = self._in_name_order(_t.update(), sa.and_(mine, _is_running())).values(
                    state=LeaseState.DONE.value,
                    expires_ms=None,
                    skipped_through=ended_s,
                    last_end_ms=now,
                    **outcome,
                )
                # Every row written (the common case, and the rowcount says so): no row
                # to send back and parse. Otherwise, read which: a token is drawn per
                # claim and ends once, so a row with one of these tokens that is now
                # done was finished here.
                if conn.execute(stmt).rowcount == len(unique):
                    recorded |= unique
                    released |= unique
                    continue
                done = sa.select(_t.c.name, _t.c.token).where(
                    mine,
                    _t.c.state == LeaseState.DONE.value,
                    _t.c.skipped_through == ended_s,
                )
                finished = {(name, int(token)) for name, token in conn.execute(done)}
                recorded |= finished
                released |= finished
            if records:
                self._insert_history(conn, records)
        if released and self._watched():
            self._tell(LeaseWrite(kind=WriteKind.RELEASED, leases=tuple(released)))
        return recorded

    def keep_from_rerun(self, name: str, token: int) -> bool:
        """Mark the running round of ``name`` (``token``) as one never to run again: its
        attempt becomes 2, so once its lease is free the sweep gives it up instead of
        running it a second time (a round that ran past its timeout).

        Returns:
            ``True`` when the row still had ``token`` and was ``running``.
        """
        (wanted,) = _names([name])
        stmt = (
            _t.update()
            .where(_t.c.name == wanted, _t.c.token == _check_token(token), _is_running())
            .values(attempt=2)
        )
        with translate_errors("keep a round from a second run"), self._transaction() as conn:
            return conn.execute(stmt).rowcount == 1

    def find_cut_short(self, names: Iterable[str]) -> list[CutShort]:
        """Find the rounds of ``names`` that were cut short and may run a second time.

        The rule: ``attempt == 1``, state ``running`` or ``cut``, and a free lease
        (``expires_ms`` NULL or ``<= now``). A second run is never returned, nor a round
        that finished, nor one whose lease is still held; and since a later claim
        replaces the row's instant, a superseded round is never returned either.
        One query, whatever the number of names.

        Returns:
            The rounds, sorted by name.
        """
        return self.survey(names).cut_short

    def survey(self, names: Iterable[str], *, replica: ReplicaRow | None = None) -> Survey:
        """:meth:`find_cut_short`, and the earliest expiry of a first round's lease still
        held (the next moment a round of ``names`` may be found cut short without any
        write before it). One query, whatever the number of names.

        With ``replica``, the replica is put on record as seen now too (as
        :meth:`record_replica`), in the same statement on PostgreSQL (a data-modifying
        ``WITH``), in the same transaction elsewhere (two statements)."""
        wanted = _names(names)
        if not wanted:
            if replica is not None:
                self.record_replica(replica)
            return Survey(cut_short=[], next_expiry=None)
        now = self._now()
        stmt = sa.select(
            _t.c.name, _t.c.instant, _t.c.state, _t.c.expires_ms, _is_free(now).label("free")
        ).where(_t.c.attempt == 1, _t.c.state.in_(_UNFINISHED), _t.c.paused_ms.is_(None))
        if len(wanted) <= _IN_LIST_LIMIT:
            stmt = stmt.where(_t.c.name.in_(wanted))
        upsert = None if replica is None else self._replica_upsert(replica)
        if upsert is not None and self._postgres:
            stmt = stmt.add_cte(upsert.returning(_p.c.holder).cte("seen"))
            upsert = None
        read = replica is None
        with translate_errors("find rounds cut short"), self._transaction(read=read) as conn:
            if upsert is not None:
                conn.execute(upsert)
            rows = conn.execute(stmt).all()
        wanted_set = set(wanted)
        found: list[CutShort] = []
        next_ms: int | None = None
        for name, epoch, state, expires_ms, free in rows:
            if name not in wanted_set:
                continue
            if not free:
                if _is_int(expires_ms) and (next_ms is None or expires_ms < next_ms):
                    next_ms = expires_ms
                continue
            try:
                if not _is_int(epoch) or epoch < 0:
                    raise OverflowError
                instant = _from_seconds(epoch)  # OverflowError past datetime's range
            except OverflowError:
                # One row edited to garbage must not fail the sweep of every other job.
                logger.warning("lease row %r is malformed (instant %r); skipped", name, epoch)
                continue
            given_back = state == LeaseState.CUT.value
            found.append(CutShort(name=name, instant=instant, given_back=given_back))
        return Survey(
            cut_short=sorted(found, key=lambda cut: cut.name),
            next_expiry=None if next_ms is None else _EPOCH + next_ms * _MS,
        )

    def watch(self, callback: Callable[[LeaseWrite], None]) -> Callable[[], None]:
        """Call ``callback`` with each :class:`LeaseWrite` that any store of this process
        makes to this store's database, in the writing thread. Returns the function that
        stops it.

        Claims (:attr:`WriteKind.HELD`) are told before their transaction commits, so a
        claimer that waited on those rows learns who took them as soon as it returns;
        ends and give-backs after it commits. A write whose commit fails may have been
        told as held: a watcher must treat a hold as "may be held", never as certain.

        For schedulers on a fake clock, where every replica lives in this process: a
        sweep that found nothing need not run again until a lease is given back or a
        lease told held expires without its end.
        """
        key = self._key
        with _WATCH_LOCK:
            _WATCHERS.setdefault(key, []).append(callback)

        def stop() -> None:
            with _WATCH_LOCK, contextlib.suppress(ValueError):
                _WATCHERS.get(key, []).remove(callback)

        return stop

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

        A paused row is refused by :meth:`claim` and :meth:`claim_rerun` and left out of
        :meth:`survey`'s rounds cut short; a round already running is not touched. On
        resume, ``skipped_through`` is raised to now (in seconds), so the instants skipped
        while paused are never caught up at start-up (the catch-up rule honours it).
        The note is a row of ``cronjob_round`` with ``why`` ``'pause'`` or ``'resume'``,
        outcome ``'paused'`` or ``'resumed'``, ``holder`` = ``by``, ``instant`` = now.

        Raises:
            ValueError: ``by`` is empty or too long, ``reason`` is too long
                (:data:`REASON_LENGTH`), a name is empty or too long.
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
        with translate_errors(f"{verb} jobs"), self._transaction() as conn:
            found = sorted(
                conn.execute(sa.select(_t.c.name).where(*where).with_for_update()).scalars()
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

    def holds(self, connection: Connection, name: str, token: int, *, final: bool = False) -> bool:
        """Tell, inside the caller's transaction, whether ``token`` still holds ``name``.

        True when the row still has ``token`` and ``expires_ms > now``. The row is read
        without a lock, on purpose: a share lock would hold back the renewal statement,
        which renews every lease of a replica at once, for as long as the caller's
        transaction lasts, so one long job transaction could make every round of its
        replica lose its lease. Callers check when their transaction opens and again just
        before it commits (``Round.transaction`` does), which narrows the window in which
        a claim can take the lease to the commit itself.

        ``final=True`` marks that last check: on MariaDB/MySQL it is a locking read
        (``LOCK IN SHARE MODE``), held only until the commit that follows at once,
        because a plain read in a ``REPEATABLE READ`` transaction (those servers'
        default, on an engine you pass in) would see the snapshot of the first check and
        miss a claim committed since.
        """
        stmt = self._holds_statement(name, token, connection.dialect, final=final)
        with translate_errors("check a lease"):
            return connection.execute(stmt).first() is not None

    async def holds_async(
        self, connection: AsyncConnection, name: str, token: int, *, final: bool = False
    ) -> bool:
        """Like :meth:`holds`, on an asyncio connection (``Round.transaction_async``).

        The same statement, awaited: the caller's event loop keeps running meanwhile.
        """
        stmt = self._holds_statement(name, token, connection.dialect, final=final)
        with translate_errors("check a lease"):
            return (await connection.execute(stmt)).first() is not None

    def holds_statement(
        self, name: str, token: int, dialect: Dialect, *, final: bool = False
    ) -> sa.Select[int]:
        """The statement :meth:`holds` runs, for a connection that is not SQLAlchemy's.

        A framework's ORM (Django) runs it inside its own transaction, compiled for
        ``dialect``: the lease is held when it returns a row. ``final`` as for
        :meth:`holds`.
        """
        return self._holds_statement(name, token, dialect, final=final)

    def _holds_statement(
        self, name: str, token: int, dialect: Dialect, *, final: bool
    ) -> sa.Select[int]:
        (wanted,) = _names([name])
        stmt = (
            sa.select(sa.literal(1))
            .select_from(_t)
            .where(
                _t.c.name == wanted,
                _t.c.token == _check_token(token),
                _t.c.expires_ms > self._now(),
            )
        )
        if final and dialect.name in ("mysql", "mariadb"):
            stmt = stmt.with_for_update(read=True)
        return stmt

    # -- helpers -------------------------------------------------------------------

    def _now(self, now_ms: int | None = None) -> sa.ColumnElement[int]:
        """The lease clock's now in SQL: ``now_ms`` if given, else the clock's."""
        if now_ms is None:
            now_ms = self._clock_ms()
        if now_ms is None:
            return _db_now_ms()
        return sa.literal(now_ms, sa.BigInteger())

    def _name_in(self, names: list[str]) -> sa.ColumnElement[bool]:
        """``name IN names``; on PostgreSQL ``name = ANY(:array)``: one parameter, so the
        statement's text and compiled form are the same whatever the count (cached by
        SQLAlchemy and psycopg alike) instead of one placeholder per name."""
        if self._postgres:
            array = sa.bindparam("names", names, type_=postgresql.ARRAY(sa.String()), unique=True)
            return _t.c.name == sa.any_(array)
        return _t.c.name.in_(names)

    def _pair_in(self, pairs: list[tuple[str, int]]) -> sa.ColumnElement[bool]:
        """``(name, token) IN pairs``; on PostgreSQL against the rows of one JSON
        parameter (see :func:`_json_rows`)."""
        if self._engine.dialect.name != "postgresql":
            return sa.tuple_(_t.c.name, _t.c.token).in_(pairs)
        records = [{"name": name, "token": token} for name, token in pairs]
        rows = _json_rows("pairs", records, _t.c.name, _t.c.token)
        return sa.tuple_(_t.c.name, _t.c.token).in_(sa.select(rows.c.name, rows.c.token))

    def _insert_history(self, conn: Connection, records: list[dict[str, Any]]) -> None:
        """Insert history rows (:func:`round_values`): on PostgreSQL, many as one
        ``INSERT ... SELECT`` from the rows of one JSON parameter (see :func:`_json_rows`;
        an ``executemany`` binds and sends every row on its own: thousands of rows when
        an instant's rounds end together). Elsewhere the driver's ``executemany``.
        """
        if self._engine.dialect.name != "postgresql" or len(records) < 2:
            conn.execute(_h.insert(), records)
            return
        columns = [_h.c[column] for column in records[0]]
        rows = _json_rows("history", records, *columns)
        conn.execute(
            _h.insert().from_select(
                [column.name for column in columns], sa.select(*(rows.c[c.name] for c in columns))
            )
        )

    def _in_name_order(self, stmt: sa.Update, where: sa.ColumnElement[bool]) -> sa.Update:
        """``stmt`` on the rows ``where`` selects, on PostgreSQL locked first in name order.

        Renewals and batches of finishes write many rows of one replica at once; each
        locking them in the order its plan happens to read them, two such statements
        deadlocked (seen at 10,000 jobs). Locked in one order, one waits for the other.
        Elsewhere the rows are written as the plan reads them.
        """
        if self._engine.dialect.name != "postgresql":
            return stmt.where(where)
        locked = (
            sa.select(_t.c.name)
            .where(where)
            .order_by(_t.c.name)
            .with_for_update()
            .cte("locked")
            .prefix_with("MATERIALIZED")
        )
        # Locked under READ COMMITTED, a row is read again as it now is: only the rows
        # ``where`` still selects come out of ``locked``.
        return stmt.add_cte(locked).where(_t.c.name.in_(sa.select(locked.c.name)))

    def _clock_ms(self) -> int | None:
        """The given clock's now in epoch ms; ``None`` on the database's clock."""
        return None if self._clock is None else _to_ms(self._clock())

    def _held(
        self, leases: list[tuple[str, int]], now_ms: int | None, instant: int | None = None
    ) -> None:
        """Tell the watchers that ``leases`` are held from ``now_ms`` for the ttl."""
        if leases:
            expires = None if now_ms is None else now_ms + self._ttl_ms
            held = WriteKind.HELD
            self._tell(
                LeaseWrite(kind=held, leases=tuple(leases), expires_ms=expires, instant=instant)
            )

    def _released(self, name: str, token: int, *, given_back: bool) -> None:
        """Tell the watchers that a lease was let go: its round ended, or was cut short."""
        kind = WriteKind.GIVEN_BACK if given_back else WriteKind.RELEASED
        self._tell(LeaseWrite(kind=kind, leases=((name, token),)))

    def _requested(self, name: str) -> None:
        """Tell the watchers that a round of ``name`` was requested (after the commit)."""
        self._tell(LeaseWrite(kind=WriteKind.REQUESTED, leases=((name, 0),)))

    def _watched(self) -> bool:
        """Whether anyone watches this database's writes (see :meth:`watch`)."""
        return bool(_WATCHERS.get(self._key))

    def _tell(self, write: LeaseWrite) -> None:
        """Call the watchers of this database with ``write`` (see :meth:`watch`)."""
        if not _WATCHERS.get(self._key):  # the usual case, without taking the lock
            return
        with _WATCH_LOCK:
            watchers = list(_WATCHERS.get(self._key, ()))
        for watcher in watchers:
            watcher(write)

    @contextlib.contextmanager
    def _transaction(
        self, *, read: bool = False, timeout_ms: int | None = None
    ) -> Iterator[Connection]:
        """A connection in a transaction whose statements give up after the bound.

        Commits when the block ends normally, rolls back otherwise. The bound is
        :attr:`statement_timeout`. It is set on the pooled connection's session the first
        time the store uses that connection (one statement, then none while the store
        keeps using it), and undone before anyone else is handed the connection (a job's
        ``ctx.transaction()``: see :func:`_unbind_for_others`), so it never bounds their
        statements:

        - PostgreSQL: ``statement_timeout``, its previous value saved;
        - MariaDB/MySQL: the row-lock and metadata-lock waits
          (``innodb_lock_wait_timeout``, ``lock_wait_timeout``; whole seconds, at least
          1), their previous values saved in session variables;
        - SQLite: the engine's busy timeout (30 s from :func:`~lease.create_engine`).

        A connection whose settings could not be restored is invalidated, never handed
        out. A statement that gives up raises ``OperationalError``, which the callers'
        :func:`translate_errors` turns into :class:`DatabaseUnavailable`.
        """
        with self._bounded(read=read, timeout_ms=timeout_ms or self._timeout_ms) as conn:
            yield conn

    @contextlib.contextmanager
    def _bounded(self, *, read: bool, timeout_ms: int) -> Iterator[Connection]:
        _store_checkout.active = True
        try:
            conn = self._engine.connect()
        finally:
            _store_checkout.active = False
        if read:
            # A read needs no write lock: on an engine from lease.create_engine, its
            # SQLite transaction begins DEFERRED, so it never waits for another
            # process's writer.
            conn = conn.execution_options(**{SQLITE_BEGIN_OPTION: "DEFERRED"})
        with conn, conn.begin():
            before = conn.info.get(_BOUND)
            if before is None or before[0] != timeout_ms:
                try:
                    self._bind(conn, timeout_ms, before)
                except BaseException:
                    if not conn.invalidated:
                        conn.invalidate()  # the session's settings are unknown: never pooled
                    raise
            try:
                yield conn
            except BaseException:
                if conn.dialect.name == "postgresql":  # set_config rolls back with it
                    if before is None:
                        conn.info.pop(_BOUND, None)
                    else:
                        conn.info[_BOUND] = before
                raise

    def _bind(self, conn: Connection, timeout_ms: int, bound: tuple[int, str, bool] | None) -> None:
        """Set the bound on ``conn``'s session; note it, and what undoes it, in its info
        (``bound``: what the session had from the store before, if anything)."""
        dialect = conn.dialect.name
        if dialect == "postgresql":
            setting = f"SELECT set_config('statement_timeout', '{timeout_ms}', false)"
            if bound is not None:
                conn.exec_driver_sql(setting)
                conn.info[_BOUND] = (timeout_ms, bound[1], True)
                return
            # Read before written (a select list is evaluated left to right).
            (before, _) = conn.exec_driver_sql(
                f"SELECT current_setting('statement_timeout'), {setting[7:]}"
            ).one()
            old = str(before).replace("'", "''")
            undo = f"SELECT set_config('statement_timeout', '{old}', false)"
            conn.info[_BOUND] = (timeout_ms, undo, True)
        elif dialect in ("mysql", "mariadb"):
            # Not max_statement_time (MariaDB only) nor max_execution_time (MySQL, SELECT
            # only): a statement of ours that waits is waiting for a lock, and these two
            # bound that wait on both servers. Session variables are not transactional.
            seconds = max(1, math.ceil(timeout_ms / 1000))
            save = (
                ""
                if bound is not None
                else "SET @lease_saved_lock_wait = @@SESSION.innodb_lock_wait_timeout,"
                " @lease_saved_mdl_wait = @@SESSION.lock_wait_timeout,"
            )
            conn.exec_driver_sql(
                (save or "SET")
                + f" SESSION innodb_lock_wait_timeout = {seconds},"
                f" SESSION lock_wait_timeout = {seconds}"
            )
            conn.info[_BOUND] = (
                timeout_ms,
                "SET SESSION innodb_lock_wait_timeout = @lease_saved_lock_wait,"
                " SESSION lock_wait_timeout = @lease_saved_mdl_wait",
                False,
            )

    def _update_returning(
        self,
        conn: Connection,
        stmt: sa.Update,
        columns: Sequence[sa.ColumnElement[Any]],
        written: Callable[[], tuple[sa.ColumnElement[bool], ...]],
        returning: sa.Update | None = None,
        tuples: bool = False,
        **params: Any,
    ) -> list[Any]:
        """Run ``stmt`` (with bind ``params``) and return ``columns`` of the rows it
        updated: mappings, or with ``tuples`` plain rows in the order of ``columns``
        (cheaper by the thousand).

        ``written()`` gives the conditions that select exactly those rows once the UPDATE
        has run, within the same transaction; it is called only where the dialect lacks
        UPDATE ... RETURNING. A prebuilt statement passes its prebuilt ``returning`` form
        too.
        """
        if conn.dialect.update_returning:
            if returning is None:
                returning = stmt.returning(*columns)
            result = conn.execute(returning, params)
        elif conn.execute(stmt, params).rowcount == 0:
            return []
        else:
            result = conn.execute(sa.select(*columns).where(*written()))
        # all(): one fetch of every row, not one call per row.
        return list(result.all() if tuples else result.mappings().all())


#: What a claim reads back of each row it claimed (see :meth:`LeaseStore._claim`).
_BATCH_COLUMNS: Final = (_t.c.name, _t.c.prev_instant, _t.c.prev_state, _t.c.prev_attempt)

_CLAIM_COLUMNS: Final = (
    _t.c.name,
    _t.c.instant,
    _t.c.attempt,
    _t.c.token,
    _t.c.prev_instant,
    _t.c.prev_state,
    _t.c.prev_attempt,
)


#: Key, in a pooled connection's info, of the store's bound on its session:
#: ``(timeout_ms, the statement that restores the session's own settings, PostgreSQL)``.
_BOUND: Final = "lease_statement_bound"

#: ``active`` while this thread checks a connection out for a store's transaction.
_store_checkout = threading.local()


def _unbind_for_others(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """The pool's ``checkout`` listener: a connection the store bounded goes to anyone
    else only after its session's own settings are restored (one statement; it happens
    only when a connection passes from the store to other users).

    Raises:
        DisconnectionError: restoring failed; the pool drops the connection and hands
            out another.
    """
    bound = record.info.get(_BOUND)
    if bound is None or getattr(_store_checkout, "active", False):
        return
    try:
        # PostgreSQL's set_config outside a transaction (the drivers' autocommit is a
        # flag on the client, idle here): one round trip, no COMMIT. MariaDB/MySQL's
        # session variables are not transactional.
        postgres = bound[2]
        if postgres:
            dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(bound[1])
        finally:
            cursor.close()
            if postgres:
                dbapi_connection.autocommit = False
    except Exception as exc:
        raise sa.exc.DisconnectionError(f"restoring the session's settings failed: {exc}") from exc
    del record.info[_BOUND]


def _is_free(now: sa.ColumnElement[int]) -> sa.ColumnElement[bool]:
    return sa.or_(_t.c.expires_ms.is_(None), _t.c.expires_ms <= now)


def _is_running() -> sa.ColumnElement[bool]:
    return _t.c.state == LeaseState.RUNNING.value


def _claim_from(row: RowMapping) -> Claim:
    """The claim of a second run (it supersedes nothing: the round is the same one)."""
    return Claim(
        name=row["name"],
        instant=_from_seconds(row["instant"]),
        attempt=row["attempt"],
        token=row["token"],
    )


def _previous_round(
    name: str, prev_instant: object, prev_attempt: object
) -> tuple[datetime, int] | None:
    """The unfinished round a claim of ``name`` gave up, as ``(instant, attempt)``;
    ``None`` (logged) when the row held a malformed one."""
    if (
        _is_int(prev_instant)
        and prev_instant >= 0
        and _is_int(prev_attempt)
        and prev_attempt in (1, 2)
    ):
        return _from_seconds(prev_instant), prev_attempt
    logger.warning(
        "lease row %r held a malformed previous round (%r, %r); not reported",
        name,
        prev_instant,
        prev_attempt,
    )
    return None


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
        )
    except OverflowError as exc:  # an epoch past datetime's range
        raise _MalformedRow(str(exc)) from None


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
    count. Dumped by :func:`json.dumps` (C), not as arrays: psycopg dumps an array
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


#: Names :func:`_names` found valid, not checked again: every claim and every end names
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
