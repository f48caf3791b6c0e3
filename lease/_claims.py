"""Claims and their lifecycle: claim, take a turn, claim a second run, renew (see the
rules in `lease._store`; the ends of rounds are in `lease._ends`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from ._core import _StoreCore, _t, logger
from ._dialect import _db_now_ms
from ._exceptions import DatabaseUnavailable, translate_errors
from ._mysql_due import DEADLOCK_RETRIES, is_deadlock, write_due
from ._previous import ended_round, gave_up
from ._rows import (
    _UNFINISHED,
    Claim,
    ClaimBatch,
    LeaseState,
    _check_token,
    _from_seconds,
    _instant_seconds,
    _is_int,
    _names,
    _new_token,
    _seconds_floor,
)
from ._schema import NAME_LENGTH
from ._text import check_holder

#: What a claim reads back of each row it claimed (see `LeaseStore._claim`).
_BATCH_COLUMNS: Final = (
    _t.c.name,
    _t.c.prev_instant,
    _t.c.prev_state,
    _t.c.prev_attempt,
    _t.c.prev_start_ms,
    _t.c.last_end_ms,
)


#: The most names `_Claims.unclaimed` returns unless told otherwise. Past it the
#: caller cannot tell it found them all (a replica of a large deployment died): it claims
#: the rest by name instead, as before the due column.
UNCLAIMED_LIMIT: Final = 5000
#: How far back (seconds) `_Claims.unclaimed` looks: a row due longer ago than this
#: belongs to a job no replica has claimed for a day — most often one a deploy removed,
#: whose row would otherwise be read at every instant of every replica for ever.
UNCLAIMED_WITHIN: Final = 86_400


def _is_free(now: sa.ColumnElement[int]) -> sa.ColumnElement[bool]:
    return sa.or_(_t.c.expires_ms.is_(None), _t.c.expires_ms <= now)


def _is_running() -> sa.ColumnElement[bool]:
    return _t.c.state == LeaseState.RUNNING.value


def _due_seconds(due: Mapping[str, datetime | None]) -> dict[str, int]:
    """``due`` in epoch seconds (rounded down: earlier is safe, later is not); names
    mapped to ``None`` left out. Most names share a handful of instants, so each distinct
    one is converted once."""
    seconds: dict[datetime, int] = {}
    out: dict[str, int] = {}
    for name, when in due.items():
        if when is None:
            continue
        epoch = seconds.get(when)
        if epoch is None:
            epoch = seconds[when] = _seconds_floor(when, "due")
        out[name] = epoch
    return out


class _Claims(_StoreCore):
    """Claims and their lifecycle: a part of [LeaseStore][lease.LeaseStore]."""

    if TYPE_CHECKING:

        def _upsert(
            self,
            changed: list[str],
            specs: Mapping[str, str] | None,
            seconds: Mapping[str, int] | None,
        ) -> None:
            """Defined by [LeaseStore][lease.LeaseStore] (the rows, in ``lease/_store.py``)."""

    def claim(
        self,
        names: Iterable[str],
        instant: datetime,
        holder: str,
        *,
        due: Mapping[str, datetime | None] | None = None,
    ) -> list[Claim]:
        """Claim ``instant`` as a first run, for every name whose lease allows it.

        A name is claimed when its lease is free (``expires_ms`` NULL or ``<= now``), its
        recorded instant is strictly older than ``instant``, and ``instant`` is no more
        than ``claim_ahead`` seconds (`CLAIM_AHEAD_LIMIT`) past the lease clock's
        ``now``: a replica whose clock runs far ahead must not claim instants the others
        have not reached (its claims win nothing; the others run the instants on time).
        A paused row (``paused_ms`` set, see `set_paused`) is never claimed.
        Each claimed row gets ``attempt = 1``, state ``running``, a new random token (one
        for this call), ``holder`` and ``expires_ms = now + ttl``, and keeps what it held
        before in ``prev_*``. Names without a row are never claimed (see `ensure`).

        ``due`` gives, by name, the next instant after ``instant`` at which the name may
        need a claim (a schedule's next instant); each claimed row keeps it in
        ``due_s`` (rounded down to the second), which
        [unclaimed][lease.LeaseStore.unclaimed] reads. A name ``due`` leaves out, or maps to
        ``None``, keeps the row's value: it must never be later than the row's real next
        instant, or [unclaimed][lease.LeaseStore.unclaimed] misses that instant.

        Returns:
            One [Claim][lease.Claim] per name claimed, in the order of ``names``; with
            ``superseded`` set when the row's previous round was unfinished.

        Raises:
            ValueError: ``instant`` is not an aware datetime with whole seconds, a name or
                ``holder`` is empty or too long.
        """
        return self.claim_batch(names, instant, holder, due=due).claims()

    def claim_batch(
        self,
        names: Iterable[str],
        instant: datetime,
        holder: str,
        *,
        due: Mapping[str, datetime | None] | None = None,
    ) -> ClaimBatch:
        """[claim][lease.LeaseStore.claim], with what was won as one
        [ClaimBatch][lease.ClaimBatch]: the same statement and rules, without a
        [Claim][lease.Claim] made per name.

        Raises:
            ValueError: as [claim][lease.LeaseStore.claim]; or a ``due`` value is not an
                aware datetime.
        """
        wanted = _names(names)
        epoch = _instant_seconds(instant)
        check_holder(holder)
        if not wanted:
            return ClaimBatch(instant=instant, token=0, names=(), superseded={})
        return self._claim(wanted, epoch, holder, None if due is None else _due_seconds(due))

    def unclaimed(
        self, instant: datetime, *, limit: int = UNCLAIMED_LIMIT, within: int = UNCLAIMED_WITHIN
    ) -> list[str]:
        """The names whose row is due at ``instant`` and not claimed for it: ``due_s <=
        instant``, an older recorded instant, a free lease, not paused — what the claims
        of ``instant`` left. One query, carrying no names, over the index on ``due_s``: it
        reads only such rows (normally none, once every share of the instant is claimed).

        A row whose ``due_s`` is NULL (an older release wrote it, and no replica of this
        one has registered or claimed it since) is never returned, nor one due more than
        ``within`` seconds before ``instant`` (`UNCLAIMED_WITHIN`, a day: a removed job's
        row; a start's `ensure` moves a registered job's due on). At most ``limit`` names,
        lowest ``due_s`` first: a result of ``limit`` names may have left some out.

        It walks ``due_s``'s index from ``instant - within``, and the entries claims left
        there until a vacuum: keep ``within`` short (the engine's ``rest_within``).

        Raises:
            ValueError: ``instant`` is not aware with whole seconds, ``limit`` or ``within``
                not positive.
        """
        epoch = _instant_seconds(instant)
        for key, value in (("limit", limit), ("within", within)):
            if not _is_int(value) or value < 1:
                raise ValueError(f"{key} must be a positive whole number, not {value!r}")
        now_ms = self._clock_ms()
        params: dict[str, Any] = {"check_epoch": epoch, "check_limit": limit}
        params["check_since"] = epoch - within
        if now_ms is not None:
            params["check_now"] = now_ms
        stmt = self._unclaimed_statement(given_clock=now_ms is not None)
        with translate_errors("look for unclaimed leases"), self._transaction(read=True) as conn:
            return [str(name) for name in conn.execute(stmt, params).scalars()]

    def _unclaimed_statement(self, *, given_clock: bool) -> sa.Select[Any]:
        """[unclaimed][lease.LeaseStore.unclaimed]'s query, built once per store and clock
        kind (bind parameters only). Ordered by ``due_s`` with a limit: PostgreSQL's
        statistics on a column every claim moves are soon stale, and read as "every row is
        due" they chose a scan of the whole table; walking the index in order up to a limit
        is the cheaper plan whatever they say."""
        cached = self._unclaimed_statements.get(given_clock)
        if cached is not None:
            return cached
        now: sa.ColumnElement[int] = (
            sa.bindparam("check_now", type_=sa.BigInteger()) if given_clock else _db_now_ms()
        )
        epoch = sa.bindparam("check_epoch", type_=sa.BigInteger())
        since = sa.bindparam("check_since", type_=sa.BigInteger())
        stmt = (
            sa.select(_t.c.name)
            .where(
                _t.c.due_s <= epoch,
                _t.c.due_s >= since,
                _t.c.instant < epoch,
                _is_free(now),
                _t.c.paused_ms.is_(None),
            )
            .order_by(_t.c.due_s)
            .limit(sa.bindparam("check_limit", type_=sa.Integer()))
        )
        self._unclaimed_statements[given_clock] = stmt
        return stmt

    def take_turn(self, chore: str, instant: datetime, holder: str, *, create: bool = True) -> bool:
        """Claim ``instant`` of a chore that one holder at a time does (pruning): ``True``
        for the one holder whose claim won.

        The chore's row is named ``" " + chore`` — a name no caller of
        [claim][lease.LeaseStore.claim] can use (it starts with whitespace) — and, with
        ``create``, made when missing (one more statement: `ensure`'s write without its
        read, the row written only when missing, or without a deployment). Its lease is
        never finished: it expires, and the next instant is claimed as usual.
        """
        epoch = _instant_seconds(instant)
        check_holder(holder)
        name = f" {chore}"
        if not 1 < len(name) <= NAME_LENGTH or name != f" {chore.strip()}":
            raise ValueError(f"a chore is a name without whitespace at its ends, not {chore!r}")
        if create:
            self._upsert([name], None, None)
        return bool(self._claim([name], epoch, holder).names)

    def _claim(
        self, wanted: list[str], epoch: int, holder: str, due: dict[str, int] | None = None
    ) -> ClaimBatch:
        token = _new_token()
        now_ms = self._clock_ms()
        # The due in the claim's own statement where its UPDATE can join a JSON map and
        # still reads every SET against the old row (PostgreSQL, SQLite).
        joined = due is not None and not self._mysql
        stmt, returning = self._claim_statement(given_clock=now_ms is not None, due=joined)
        params: dict[str, Any] = {"claim_epoch": epoch}
        if joined:
            assert due is not None
            # The map's keys are the names claimed: one text, whatever the count.
            params["claim_due"] = json.dumps({name: due.get(name) for name in wanted})
        else:
            params["claim_names"] = json.dumps(wanted) if self._postgres else wanted
        params |= {
            "claim_token": token,
            "claim_holder": holder,
            "claim_ttl": self._ttl_ms,
        }
        if self._ahead_ms is not None:
            params["claim_reached"] = epoch * 1000 - self._ahead_ms
        if now_ms is not None:
            params["claim_now"] = now_ms
        for retry in range(DEADLOCK_RETRIES + 1):
            try:
                with translate_errors("claim leases"), self._transaction() as conn:
                    # Rows as tuples: (name, prev_instant, prev_state, prev_attempt,
                    # prev_start_ms, last_end_ms). The instant, the attempt and the token
                    # are the ones just written; a claim leaves the last end as it was.
                    rows = self._update_returning(
                        conn,
                        stmt,
                        _BATCH_COLUMNS,
                        # Built only where it is used (no RETURNING): an IN of thousands.
                        lambda: (_t.c.token == token, _t.c.name.in_(wanted)),
                        returning=returning,
                        tuples=True,
                        **params,
                    )
                    if due is not None and self._mysql and rows:
                        write_due(conn, rows, due, token)
                    # Before the commit: a claimer waiting on these rows sees who took them.
                    if self._watched():
                        self._held([(row[0], token) for row in rows], now_ms, epoch)
                break
            except DatabaseUnavailable as exc:
                # Rolled back whole by a deadlock (MariaDB/MySQL; see lease._mysql_due):
                # nothing was written, and the other transaction goes on; run it again.
                if retry == DEADLOCK_RETRIES or not is_deadlock(exc.__cause__):
                    raise
                logger.debug("claim of %d lease(s) deadlocked; running it again", len(wanted))
        instant = _from_seconds(epoch)
        won, superseded = {row[0] for row in rows}, gave_up(rows, epoch)
        ended = {
            row[0]: held
            for row in rows
            if row[2] not in _UNFINISHED and (held := ended_round(row[1], row[4], row[5]))
        }
        names = tuple(name for name in wanted if name in won)
        return ClaimBatch(
            instant=instant, token=token, names=names, superseded=superseded, ended=ended
        )

    def _claim_statement(self, *, given_clock: bool, due: bool) -> tuple[sa.Update, sa.Update]:
        """The claim's UPDATE, built once per store (and clock kind, and whether it
        writes ``due_s``): every value is a bind parameter (``claim_*``), so an instant's
        claim neither builds the statement nor computes its cache key again (SQLAlchemy
        memoizes it on the object): about half a millisecond of CPU per claim, in the
        path from the instant to the rounds. Returns the statement and its ``RETURNING``
        form.

        With ``due`` (PostgreSQL and SQLite), the names are the keys of one JSON object
        mapping each to its next instant (``claim_due``), and a name's next instant lands
        in the claim's own UPDATE: on PostgreSQL looked up in the object by each row, on
        SQLite joined from its entries (``UPDATE ... FROM json_each(...)``). Both
        evaluate every SET against the row as it was, so the ``prev_*`` copies stay right.
        """
        key = (given_clock, due)
        cached = self._claim_statements.get(key)
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
        due_s: sa.ColumnElement[Any] = _t.c.due_s
        mapped = sa.bindparam("claim_due", type_=sa.Text())
        if due and self._postgres:
            # Not a join with the map's entries: without statistics (a new table) the
            # planner scanned the entries again for each row, 10,000 names past the
            # statement's 5 s bound. The names, made an array once (an InitPlan), drive
            # the index scan as without the due; each row looks its due up in the map,
            # itself made a jsonb once (another InitPlan): a binary search by key.
            as_jsonb = sa.cast(mapped, postgresql.JSONB())
            keys = sa.select(sa.func.jsonb_object_keys(as_jsonb)).scalar_subquery()
            named = _t.c.name == sa.any_(sa.func.array(keys))
            looked_up = sa.select(as_jsonb).scalar_subquery().op("->>")(_t.c.name)
            due_s = sa.func.coalesce(sa.cast(looked_up, sa.BigInteger()), _t.c.due_s)
        elif due:
            entries = sa.func.json_each(mapped).table_valued("key", "value").alias("claim_due")
            named = _t.c.name == entries.c.key
            # A name mapped to null keeps its row's value.
            due_s = sa.func.coalesce(sa.cast(entries.c.value, sa.BigInteger()), _t.c.due_s)
        elif self._postgres:
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
                (_t.c.prev_start_ms, _t.c.last_start_ms),
                (_t.c.instant, epoch),
                (_t.c.attempt, 1),
                (_t.c.state, LeaseState.RUNNING.value),
                (_t.c.token, sa.bindparam("claim_token", type_=sa.BigInteger())),
                (_t.c.holder, sa.bindparam("claim_holder", type_=sa.String())),
                (_t.c.expires_ms, now + sa.bindparam("claim_ttl", type_=sa.BigInteger())),
                (_t.c.last_start_ms, now),
                *([(_t.c.due_s, due_s)] if due else []),
            )
        )
        built = (stmt, stmt.returning(*_BATCH_COLUMNS))
        self._claim_statements[key] = built
        return built

    def claim_rerun(self, name: str, instant: datetime, holder: str) -> Claim | None:
        """Claim the second run (attempt 2) of ``instant``, a round cut short.

        Succeeds only when the row's instant is ``instant``, its attempt is 1, its state
        is ``running`` or ``cut`` (not ``done``), its lease is free, and it is not paused.
        A new token is drawn; ``superseded`` is the round the instant's first claim gave
        up, if any (the round is the same one: the row keeps it through its second runs).

        Returns:
            The claim, or ``None`` when the rule refuses it (another replica re-ran it
            first, it finished, a later instant was claimed, or its lease is held).
        """
        claims = self.claim_reruns([name], instant, holder).claims()
        return claims[0] if claims else None

    def claim_reruns(self, names: Iterable[str], instant: datetime, holder: str) -> ClaimBatch:
        """[claim_rerun][lease.LeaseStore.claim_rerun] for each of ``names``, rounds of one
        ``instant`` cut short: one statement and one new token for all of them (the sweep
        finds them by the thousand when a replica dies, or gives back an instant's claim
        that came back too late). None for an empty ``names``.

        Returns:
            The second runs won (``attempt`` 2), in the order of ``names``, each
            ``superseded`` as `claim_rerun` says.

        Raises:
            ValueError: ``instant`` is not an aware datetime with whole seconds, a name or
                ``holder`` is empty or too long.
        """
        wanted = _names(names)
        epoch = _instant_seconds(instant)
        check_holder(holder)
        if not wanted:
            return ClaimBatch(instant=instant, token=0, names=(), superseded={}, attempt=2)
        token = _new_token()
        now_ms = self._clock_ms()
        now = self._now(now_ms)
        among, params = self._among(wanted)
        stmt = (
            _t.update()
            .where(
                among,
                _t.c.instant == epoch,
                _t.c.attempt == 1,
                _t.c.state.in_(_UNFINISHED),
                _is_free(now),
                _t.c.paused_ms.is_(None),
            )
            .ordered_values(
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
                conn,
                stmt,
                _BATCH_COLUMNS,
                lambda: (_t.c.token == token, _t.c.name.in_(wanted)),
                tuples=True,
                **params,
            )
            self._held([(row[0], token) for row in rows], now_ms, epoch)
        won = {row[0] for row in rows}
        return ClaimBatch(
            instant=_from_seconds(epoch),
            token=token,
            names=tuple(name for name in wanted if name in won),
            superseded=gave_up(rows, epoch),
            attempt=2,
        )

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
        stmt = _t.update().where(held_here).values(expires_ms=now + self._ttl_ms)
        # Without RETURNING the SELECT after the UPDATE reuses its condition: a renewed
        # row now expires later, so it still holds; a row that was not renewed had
        # expired or changed hands, and still has, or has another token.
        with translate_errors("renew leases"), self._held_rows_transaction() as conn:
            rows = self._update_returning(conn, stmt, (_t.c.name,), lambda: (held_here,))
        renewed = {row["name"] for row in rows}
        self._held([pair for pair in pairs if pair[0] in renewed], now_ms)
        return renewed
