"""The plumbing every part of [LeaseStore][lease.LeaseStore] stands on: its construction,
the lease clock in SQL, bounded transactions, the fence check, the watchers of writes."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Dialect, Engine

from ._dbkey import database_key
from ._engine import SQLITE_BEGIN_OPTION, behind_transaction_pooler
from ._exceptions import translate_errors
from ._schema import (
    lease_table,
    replica_table,
    round_table,
    trigger_table,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection
from ._dialect import (
    _BOUND,
    _db_now_ms,
    _store_checkout,
    _unbind_for_others,
    check_dialect,
    transaction_bounded,
)
from ._rows import LeaseWrite, WriteKind, _check_token, _json_rows, _names, _to_ms

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
#: A lock per database (its URL) for the writes of held rows by name and token (renewals,
#: batches of ends, give-backs) of every store of this process: see
#: `_StoreCore._held_rows_transaction`.
_HELD_ROWS: dict[str, threading.RLock] = {}


def _tell_key(key: str, write: LeaseWrite) -> None:
    """Call the watchers of the database ``key`` names with ``write`` (see `watch`)."""
    if not _WATCHERS.get(key):  # the usual case, without taking the lock
        return
    with _WATCH_LOCK:
        watchers = list(_WATCHERS.get(key, ()))
    for watcher in watchers:
        watcher(write)


def _tell_url(url: str | sa.URL, write: LeaseWrite) -> None:
    """`_tell_key` for the database ``url`` reaches: its key is made only while this
    process watches some database (it may look a host name up)."""
    if any(_WATCHERS.values()):
        _tell_key(database_key(url), write)


#: The furthest, in seconds, an instant may lie past the lease clock's now to be claimed.
#: Replicas' clocks must agree to within a schedule's granularity (the seed); one running
#: further ahead than this would claim instants the others have not reached yet, and
#: their own claims would then win nothing until real time caught up.
CLAIM_AHEAD_LIMIT: Final = 5.0


# Past this many names, read() and find_cut_short() read the whole table and keep the
# wanted names client side, instead of sending an IN list of that many parameters
# (the table holds one small row per job; a deployment has hundreds, not millions).
_IN_LIST_LIMIT: Final = 500


_t = lease_table
#: `LeaseStore.holds`' statements, by (on the database's clock, a locking read).
_HOLDS: dict[tuple[bool, bool], sa.Select[int]] = {}
_h = round_table
_p = replica_table
_q = trigger_table


class _StoreCore:
    """Construction, plumbing and the fence check: a part of [LeaseStore][lease.LeaseStore]."""

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
        self._mysql = engine.dialect.name in ("mysql", "mariadb")
        #: Behind a transaction pooler (the URL's ``pooler=transaction``): the bound is set
        #: in each transaction, never on a session (see _transaction).
        self._pooled = behind_transaction_pooler(engine)
        # Who else writes this database in this process (see watch): the URL names it.
        self._key = database_key(engine.url)
        with _WATCH_LOCK:
            self._held_rows = _HELD_ROWS.setdefault(self._key, threading.RLock())
        self._clock = clock
        self._ttl_ms = max(1, round(ttl * 1000))
        self._timeout_ms = max(1, round(statement_timeout * 1000))
        self._ahead_ms = None if claim_ahead is None else round(claim_ahead * 1000)
        #: The claim's statement and its RETURNING form, by whether the clock is given
        #: (see _claim_statement).
        self._claim_statements: dict[tuple[bool, bool], tuple[sa.Update, sa.Update]] = {}
        #: The query of LeaseStore.unclaimed, by whether the clock is given.
        self._unclaimed_statements: dict[bool, sa.Select[Any]] = {}
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
        """Refuse a database that cannot carry leases (see [check_dialect][lease.check_dialect])."""
        check_dialect(self._engine)

    def now_ms(self) -> int:
        """Read the lease clock: epoch milliseconds (a query unless a clock was given)."""
        if self._clock is not None:
            return _to_ms(self._clock())
        with translate_errors("read the lease clock"), self._transaction(read=True) as conn:
            value = conn.execute(sa.select(_db_now_ms())).scalar_one()
        return int(value)

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
        stmt, params = self._holds_bound(name, token, connection.dialect, final=final)
        with translate_errors("check a lease"):
            return connection.execute(stmt, params).first() is not None

    async def holds_async(
        self, connection: AsyncConnection, name: str, token: int, *, final: bool = False
    ) -> bool:
        """Like [holds][lease.LeaseStore.holds], on an asyncio connection
        (``Round.transaction_async``).

        The same statement, awaited: the caller's event loop keeps running meanwhile.
        """
        stmt, params = self._holds_bound(name, token, connection.dialect, final=final)
        with translate_errors("check a lease"):
            return (await connection.execute(stmt, params)).first() is not None

    def holds_statement(
        self, name: str, token: int, dialect: Dialect, *, final: bool = False
    ) -> sa.Select[int]:
        """The statement [holds][lease.LeaseStore.holds] runs, for a connection that is not
        SQLAlchemy's.

        A framework's ORM (Django) runs it inside its own transaction, compiled for
        ``dialect``: the lease is held when it returns a row. ``final`` as for
        [holds][lease.LeaseStore.holds].
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

    def _holds_bound(
        self, name: str, token: int, dialect: Dialect, *, final: bool
    ) -> tuple[sa.Select[int], dict[str, Any]]:
        """`_holds_statement`'s statement, built once per shape and run with its values
        as parameters: every fenced transaction runs it twice, and building it each
        time cost a third of the check's CPU."""
        (wanted,) = _names([name])
        now_ms = self._clock_ms()
        locking = final and dialect.name in ("mysql", "mariadb")
        key = (now_ms is None, locking)
        stmt = _HOLDS.get(key)
        if stmt is None:
            now = (
                _db_now_ms() if now_ms is None else sa.bindparam("holds_now", type_=sa.BigInteger())
            )
            stmt = (
                sa.select(sa.literal(1))
                .select_from(_t)
                .where(
                    _t.c.name == sa.bindparam("holds_name"),
                    _t.c.token == sa.bindparam("holds_token"),
                    _t.c.expires_ms > now,
                )
            )
            if locking:
                stmt = stmt.with_for_update(read=True)
            _HOLDS[key] = stmt
        params: dict[str, Any] = {"holds_name": wanted, "holds_token": _check_token(token)}
        if now_ms is not None:
            params["holds_now"] = now_ms
        return stmt, params

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

    def _among(self, names: list[str]) -> tuple[sa.ColumnElement[bool], dict[str, Any]]:
        """``name IN names``, and the execution parameter (``among``) that carries the
        names: bound when the statement runs, not kept in it (SQLAlchemy's cache of
        compiled statements keeps the values of the first statement of each shape). On
        PostgreSQL one JSON text, made an array once (see ``_Claims._claim_statement``),
        not a parameter per name."""
        if not self._postgres:
            return _t.c.name.in_(sa.bindparam("among", expanding=True)), {"among": names}
        listed = sa.cast(sa.bindparam("among", type_=sa.Text()), postgresql.JSON())
        elements = sa.select(sa.func.json_array_elements_text(listed)).scalar_subquery()
        return _t.c.name == sa.any_(sa.func.array(elements)), {"among": json.dumps(names)}

    def _pair_in(self, pairs: list[tuple[str, int]]) -> sa.ColumnElement[bool]:
        """``(name, token) IN pairs``; on PostgreSQL against the rows of one JSON
        parameter (see `_json_rows`)."""
        if self._engine.dialect.name != "postgresql":
            return sa.tuple_(_t.c.name, _t.c.token).in_(pairs)
        records = [{"name": name, "token": token} for name, token in pairs]
        rows = _json_rows("pairs", records, _t.c.name, _t.c.token)
        return sa.tuple_(_t.c.name, _t.c.token).in_(sa.select(rows.c.name, rows.c.token))

    @contextlib.contextmanager
    def _held_rows_transaction(self) -> Iterator[Connection]:
        """A transaction that writes rows this process holds, by name and token (a
        renewal, a batch of ends, a give-back), taken one at a time in the process.

        Each such statement writes many rows of one replica, locking them in the order
        its plan reads them (PostgreSQL: an index's order, or the heap's). The control
        thread's renewal and the finisher's ends, on the same rows in two orders,
        deadlocked (seen at 10,000 jobs): the server killed one. They were made to lock
        in name order first (a ``SELECT ... ORDER BY name FOR UPDATE``, then the write),
        which read every row twice. One at a time they never wait for each other. Other
        processes meet these rows only through `pause --all` and claims of expired rows,
        which lock in name order (or the primary key's): a batch of several UPDATEs locks
        its rows in that order first (``finish_many``). The wait is one statement's time
        (the ends of a batch, a renewal), within the statement timeout.
        """
        with self._held_rows, self._transaction() as conn:
            yield conn

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
        """Whether anyone watches this database's writes (see `watch`)."""
        return bool(_WATCHERS.get(self._key))

    def _tell(self, write: LeaseWrite) -> None:
        """Call the watchers of this database with ``write`` (see `watch`)."""
        _tell_key(self._key, write)

    @contextlib.contextmanager
    def _transaction(
        self, *, read: bool = False, timeout_ms: int | None = None
    ) -> Iterator[Connection]:
        """A connection in a transaction whose statements give up after the bound.

        Commits when the block ends normally, rolls back otherwise. The bound is
        [statement_timeout][lease.LeaseStore.statement_timeout]. It is set on the pooled
        connection's session the first time the store uses that connection (one statement,
        then none while the store keeps using it), and undone before anyone else is handed
        the connection (a job's ``ctx.transaction()``: see `_unbind_for_others`), so it
        never bounds their statements:

        - PostgreSQL: ``statement_timeout``, its previous value saved;
        - MariaDB/MySQL: the row-lock and metadata-lock waits
          (``innodb_lock_wait_timeout``, ``lock_wait_timeout``; whole seconds, at least
          1), their previous values saved in session variables;
        - SQLite: the engine's busy timeout (30 s from [create_engine][lease.create_engine]).

        A connection whose settings could not be restored is invalidated, never handed
        out. A statement that gives up raises ``OperationalError``, which the callers'
        `translate_errors` turns into [DatabaseUnavailable][lease.DatabaseUnavailable].

        Behind a transaction pooler
        ([behind_transaction_pooler][lease.behind_transaction_pooler]) a session is no
        one's: its settings would bound other clients' transactions on the same server
        connection, and ours would run on a server connection that never had them. There
        each transaction bounds itself (``set_config(..., true)``, PostgreSQL's ``SET
        LOCAL``) as it begins, in the round trip of its ``BEGIN`` with psycopg (see
        `transaction_bounded`), and leaves nothing on the session.
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
        if self._pooled:
            with conn, transaction_bounded(conn, timeout_ms):
                yield conn
            return
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
                (save or "SET") + f" SESSION innodb_lock_wait_timeout = {seconds},"
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
