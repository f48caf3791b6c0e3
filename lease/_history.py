"""The record beside the leases: the round history, the replicas on record, the
prune, the cut-short rounds and the survey each replica reads on its pass."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection

from ._claims import _is_free
from ._core import _IN_LIST_LIMIT, _h, _p, _q, _StoreCore, _t, logger
from ._exceptions import translate_errors
from ._records import (
    ReplicaRow,
    RoundRow,
    job_needles,
    jobs_json,
    lists_one_of,
    prune_statement,
    replica_from,
    round_from,
    round_values,
)
from ._rows import (
    _EPOCH,
    _MS,
    UNFINISHED_ROWS,
    CutShort,
    LeaseState,
    Survey,
    _from_seconds,
    _is_int,
    _names,
    _to_ms,
)
from ._text import check_holder

#: A backfill's instants, as `lease.BACKFILL_MARK` and the open states of
#: `lease.TriggerState` say (``_trigger`` builds on this module: no import of it here).
_BACKFILL_MARK = 2
_BACKFILL_OPEN = ("queued", "running", "cut")


def _jobs_of(replica: ReplicaRow) -> dict[str, str]:
    """The execution parameter of `_History._replica_upsert`: the record's jobs."""
    return {"replica_jobs": jobs_json(replica.jobs, replica.policies, replica.tasks)}


class _History(_StoreCore):
    """The history, the replicas, the prune, the survey: a part of
    [LeaseStore][lease.LeaseStore]."""

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

    def add_rounds(self, records: Collection[RoundRow]) -> None:
        """Add ``records`` to the history, touching no lease row: the rounds given up
        whose lease is no longer theirs to write (lost, or replaced by a later claim),
        which must still be on record. One statement; none for an empty ``records``.
        """
        if not records:
            return
        values = [round_values(record) for record in records]
        with translate_errors("add rounds to the history"), self._transaction() as conn:
            conn.execute(_h.insert(), values)

    def replicas(
        self, *, seen_since_ms: int, holders: Collection[str] | None = None
    ) -> list[ReplicaRow]:
        """The holders on record last seen at or after ``seen_since_ms`` (lease clock),
        whole (each one's jobs too: ~50 bytes a job); with ``holders``, only those."""
        stmt = sa.select(_p).where(_p.c.seen_ms >= seen_since_ms).order_by(_p.c.holder)
        if holders is not None:
            stmt = stmt.where(_p.c.holder.in_(sorted(holders)))
        with translate_errors("read replicas"), self._transaction(read=True) as conn:
            return [replica_from(row) for row in conn.execute(stmt).mappings()]

    def leasing(
        self, holders: Collection[str], jobs: Mapping[str, str], *, seen_since_ms: int
    ) -> dict[str, tuple[datetime, bool]]:
        """Of ``holders``, those on record last seen at or after ``seen_since_ms`` (lease
        clock), each with its record's ``started`` and whether the record lists one of
        ``jobs`` (name -> spec) as leased: what a replica's peers ask of a replica that
        started, without the rest of its record (see `lists_one_of`: a record of
        the same deployment answers from its text, unparsed). One query; none for no
        ``holders``."""
        if not holders:
            return {}
        stmt = sa.select(_p.c.holder, _p.c.started_ms, _p.c.jobs).where(
            _p.c.seen_ms >= seen_since_ms, _p.c.holder.in_(sorted(holders))
        )
        needles = job_needles(jobs)
        found: dict[str, tuple[datetime, bool]] = {}
        with translate_errors("read replicas"), self._transaction(read=True) as conn:
            for holder, started_ms, text in conn.execute(stmt):
                started = _EPOCH + int(started_ms) * _MS
                found[holder] = (started, lists_one_of(text, jobs, needles))
        return found

    def replica_starts(self, *, seen_since_ms: int) -> dict[str, datetime]:
        """The holders on record last seen at or after ``seen_since_ms`` (lease clock),
        each with its record's ``started``, and nothing of their jobs: a few bytes a
        replica. One query.

        A record's jobs and policies are written whole only with the ``started`` of the
        replica that writes them (see [survey][lease.LeaseStore.survey]'s ``refresh``): a
        reader that keeps what it learnt of a record by ``(holder, started)`` reads the jobs
        again (with [replicas][lease.LeaseStore.replicas] and ``holders``) only for a pair
        it has not seen, a replica that started since."""
        stmt = sa.select(_p.c.holder, _p.c.started_ms).where(_p.c.seen_ms >= seen_since_ms)
        with translate_errors("read replicas"), self._transaction(read=True) as conn:
            rows = conn.execute(stmt).all()
        return {holder: _EPOCH + int(started) * _MS for holder, started in rows}

    def record_replica(self, replica: ReplicaRow) -> None:
        """Put ``replica`` on record as seen now (lease clock; its ``seen`` is ignored):
        insert, or refresh. One statement. [survey][lease.LeaseStore.survey] can do it on
        its way."""
        stmt = self._replica_upsert(replica)
        with translate_errors("record a replica"), self._transaction() as conn:
            conn.execute(stmt, _jobs_of(replica))

    def remove_replica(self, holder: str, *, started: datetime) -> bool:
        """Take ``holder``'s record off the table, if it is still the one of the replica
        that started at ``started`` (a replica that started again under the same id
        since keeps its own): what a replica does as it stops cleanly, so that it leaves
        the live list at once rather than a minute after its last sweep. One statement.

        Returns:
            Whether a record was deleted.
        """
        stmt = _p.delete().where(
            _p.c.holder == check_holder(holder), _p.c.started_ms == _to_ms(started)
        )
        with translate_errors("remove a replica's record"), self._transaction() as conn:
            return bool(conn.execute(stmt).rowcount)

    def forget(
        self, name: str, *, unless_held: bool = False, now_ms: int | None = None
    ) -> tuple[bool, int, int] | None:
        """Delete everything on record of ``name``: its lease row, its rounds in the
        history and its requests for a round now, in one transaction. A caller checks
        first that no live replica registers it (a replica that does would write the
        row again, and the minute check of one that starts meanwhile recreates it).

        With ``unless_held``, nothing is deleted while a round holds the row's lease
        (its expiry is later than ``now_ms``, the lease clock's now by default): the
        row's delete is conditional, in the same transaction, so a claim that commits
        first wins and a round never finds its row gone under it.

        Returns:
            Whether a lease row was deleted, and how many rounds and requests were;
            ``None`` (``unless_held`` only) when a round held the lease: nothing deleted.

        Raises:
            ValueError: ``name`` is not a name the table holds (see `ensure`).
        """
        (wanted,) = _names([name])
        where = [_t.c.name == wanted]
        if unless_held:
            where.append(_is_free(self._now(now_ms)))
        with translate_errors("forget a job"), self._transaction() as conn:
            row = conn.execute(_t.delete().where(*where)).rowcount
            if unless_held and not row:
                held = sa.select(_t.c.name).where(_t.c.name == wanted)
                if conn.execute(held).first() is not None:
                    return None  # nothing deleted: the transaction ends empty
            rounds = conn.execute(_h.delete().where(_h.c.name == wanted)).rowcount
            requests = conn.execute(_q.delete().where(_q.c.name == wanted)).rowcount
        return bool(row), rounds, requests

    def _put_on_record(self, conn: Connection, replica: ReplicaRow, *, refresh: bool) -> None:
        """Put ``replica`` on record in ``conn``'s transaction: with ``refresh``, its
        ``seen`` only (one UPDATE), and the whole record (one more) if that found none."""
        if refresh and conn.execute(self._replica_refresh(replica.holder)).rowcount:
            return
        conn.execute(self._replica_upsert(replica), _jobs_of(replica))

    def _replica_refresh(self, holder: str) -> sa.Update:
        """``seen_ms`` of ``holder``'s record brought to now, nothing else written."""
        return _p.update().where(_p.c.holder == check_holder(holder)).values(seen_ms=self._now())

    def _replica_upsert(self, replica: ReplicaRow) -> sa.Insert:
        check_holder(replica.holder)
        values: dict[str, Any] = {
            "holder": replica.holder,
            "host": replica.host[:255],
            "pid": replica.pid,
            "version": replica.version[:64],
            "started_ms": _to_ms(replica.started),
            "seen_ms": self._now(),
            # Bound at execution (see _jobs_of), not in the statement: SQLAlchemy's cache
            # of compiled statements keeps the values of the first statement of a shape,
            # and this one is ~5 MB at 100,000 jobs.
            "jobs": sa.bindparam("replica_jobs", type_=sa.Text()),
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
        `lease.REQUEST_TTL`), in one transaction. A backfill's instants not yet done
        (queued, running, cut short) are kept, however old: a backfill left by its
        replicas resumes at the next start.

        Ranking a name's rounds reads the whole history (about 3 s for a million rows
        on a busy 2-core machine), so these statements have a bound of their own,
        ``timeout`` seconds, not `statement_timeout`.

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
            # A backfill not yet done is no request for a round now: it waits for a
            # replica however long, and is cancelled only on purpose.
            left = sa.and_(_q.c.forced == _BACKFILL_MARK, _q.c.state.in_(_BACKFILL_OPEN))
            conn.execute(_q.delete().where(_q.c.requested_ms < cutoff, sa.not_(left)))
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

    def survey(
        self, names: Iterable[str], *, replica: ReplicaRow | None = None, refresh: bool = False
    ) -> Survey:
        """[find_cut_short][lease.LeaseStore.find_cut_short], and the earliest expiry of a
        first round's lease still held (the next moment a round of ``names`` may be found
        cut short without any write before it). One query, whatever the number of names.

        With ``replica``, the replica is put on record as seen now too (as
        [record_replica][lease.LeaseStore.record_replica]), in the same statement on
        PostgreSQL (a data-modifying ``WITH``), in the same transaction elsewhere (two
        statements).

        With ``refresh`` too, only the record's ``seen`` is brought to now (an UPDATE of
        one column, in place of the upsert of every job's spec): for a replica whose
        record an earlier survey wrote whole since it started. A record the refresh
        finds missing (pruned as gone, deleted by hand, a database restored) is written
        whole again, in the same transaction (one more statement, that time only)."""
        wanted = _names(names)
        if not wanted:
            if replica is not None:
                with translate_errors("record a replica"), self._transaction() as conn:
                    self._put_on_record(conn, replica, refresh=refresh)
            return Survey(cut_short=[], next_expiry=None)
        now = self._now()
        select = sa.select(
            _t.c.name, _t.c.instant, _t.c.state, _t.c.expires_ms, _is_free(now).label("free")
        ).where(UNFINISHED_ROWS)
        if len(wanted) <= _IN_LIST_LIMIT:
            select = select.where(_t.c.name.in_(wanted))
        stmt: sa.Select[Any] | sa.CompoundSelect[Any] = select
        folded = replica is not None and self._postgres  # into the survey's statement
        if replica is not None and folded and refresh:
            # A row of NULLs after the survey's rows, there if the refresh found the record.
            seen = self._replica_refresh(replica.holder).returning(_p.c.holder).cte("seen")
            stmt = sa.union_all(select, sa.select(*[sa.null()] * 5).select_from(seen))
        elif replica is not None and folded:
            stmt = select.add_cte(self._replica_upsert(replica).returning(_p.c.holder).cte("seen"))
        read = replica is None
        with translate_errors("find rounds cut short"), self._transaction(read=read) as conn:
            if replica is not None and not folded:
                self._put_on_record(conn, replica, refresh=refresh)
            whole = replica is not None and folded and not refresh
            rows = conn.execute(stmt, _jobs_of(replica) if replica and whole else {}).all()
            if replica is not None and folded and refresh and None not in (r[0] for r in rows):
                # The refresh found no record.
                conn.execute(self._replica_upsert(replica), _jobs_of(replica))
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
