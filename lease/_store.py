"""Every statement that reads or writes the lease table.

A lease is named by a string and claimed for an *instant* (an aware UTC datetime with
whole seconds). The table keeps one row per name: the latest instant claimed, which run
of it that is (attempt 1, or 2 for a second run), how it stands ([LeaseState][lease.LeaseState]),
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
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from ._claims import UNCLAIMED_LIMIT as UNCLAIMED_LIMIT
from ._claims import UNCLAIMED_WITHIN as UNCLAIMED_WITHIN
from ._claims import _Claims, _due_seconds
from ._core import _IN_LIST_LIMIT, _WATCH_LOCK, _WATCHERS, _h, _p, _t, logger
from ._core import CLAIM_AHEAD_LIMIT as CLAIM_AHEAD_LIMIT
from ._core import DEFAULT_STATEMENT_TIMEOUT as DEFAULT_STATEMENT_TIMEOUT
from ._core import DEFAULT_TTL as DEFAULT_TTL
from ._dialect import SUPPORTED_DIALECTS as SUPPORTED_DIALECTS
from ._dialect import check_dialect as check_dialect
from ._ends import _Ends
from ._exceptions import translate_errors
from ._fence import _Fence
from ._history import _History
from ._notes import _Notes
from ._pause import _Pause
from ._records import replica_from
from ._restore import _Restore
from ._rows import Claim as Claim
from ._rows import ClaimBatch as ClaimBatch
from ._rows import CutShort as CutShort
from ._rows import LeaseRow as LeaseRow
from ._rows import LeaseState as LeaseState
from ._rows import LeaseWrite as LeaseWrite
from ._rows import Survey as Survey
from ._rows import WriteKind as WriteKind
from ._rows import _from_seconds, _is_int, _MalformedRow, _names, _parse_row, _seconds_floor
from ._rows import _new_token as _new_token
from ._schema import NEVER
from ._timing import spec_changed_ms

__all__ = [
    "DEFAULT_STATEMENT_TIMEOUT",
    "DEFAULT_TTL",
    "SUPPORTED_DIALECTS",
    "UNCLAIMED_LIMIT",
    "UNCLAIMED_WITHIN",
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


#: `LeaseStore.ensure` writes its rows in transactions of at most this many names,
#: in name order: replicas that start together on a new table (each inserting every
#: row) take the rows' locks in one order, and each waits at most for one batch of
#: another's, not for its whole write (ten replicas of 100,000 rows: statements queued
#: past their bound on each other's uncommitted rows).
ENSURE_BATCH: Final = 1000
#: A due at least this long past (ms, lease clock) is stale: the instant went by with no
#: claim of the row (every replica was down, or the job was removed and registered
#: again); `LeaseStore.ensure` moves it on to the due it is given. A due just past
#: may still be the rest of an instant being claimed right now: it is left alone.
STALE_DUE_MS: Final = 60_000
# As SQL text, not bind parameters: PyMySQL's executemany sends the conflict clause of an
# INSERT unformatted.
#: The most holders one query of [holders][lease.LeaseStore.holders] probes (a sub-query
#: each); more take one query per this many.
_PROBES_PER_QUERY: Final = 100

_STALE_DUE = sa.literal_column(str(STALE_DUE_MS), sa.BigInteger())
_MS_PER_S = sa.literal_column("1000", sa.BigInteger())


def _lowered(
    given: sa.ColumnElement[Any], stale_before_ms: sa.ColumnElement[int]
) -> sa.ColumnElement[Any]:
    """A row's ``due_s`` after [LeaseStore.ensure][lease.LeaseStore.ensure] gave ``given``:
    the earlier of the two, the row's own when ``given`` is NULL (a due is lowered, never
    raised), or ``given`` when the row's is stale (before ``stale_before_ms``, see
    `STALE_DUE_MS`)."""
    return sa.case(
        (given.is_(None), _t.c.due_s),
        (
            sa.or_(
                _t.c.due_s.is_(None), _t.c.due_s > given, _t.c.due_s * _MS_PER_S < stale_before_ms
            ),
            given,
        ),
        else_=_t.c.due_s,
    )


class LeaseStore(_Claims, _Ends, _Fence, _History, _Notes, _Pause, _Restore):
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
            or wait for a lock before it gives up with
            [DatabaseUnavailable][lease.DatabaseUnavailable]; `DEFAULT_STATEMENT_TIMEOUT` by
            default. Applied inside the store's own transactions only (see `_transaction`):
            statements that jobs run on the same engine are never bounded. Whole seconds,
            rounded up, on MariaDB/MySQL; SQLite's bound is the engine's busy timeout
            instead.
        claim_ahead: how far, in seconds, an instant may lie past the lease clock's now
            and still be claimed (`CLAIM_AHEAD_LIMIT`); ``None`` for no limit (a
            store that claims instants of its own choosing, as tests do).

    Raises:
        UnsupportedDatabase: the engine's dialect cannot carry leases.
        ValueError: ``ttl`` or ``statement_timeout`` is not a positive number of seconds,
            or ``claim_ahead`` is negative.

    Every method raises [DatabaseUnavailable][lease.DatabaseUnavailable] when the database cannot be
    reached, drops the connection, or a statement outlives ``statement_timeout``, and
    [DatabaseError][lease.DatabaseError] when it refuses a statement; no SQLAlchemy
    exception escapes.
    """

    def ensure(
        self,
        names: Iterable[str],
        *,
        specs: Mapping[str, str] | None = None,
        due: Mapping[str, datetime | None] | None = None,
    ) -> None:
        """Insert a row for each name that has none: never claimed, state ``new``,
        deployed now (``deployed_ms``, on the lease clock: the name's first deployment).

        Existing rows are left as they are, but for their ``spec`` when ``specs`` gives
        one (what the caller registered under the name, shown by status tools): the
        latest caller's spec wins, and a spec that replaces another marks the row retimed
        now (``spec_ms``: missed instants are counted from it); and for a ``deployed_ms``
        left NULL (a row written before revision 0005, or by an older release's replica
        since), which becomes now:
        the name is deployed by then for sure. A deployment on record never moves.

        ``due`` gives, by name, the name's next instant (a schedule's next, as the caller
        registered it): a row's ``due_s`` becomes it when it is NULL or later (a new
        schedule that comes sooner), and is never raised but when stale (a minute or more
        past, `STALE_DUE_MS`: an instant that went by unclaimed); a name ``due``
        leaves out, or maps to ``None``, keeps its value (NULL on a new row). See
        [unclaimed][lease.LeaseStore.unclaimed].

        Its cost: one query reading the rows' spec, due and deployment (by names; the
        whole table beyond 500 names, as [read][lease.LeaseStore.read]), then one write
        statement (run once per batch of parameters) for only the names it would change —
        missing, of another spec, of a due to lower or a stale one, of no deployment — and
        no write at all when there are none (a replica starting where its rows are already
        on record writes nothing). The write goes in name order, in transactions of at most
        `ENSURE_BATCH` names (one statement each): a failure may leave the earlier batches
        written, which is harmless (an ensure is idempotent; the next start or the minute
        check writes the rest). The read only picks the names: the write's own conditions
        still decide each row, so a row changed by someone else after the read is never made
        worse (a due lowered meanwhile is not raised back), and the outcome is that of this
        ensure before or after the other writer's.

        Raises:
            ValueError: a name is empty, longer than 200 characters, or starts or ends
                with whitespace (MySQL would match "job " to "job").
            TypeError: ``names`` is a single string.
        """
        wanted = _names(names)
        if wanted:
            self._ensure(wanted, specs, due)

    def _ensure(
        self,
        wanted: list[str],
        specs: Mapping[str, str] | None,
        due: Mapping[str, datetime | None] | None = None,
    ) -> None:
        seconds = None if due is None else _due_seconds(due)
        changed = self._to_write(wanted, specs, seconds)
        if changed:
            self._upsert(changed, specs, seconds)

    def _upsert(
        self,
        changed: list[str],
        specs: Mapping[str, str] | None,
        seconds: Mapping[str, int] | None,
    ) -> None:
        """[ensure][lease.LeaseStore.ensure]'s write, without its read: ``changed`` in name
        order, one statement and transaction per `ENSURE_BATCH` of them."""
        defaults: dict[str, Any] = {
            "instant": NEVER,
            "attempt": 1,
            "state": LeaseState.NEW.value,
            "token": 0,
            # One now for the whole statement (the database's, or the given clock's).
            "deployed_ms": self._now(),
        }
        params: list[dict[str, Any]] = [{"name": name} for name in sorted(changed)]
        if specs is not None:
            defaults["spec"] = sa.bindparam("spec")
            for param in params:
                param["spec"] = specs.get(param["name"])
        if seconds is not None:
            defaults["due_s"] = sa.bindparam("due_s", type_=sa.BigInteger())
            for param in params:
                param["due_s"] = seconds.get(param["name"])
        dialect = self._engine.dialect.name
        stmt: sa.Executable
        if dialect in ("postgresql", "sqlite"):
            insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_t)
            insert = insert.values(defaults)
            deployed = sa.func.coalesce(_t.c.deployed_ms, insert.excluded.deployed_ms)
            if seconds is not None:
                # The statement's now: the new row's deployment.
                stale_before = insert.excluded.deployed_ms - _STALE_DUE
                set_: dict[str, Any] = {
                    "deployed_ms": deployed,
                    "due_s": _lowered(insert.excluded.due_s, stale_before),
                }
                if specs is not None:
                    set_["spec_ms"] = spec_changed_ms(
                        insert.excluded.spec, insert.excluded.deployed_ms
                    )
                    set_["spec"] = insert.excluded.spec
                stmt = insert.on_conflict_do_update(index_elements=[_t.c.name], set_=set_)
            elif specs is None:
                # Only a row whose deployment is unknown is written to.
                stmt = insert.on_conflict_do_update(
                    index_elements=[_t.c.name],
                    set_={"deployed_ms": deployed},
                    where=_t.c.deployed_ms.is_(None),
                )
            else:
                stmt = insert.on_conflict_do_update(
                    index_elements=[_t.c.name],
                    set_={
                        "spec_ms": spec_changed_ms(
                            insert.excluded.spec, insert.excluded.deployed_ms
                        ),
                        "spec": insert.excluded.spec,
                        "deployed_ms": deployed,
                    },
                )
        else:
            # Not INSERT IGNORE: IGNORE also turns data errors into warnings, so a value
            # the column cannot hold would be truncated and stored instead of refused.
            my = mysql.insert(_t).values(defaults)
            updates: dict[str, Any] = {
                "deployed_ms": sa.func.coalesce(_t.c.deployed_ms, my.inserted.deployed_ms)
            }
            if specs is not None:
                # Before the spec: MariaDB's SET reads the columns already assigned.
                updates["spec_ms"] = spec_changed_ms(my.inserted.spec, my.inserted.deployed_ms)
                updates["spec"] = my.inserted.spec
            if seconds is not None:
                stale_before = my.inserted.deployed_ms - _STALE_DUE
                updates["due_s"] = _lowered(my.inserted.due_s, stale_before)
            stmt = my.on_duplicate_key_update(list(updates.items()))  # in this order
        for start in range(0, len(params), ENSURE_BATCH):
            with translate_errors("ensure leases"), self._transaction() as conn:
                conn.execute(stmt, params[start : start + ENSURE_BATCH])

    def _to_write(
        self,
        wanted: list[str],
        specs: Mapping[str, str] | None,
        seconds: Mapping[str, int] | None,
    ) -> list[str]:
        """The names among ``wanted`` whose row `_ensure`'s upsert would change, as
        one query reads them: no row, no deployment, another spec than ``specs`` gives
        (when given), a due NULL, stale or later than ``seconds`` gives. A value this
        package never writes (a hand edit) counts as a change: the upsert's conditions
        decide."""
        stale = (_t.c.due_s * _MS_PER_S < self._now() - _STALE_DUE).label("stale")
        stmt = sa.select(_t.c.name, _t.c.spec, _t.c.due_s, _t.c.deployed_ms, stale)
        if len(wanted) <= _IN_LIST_LIMIT:
            stmt = stmt.where(_t.c.name.in_(wanted))
        with translate_errors("ensure leases"), self._transaction(read=True) as conn:
            rows = conn.execute(stmt).all()
        wanted_set = set(wanted)
        # Names whose row is on record and would stay as it is.
        kept: set[str] = set()
        for name, spec, due_s, deployed_ms, stale_due in rows:
            if name not in wanted_set or deployed_ms is None:
                continue
            if specs is not None and specs.get(name) != spec:
                continue
            if seconds is not None:
                given = seconds.get(name)
                if given is not None and (stale_due or not (_is_int(due_s) and due_s <= given)):
                    continue
            kept.add(name)
        return [name for name in wanted if name not in kept]

    def missing(self, names: Iterable[str]) -> list[str]:
        """Return the names, among ``names``, that have no row (in the order given).

        One query reading names only; [ensure][lease.LeaseStore.ensure] recreates them.
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

    def holders(
        self, since: datetime, *, among: Collection[str] | None = None
    ) -> dict[str, datetime]:
        """The holders of the latest claims at instants ``since`` or later (whole seconds,
        rounded down), each with the latest instant it claimed.

        Without ``among``: one query, whatever the number of names, over the index on the
        instant: it reads the rows claimed at ``since`` or later, so a recent ``since``
        reads few. With ``among``: only those holders, one step down the index on
        ``(holder, instant)`` each (revision 0011), whatever the number of rows claimed
        since (one query, with a sub-query per holder).

        Each row keeps only its latest claim, so a holder whose every row was claimed
        again by others since does not appear. A row whose instant is not a number is
        left out (a hand edit; [read][lease.LeaseStore.read] logs it).
        """
        floor = _seconds_floor(since, "since")
        not_chore = sa.not_(_t.c.name.startswith(" "))  # chores' rows (see take_turn)
        if among is None:
            stmt = (
                sa.select(_t.c.holder, sa.func.max(_t.c.instant))
                .where(_t.c.instant >= floor, _t.c.holder.is_not(None), not_chore)
                .group_by(_t.c.holder)
            )
            with translate_errors("read the lease holders"), self._transaction(read=True) as conn:
                rows = [tuple(row) for row in conn.execute(stmt).all()]
        else:
            asked = sorted({holder for holder in among if isinstance(holder, str)})
            if not asked:
                return {}
            latest = [
                sa.select(_t.c.instant)
                .where(_t.c.holder == holder, _t.c.instant >= floor, not_chore)
                .order_by(_t.c.instant.desc())
                .limit(1)
                .scalar_subquery()
                for holder in asked
            ]
            rows = []
            with translate_errors("read the lease holders"), self._transaction(read=True) as conn:
                for first in range(0, len(asked), _PROBES_PER_QUERY):
                    probes = latest[first : first + _PROBES_PER_QUERY]
                    found = conn.execute(sa.select(*probes)).one()
                    rows.extend(zip(asked[first : first + len(probes)], found, strict=True))
        return {
            holder: _from_seconds(epoch)
            for holder, epoch in rows
            if isinstance(holder, str) and _is_int(epoch) and epoch >= 0
        }

    def read_all(self) -> dict[str, LeaseRow]:
        """Read every row, by name (malformed ones logged and left out, as
        [read][lease.LeaseStore.read]; the rows of chores, see
        [take_turn][lease.LeaseStore.take_turn], left out too)."""
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

    def watch(self, callback: Callable[[LeaseWrite], None]) -> Callable[[], None]:
        """Call ``callback`` with each [LeaseWrite][lease.LeaseWrite] that any store of this process
        makes to this store's database, in the writing thread. Returns the function that
        stops it.

        Claims (`WriteKind.HELD`) are told before their transaction commits, so a
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
