"""The ends of rounds: finish one or many, give one back cut short, keep one from a
second run (see the rules in `lease._store`)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ._claims import _is_running
from ._core import _h, _StoreCore, _t
from ._exceptions import translate_errors
from ._records import NOT_COUNTED, Ending, RoundRow, bounded_error, round_values
from ._rows import LeaseState, LeaseWrite, WriteKind, _check_token, _names, _seconds_floor


def _plain_where(stmt: sa.Update, where: sa.ColumnElement[bool]) -> sa.Update:
    """``stmt`` on the rows ``where`` selects, locked as its plan reads them."""
    return stmt.where(where)


def _carrying(stmt: sa.Update, cte: sa.CTE | None) -> sa.Update:
    """``stmt``, carrying the data-modifying ``cte`` if there is one."""
    return stmt if cte is None else stmt.add_cte(cte)


def _running_under(token: int) -> tuple[sa.ColumnElement[bool], ...]:
    """The rows whose round is still running under ``token``."""
    return (_t.c.token == _check_token(token), _is_running())


class _Ends(_StoreCore):
    """The ends of rounds: a part of [LeaseStore][lease.LeaseStore]."""

    def give_back(self, name: str, token: int, *, record: RoundRow | None = None) -> bool:
        """Give back the lease of a round cut short: state ``cut``, lease free at once.

        On record, the round ended ``'cut short'`` — or ``'given up'`` for a second run,
        which counts as one more failure in a row. ``record``, if given, is added to the
        history in the same transaction (in the same statement on PostgreSQL).

        Returns:
            ``True`` when the row still had ``token`` and was ``running``; ``False``
            when another claim replaced it (or the round already ended).
        """
        (wanted,) = _names([name])
        stmt = _t.update().where(_t.c.name == wanted, *_running_under(token)).values(self._cut())
        records = [] if record is None else [round_values(record)]
        carried = self._history_cte(records)  # PostgreSQL: one statement
        with translate_errors("give back a lease"), self._transaction() as conn:
            given = conn.execute(_carrying(stmt, carried)).rowcount == 1
            if records and carried is None:
                conn.execute(_h.insert(), records)
        if given:  # after the commit: a sweep it wakes must find it
            self._tell(LeaseWrite(kind=WriteKind.GIVEN_BACK, leases=((wanted, token),)))
        return given

    def give_back_all(self, names: Collection[str], token: int) -> int:
        """[give_back][lease.LeaseStore.give_back] for each of ``names``, leases of one
        claim (``token``) that will not run here (the claim came back too late, no thread
        could run them, a drain began before their instant): one statement for all of them,
        none for an empty ``names``.

        Returns:
            How many were given back (rows that still had ``token`` and were ``running``).
        """
        wanted = _names(names)
        if not wanted:
            return 0
        among, params = self._among(wanted)
        stmt = self._in_name_order(_t.update(), sa.and_(among, *_running_under(token)))
        stmt = stmt.values(self._cut())
        cut = _t.c.state == LeaseState.CUT.value
        with translate_errors("give back leases"), self._transaction() as conn:
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
        one), each with the same conditions as [finish][lease.LeaseStore.finish], and one
        INSERT of every history row given (on PostgreSQL carried by the first UPDATE, as a
        data-modifying ``WITH``: a batch of one group is one statement); with more than one
        UPDATE, a ``SELECT ... FOR UPDATE`` first locks the batch's rows in name order, the
        order a renewal locks them in. None for an empty ``ends``. An end with ``retrying``
        (an attempt followed by another, see [Ending][lease.Ending]) keeps its lease: the
        row stays ``running``, its attempt becomes 2, and its history row is added.

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
        in_order = self._in_name_order
        # PostgreSQL: the history rows ride on the batch's first UPDATE (one statement
        # fewer per batch); elsewhere they are inserted after the UPDATEs.
        recorded_cte = self._history_cte(records)
        carried = recorded_cte is not None  # every batch has an UPDATE to carry them
        with translate_errors(action), self._transaction() as conn:
            if len(groups) > 1:
                # Several UPDATEs whose names interleave: every row of the batch locked
                # first, in name order, as a renewal of them locks them (see
                # _lock_in_name_order); the UPDATEs then need no ordering of their own.
                batch = [(end.name, end.token) for end in endings]
                self._lock_in_name_order(conn, sa.and_(self._pair_in(batch), _is_running()))
                in_order = _plain_where
            for (ended_s, word, retrying), group in groups.items():
                pairs = [(end.name, end.token) for end in group]
                mine = self._pair_in(pairs)
                unique = set(pairs)
                if retrying:
                    # The lease stays held (the keeper renews it through the backoff);
                    # only the attempt moves on, so a cut from now on is given up.
                    stmt = in_order(_t.update(), sa.and_(mine, _is_running()))
                    stmt, recorded_cte = _carrying(stmt, recorded_cte), None
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
                stmt = in_order(_t.update(), sa.and_(mine, _is_running())).values(
                    state=LeaseState.DONE.value,
                    expires_ms=None,
                    skipped_through=ended_s,
                    last_end_ms=now,
                    **outcome,
                )
                stmt, recorded_cte = _carrying(stmt, recorded_cte), None
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
            if records and not carried:
                conn.execute(_h.insert(), records)
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
