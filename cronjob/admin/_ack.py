"""Acknowledging missed instants: an operator says why they did not run, and they stop
raising the alarm (``cronjob missed NAME --ack``).

An instant is missed when no replica ran it and no catch-up decided on it (see
`cronjob.admin._missed`). Running it is a backfill's job ([backfill][cronjob.admin.backfill]);
when it should not run (a planned stop, a job whose late rounds are worthless), the
operator acknowledges it instead: the acknowledgement goes on the job's lease row — up to
which instant, when, by whom, why — with a note in the history (`Why.ACK`), and the
instants up to it stop counting toward ``status``'s exit status, shown as acknowledged.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from ._base import UnknownJob, at_ms, aware, operator, store_on, to_ms
from ._job import Acknowledgement
from ._scheduled import refuse_removed

__all__ = ["acknowledge"]


def acknowledge(
    database: str | sa.Engine,
    name: str,
    *,
    until: datetime | None = None,
    reason: str | None = None,
    by: str | None = None,
    now: datetime | None = None,
) -> Acknowledgement:
    """Acknowledge the missed instants of job ``name`` up to ``until``: they stop counting
    as missed (`JobStatus.missed`, the exit status of ``cronjob status``) and show as
    acknowledged (`JobStatus.missed_acknowledged`). Instants after it raise the alarm as
    ever. An acknowledgement never lowers the one before (the later ``until`` stays), so
    it cannot bring an alarm back; who, when and why are the latest one's.

    Args:
        database: a URL, or an engine (not disposed).
        name: the job (or a schedule's id).
        until: the last instant acknowledged (whole seconds); ``now`` by default. A
            later one acknowledges the instants of a planned stop ahead of time.
        reason: why, at most `REASON_LENGTH` characters.
        by: who; ``user@host`` of this process by default.
        now: when, on the lease clock; the database's clock by default.

    Returns:
        The acknowledgement now on record.

    Raises:
        UnknownJob: no job ``name`` is on record (no lease row: nothing ever claimed or
            registered it), or ``name`` is a removed schedule's id; nothing was written.
        ValueError: ``reason`` is longer than `REASON_LENGTH`, ``by`` is empty or too
            long, ``until`` or ``now`` is naive; nothing was written.
        TablesMissing, SchemaOutdated, SchemaNewer: as [status][cronjob.admin.status].
    """
    who = operator() if by is None else by
    with store_on(database) as store:
        now_ms = store.now_ms() if now is None else to_ms(aware(now, "now"))
        through = at_ms(now_ms) if until is None else aware(until, "until")
        refuse_removed(store, name)
        done = store.acknowledge(
            name, through=through.replace(microsecond=0), by=who, reason=reason, now_ms=now_ms
        )
        if done is None:
            raise UnknownJob(f"no job named {name!r} is on record")
        row = store.read([name])[name]
    return Acknowledgement(through=done, at=row.acked, by=row.acked_by, reason=row.ack_reason)
