"""The record beside the leases: the round history, the replicas on record, the
prune, the cut-short rounds and the survey each replica reads on its pass."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from ._claims import _is_free
from ._core import _IN_LIST_LIMIT, _h, _p, _q, _StoreCore, _t, logger
from ._exceptions import translate_errors
from ._records import (
    ReplicaRow,
    RoundRow,
    jobs_json,
    prune_statement,
    replica_from,
    round_from,
)
from ._rows import (
    _EPOCH,
    _MS,
    _UNFINISHED,
    CutShort,
    LeaseState,
    Survey,
    _from_seconds,
    _is_int,
    _names,
    _to_ms,
)
from ._text import check_holder


class _History(_StoreCore):
    """The history, the replicas, the prune, the survey: a part of :class:`~lease.LeaseStore`."""

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
