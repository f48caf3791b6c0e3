"""The fence check of many holders at once: a part of [LeaseStore][lease.LeaseStore].

[holds][lease.LeaseStore.holds] checks one token in the caller's transaction;
`holds_many` checks many in one statement and can lock the rows it finds, so that a
group of holders' writes is fenced by one check in one transaction (a hand-off's group
record: `cronjob.contrib._records`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterator
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ._core import _StoreCore, _t
from ._dialect import _db_now_ms
from ._exceptions import translate_errors
from ._rows import _check_token, _json_recordset, _names

#: `_Fence._holds_many_bound`'s statements, by (the database's clock, locking).
_HOLDS_MANY: dict[tuple[bool, bool], sa.Select[Any]] = {}


class _Fence(_StoreCore):
    """`holds_many` and the lock it is taken under."""

    def holds_many(
        self, connection: Connection, leases: Collection[tuple[str, int]], *, lock: bool = False
    ) -> set[tuple[str, int]]:
        """Tell, inside the caller's transaction, which of ``leases`` (name, token) still
        hold: [holds][lease.LeaseStore.holds] of each, in one statement.

        A pair holds when its row still has that token and ``expires_ms > now`` (the
        lease clock; at ``now == expires_ms`` it is lost), as for ``holds``.

        ``lock=True`` locks the rows found (``SELECT ... ORDER BY name FOR UPDATE`` on
        PostgreSQL and MariaDB/MySQL; a SQLite transaction of
        [create_engine][lease.create_engine]'s holds the database's write lock from its
        ``BEGIN``) until the caller's transaction ends: no claim or renewal can change
        them before it commits, so the writes it fences may come after the check.
        Lock only inside `locking_held`, which keeps this process's renewals, ends and
        give-backs (which lock rows of the same holder) from locking them in another
        order meanwhile.

        Returns:
            The pairs of ``leases`` that hold; every other one has lost its lease. An
            empty ``leases`` runs no statement.
        """
        pairs = sorted({(name, _check_token(token)) for name, token in leases})
        _names([name for name, _ in pairs])
        if not pairs:
            return set()
        if self._postgres:
            bound, params = self._holds_many_bound(pairs, lock=lock)
            with translate_errors("check leases"):
                return {(row[0], int(row[1])) for row in connection.execute(bound, params)}
        stmt = (
            sa.select(_t.c.name, _t.c.token)
            .where(self._pair_in(pairs), _t.c.expires_ms > self._now())
            .order_by(_t.c.name)
        )
        if lock and connection.dialect.name != "sqlite":
            stmt = stmt.with_for_update(of=_t)
        with translate_errors("check leases"):
            return {(row[0], int(row[1])) for row in connection.execute(stmt)}

    def _holds_many_bound(
        self, pairs: list[tuple[str, int]], *, lock: bool
    ) -> tuple[sa.Select[Any], dict[str, Any]]:
        """PostgreSQL: `holds_many`'s statement, built once per shape (the lease clock,
        the lock) and run with the pairs as one JSON parameter: built and compiled for
        each group it cost about as much CPU as the group's insert (a hand-off's group
        record, at 10,000 a minute)."""
        now_ms = self._clock_ms()
        key = (now_ms is None, lock)
        built = _HOLDS_MANY.get(key)
        if built is None:
            now = (
                _db_now_ms() if now_ms is None else sa.bindparam("holds_now", type_=sa.BigInteger())
            )
            rows = _json_recordset("holds_pairs", _t.c.name, _t.c.token)
            built = cast(
                "sa.Select[Any]",
                sa.select(_t.c.name, _t.c.token)
                .where(
                    sa.tuple_(_t.c.name, _t.c.token).in_(sa.select(rows.c.name, rows.c.token)),
                    _t.c.expires_ms > now,
                )
                .order_by(_t.c.name),
            )
            if lock:
                built = built.with_for_update(of=_t)
            _HOLDS_MANY[key] = built
        records = [{"name": name, "token": token} for name, token in pairs]
        params: dict[str, Any] = {"holds_pairs": json.dumps(records)}
        if now_ms is not None:
            params["holds_now"] = now_ms
        return built, params

    @contextlib.contextmanager
    def locking_held(self) -> Iterator[None]:
        """A block in which the caller's transaction may lock rows this process holds
        (`holds_many` with ``lock=True``), then commit.

        The writes of held rows by name and token (renewals, batches of ends,
        give-backs) lock many rows of one holder each, in their statement's order; two
        such transactions of one process locking the same rows in two orders deadlock.
        Every one of them runs one at a time in the process, and so does this block (see
        the store's held-rows transaction). Open the transaction inside it, keep it short
        (its statements, then the commit), and take no other lock of the store in it.
        """
        with self._held_rows:
            yield
