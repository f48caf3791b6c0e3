"""The ends of rounds: finish one or many, give one back cut short, keep one from a
second run (see the rules in `lease._store`)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ._claims import _is_running
from ._core import _h, _StoreCore, _t
from ._exceptions import translate_errors
from ._records import NOT_COUNTED, Ending, RoundRow, bounded_error, round_values
from ._rows import (
    LeaseState,
    LeaseWrite,
    WriteKind,
    _check_token,
    _json_rows,
    _names,
    _seconds_floor,
)


def _running_under(token: int) -> tuple[sa.ColumnElement[bool], ...]:
    """The rows whose round is still running under ``token``."""
    return (_t.c.token == _check_token(token), _is_running())


class _Ends(_StoreCore):
    """The ends of rounds: a part of [LeaseStore][lease.LeaseStore]."""

    def _ending(
        self,
        conn: Connection,
        stmt: sa.Update,
        pairs: set[tuple[str, int]],
        records: list[dict[str, Any]],
        read_back: Callable[[], set[tuple[str, int]]],
        later: list[dict[str, Any]] | None = None,
    ) -> set[tuple[str, int]]:
        """Run ``stmt``, an UPDATE that ends the rounds of ``pairs`` (``(name, token)``),
        and add to the history the rows of ``records`` (`round_values`) whose round
        it wrote, and no other: a history row is on record exactly when its end is.

        Returns the pairs written: all of them when the UPDATE's count says so (the
        common case: no row sent back to parse), else those ``read_back()`` reads within
        the same transaction.

        On PostgreSQL the history rows ride on the UPDATE, one statement: the UPDATE as a
        data-modifying ``WITH`` that returns the names it wrote, the INSERT of the rows
        of those names beside it, and a count of them as the statement's result. The
        rows come from one JSON parameter (see `_json_rows`): an ``executemany``
        would bind and send every row on its own, thousands when an instant's rounds end
        together. Elsewhere the driver's ``executemany`` inserts the rows written, after
        the UPDATE, or the caller does, with those of its other UPDATEs: they are added
        to ``later``, if given.
        """
        if self._postgres and records:
            ended = stmt.returning(_t.c.name).cte("ended")
            columns = [_h.c[column] for column in records[0]]
            rows = _json_rows("history", records, *columns)
            written = sa.select(*(rows.c[c.name] for c in columns)).where(
                rows.c.name.in_(sa.select(ended.c.name))
            )
            insert = _h.insert().from_select([c.name for c in columns], written).cte("recorded")
            count = sa.select(sa.func.count()).select_from(ended).add_cte(insert)
            if conn.execute(count).scalar_one() == len(pairs):
                return pairs
            return read_back()
        done = pairs if conn.execute(stmt).rowcount == len(pairs) else read_back()
        if records:
            names = {name for name, _token in done}
            kept = records if done is pairs else [r for r in records if r["name"] in names]
            if later is not None:
                later.extend(kept)
            elif kept:
                conn.execute(_h.insert(), kept)
        return done

    def give_back(self, name: str, token: int, *, record: RoundRow | None = None) -> bool:
        """Give back the lease of a round cut short: state ``cut``, lease free at once.

        On record, the round ended ``'cut short'`` — or ``'given up'`` for a second run,
        which counts as one more failure in a row. ``record``, if given, is added to the
        history in the same transaction (in the same statement on PostgreSQL), only if
        the lease is given back: a history row is on record exactly when its end is.

        Returns:
            ``True`` when the row still had ``token`` and was ``running``; ``False``
            when another claim replaced it (or the round already ended).
        """
        (wanted,) = _names([name])
        stmt = _t.update().where(_t.c.name == wanted, *_running_under(token)).values(self._cut())
        records = [] if record is None else [round_values(record)]
        with translate_errors("give back a lease"), self._transaction() as conn:
            given = bool(self._ending(conn, stmt, {(wanted, token)}, records, set))
        if given:  # after the commit: a sweep it wakes must find it
            self._tell(LeaseWrite(kind=WriteKind.GIVEN_BACK, leases=((wanted, token),)))
        return given

    def give_back_all(self, names: Collection[str], token: int) -> int:
        """Give back the leases of ``names``, rounds of one claim (``token``) that never
        started and will not run here (the claim came back too late, no thread could run
        them, a drain began before they started): one statement for all of them, none for
        an empty ``names``.

        Each is left owed as a round cut short at its first attempt (state ``cut``,
        attempt 1, ``'cut short'``, the failures in a row as they were), whatever the
        claim was: a first run, or a second run (`claim_reruns`) handed back unrun,
        which a sweep then claims again as a second run instead of giving it up.

        Returns:
            How many were given back (rows that still had ``token`` and were ``running``).
        """
        wanted = _names(names)
        if not wanted:
            return 0
        among, params = self._among(wanted)
        stmt = _t.update().where(among, *_running_under(token))
        stmt = stmt.values(
            state=LeaseState.CUT.value,
            expires_ms=None,
            last_end_ms=self._now(),
            last_outcome="cut short",
            attempt=1,
        )
        cut = _t.c.state == LeaseState.CUT.value
        with translate_errors("give back leases"), self._held_rows_transaction() as conn:
            # Without RETURNING (MariaDB), the rows of the token now cut: a row this token
            # had cut before is counted too, and nothing is harmed by hearing it again.
            given = self._update_returning(
                conn,
                stmt,
                (_t.c.name,),
                lambda: (_t.c.token == token, _t.c.name.in_(wanted), cut),
                tuples=True,
                **params,
            )
        if given:  # after the commit: a sweep it wakes must find them
            leases = tuple((row[0], token) for row in given)
            self._tell(LeaseWrite(kind=WriteKind.GIVEN_BACK, leases=leases))
        return len(given)

    def _cut(self) -> dict[sa.Column[Any], Any]:
        """What a give-back writes: state ``cut``, the lease free, the outcome ``'cut
        short'``, or ``'given up'`` for a second run (one more failure in a row)."""
        second = _t.c.attempt == 2
        return {
            _t.c.state: LeaseState.CUT.value,
            _t.c.expires_ms: None,
            _t.c.last_end_ms: self._now(),
            _t.c.last_outcome: sa.case((second, "given up"), else_="cut short"),
            _t.c.failures: sa.case(
                (second, sa.func.coalesce(_t.c.failures, 0) + 1), else_=_t.c.failures
            ),
        }

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
        with ``error``, bounded; a [Ending][lease.Ending]'s ``outcome`` word, see
        `COUNTED_FAILURES`), the end and the last success on the lease
        clock, the failures in a row; and ``record``, if given, is added to the history, all in
        the same transaction (one statement on PostgreSQL).

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
        """[finish][lease.LeaseStore.finish] for many rounds at once: [Ending][lease.Ending]
        values, or ``(name, token, ended)`` triples for rounds that succeeded without a
        record.

        One transaction; one UPDATE per distinct ``ended`` second and outcome (usually
        one), each with the same conditions as [finish][lease.LeaseStore.finish], and the
        history rows of the ends it wrote, and of no other (on PostgreSQL in the UPDATE's
        statement, see ``_ending``: a batch of one group is one statement; elsewhere one
        INSERT after it); with more than one UPDATE, a ``SELECT ... FOR UPDATE`` first locks
        the batch's rows in name order, the order ``pause --all`` locks them in (this
        process's renewals wait for the transaction: see ``_held_rows_transaction``).
        None for an empty
        ``ends``. An end with ``retrying`` (an attempt followed by another, see
        [Ending][lease.Ending]) keeps its lease: the row stays ``running``, its attempt
        becomes 2, and its history row is added. An end with ``holding`` (a round whose job
        outlived its timeout, recorded before its process ends) is written as any end, but
        the row stays ``running`` and held, its attempt 2.

        Returns:
            The ``(name, token)`` pairs whose end was recorded; every other one had its
            token replaced by another claim (or had already ended).
        """
        return self._finish(ends, "finish leases")

    def _finish(
        self, ends: Collection[tuple[str, int, datetime] | Ending], action: str
    ) -> set[tuple[str, int]]:
        # Grouped by (ended second, outcome word, retrying, holding).
        groups: dict[tuple[int, str, bool, bool], list[Ending]] = {}
        endings: list[Ending] = []
        for end in ends:
            if not isinstance(end, Ending):
                name, token, ended = end
                end = Ending(name=name, token=token, ended=ended)
            endings.append(end)
        _names([end.name for end in endings])  # the batch's names checked in one call
        last: tuple[int, str, bool, bool] | None = None
        group: list[Ending] = []
        for end in endings:
            _check_token(end.token)
            key = (_seconds_floor(end.ended, "ended"), end.word, end.retrying, end.holding)
            if key != last:  # ends of a batch come mostly in runs of one second and outcome
                group = groups.setdefault(key, [])
                last = key
            group.append(end)
        if not groups:
            return set()
        recorded: set[tuple[str, int]] = set()
        released: set[tuple[str, int]] = set()
        now = self._now()
        later: list[dict[str, Any]] = []  # the history rows to insert (not on PostgreSQL)
        # No renewal of this process runs meanwhile (see _held_rows_transaction).
        with translate_errors(action), self._held_rows_transaction() as conn:
            if len(groups) > 1 and self._engine.dialect.name != "sqlite":
                # Several UPDATEs whose names interleave: every row of the batch locked
                # first, in name order, as `pause --all` locks them and as a claim of
                # expired rows on MariaDB reads them; else a cycle with either.
                batch = self._pair_in([(end.name, end.token) for end in endings])
                conn.execute(
                    sa.select(_t.c.name)
                    .where(batch, _is_running())
                    .order_by(_t.c.name)
                    .with_for_update()
                ).close()
            for (ended_s, word, retrying, holding), group in groups.items():
                pairs = [(end.name, end.token) for end in group]
                mine = self._pair_in(pairs)
                records = [round_values(end.record) for end in group if end.record is not None]
                stmt = _t.update().where(mine, _is_running())

                def still_running(mine: sa.ColumnElement[bool] = mine) -> set[tuple[str, int]]:
                    # Rows these ends left running and held: a token is drawn per claim,
                    # so a running row with one of them is one written here.
                    again = sa.select(_t.c.name, _t.c.token).where(mine, _is_running())
                    return {(name, int(token)) for name, token in conn.execute(again)}

                if retrying:
                    # The lease stays held (the keeper renews it through the backoff);
                    # only the attempt moves on, so a cut from now on is given up.
                    stmt = stmt.values(attempt=2)
                    recorded |= self._ending(conn, stmt, set(pairs), records, still_running, later)
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
                if holding:
                    # The round is on record, but its job still runs: the lease stays
                    # held until it expires with the process, and attempt 2 keeps the
                    # round from a second run.
                    stmt = stmt.values(
                        attempt=2, skipped_through=ended_s, last_end_ms=now, **outcome
                    )
                    recorded |= self._ending(conn, stmt, set(pairs), records, still_running, later)
                    continue
                stmt = stmt.values(
                    state=LeaseState.DONE.value,
                    expires_ms=None,
                    skipped_through=ended_s,
                    last_end_ms=now,
                    **outcome,
                )

                def finished(
                    mine: sa.ColumnElement[bool] = mine, ended_s: int = ended_s
                ) -> set[tuple[str, int]]:
                    # A token is drawn per claim and ends once, so a row with one of
                    # these tokens that is now done was finished here.
                    done = sa.select(_t.c.name, _t.c.token).where(
                        mine,
                        _t.c.state == LeaseState.DONE.value,
                        _t.c.skipped_through == ended_s,
                    )
                    return {(name, int(token)) for name, token in conn.execute(done)}

                written = self._ending(conn, stmt, set(pairs), records, finished, later)
                recorded |= written
                released |= written
            if later:
                conn.execute(_h.insert(), later)
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
