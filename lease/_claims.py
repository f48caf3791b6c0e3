"""Claims and their lifecycle: claim, take a turn, claim a second run, renew, give
back, finish (see the rules in :mod:`lease._store`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import RowMapping

from ._core import _h, _StoreCore, _t, logger
from ._dialect import _db_now_ms
from ._exceptions import translate_errors
from ._records import (
    NOT_COUNTED,
    Ending,
    RoundRow,
    bounded_error,
    round_values,
)
from ._rows import (
    _UNFINISHED,
    Claim,
    ClaimBatch,
    LeaseState,
    LeaseWrite,
    WriteKind,
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


class _Claims(_StoreCore):
    """Claims and their lifecycle: a part of :class:`~lease.LeaseStore`."""

    if TYPE_CHECKING:

        def _ensure(self, wanted: list[str], specs: Mapping[str, str] | None) -> None:
            """Defined by :class:`~lease.LeaseStore` (the rows, in ``lease/_store.py``)."""

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

