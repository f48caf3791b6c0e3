"""What a hand-off needs of the outbox besides its round and its sweep: the check of a
row before it is sent again, the row's claim and mark, and the measurements of a round's
publication.

``Handoff.resend`` (and a second run) never sends a row `row_problem` finds fault with.
A round's send, once accepted or refused, is measured with `count_accepted` and
`count_refused` (``cronjob.outbox.*``, see ``cronjob.engine._metrics``), through the
job's measurements that the scheduler gave its round.
"""

from __future__ import annotations

import logging
import weakref
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import lease

from .._occurrence import occurrence_id
from ..engine import Resent, Run
from . import _marks
from ._retries import invalid_pause
from ._sender import Occurrence

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .._round import Round
    from ..engine import JobMetrics

__all__ = [
    "claim",
    "count_accepted",
    "count_refused",
    "mark",
    "occurrence_of",
    "put_off_invalid",
    "row_problem",
    "to_send",
]

log = logging.getLogger("cronjob")


def row_problem(row: lease.OutboxRow) -> str | None:
    """Why ``row`` cannot be sent as it is, or ``None``: it does not decode
    (`lease.OutboxRow.problem`), its payload lacks its headers or has a field of the
    wrong type, or its id is not `cronjob.occurrence_id` of its name, instant and app
    (the derivation every replica and worker uses)."""
    if row.problem is not None:
        return row.problem
    payload = row.payload
    headers = payload.get("headers")
    if not isinstance(headers, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in headers.items()
    ):
        return f"its payload's headers are missing or not text: {headers!r:.100}"
    for field in ("app", "args", "trigger"):
        if not isinstance(payload.get(field, ""), str):
            return f"its payload's {field} is not text: {payload[field]!r:.100}"
    app = payload.get("app", "")
    try:
        derived = occurrence_id(row.name, row.instant, app=app)
    except (TypeError, ValueError) as exc:
        return f"its occurrence id cannot be derived: {exc}"
    if derived != row.id:
        return (
            f"its id is not the occurrence id of {row.name!r} at "
            f"{row.instant.isoformat()}{f' in app {app!r}' if app else ''} ({derived})"
        )
    return None


def count_accepted(ctx: Round, occurrence: Occurrence, target: str, at: datetime) -> None:
    """Measure that the broker accepted, at ``at``, the publication of the round ``ctx``:
    ``cronjob.outbox.published`` (``republished`` for an occurrence sent again, a second
    run's) and the latency from its instant. Nothing for a round no scheduler made."""
    metrics = _metrics_of(ctx)
    if metrics is not None:
        metrics.published(target, occurrence.instant, at, again=occurrence.again)


def count_refused(ctx: Round, target: str) -> None:
    """Measure that a send of the round ``ctx`` was refused (``cronjob.outbox.refused``)."""
    metrics = _metrics_of(ctx)
    if metrics is not None:
        metrics.refused(target)


def _metrics_of(ctx: Round) -> JobMetrics | None:
    """The measurements of the job of ``ctx``'s round; ``None`` for a round no scheduler
    made (``cronjob.testing.make_round``), or one it has let go of."""
    held = ctx._run
    run = held() if isinstance(held, weakref.ref) else held
    return run.state.metrics if isinstance(run, Run) else None


def claim(
    engine: Engine, id: str, seen: int, next_try_ms: int, *, error: str | None = None
) -> bool:
    with engine.begin() as conn:
        return lease.claim_publication(
            conn, id, seen_next_try_ms=seen, next_try_ms=next_try_ms, error=error
        )


def mark(engine: Engine, id: str, now_ms: int) -> None:
    """Mark ``id`` sent at ``now_ms`` (once the broker accepted it), batched with the
    marks other rounds are writing meanwhile (`cronjob.contrib._marks`)."""
    _marks.mark(engine, id, now_ms)


def put_off_invalid(engine: Engine, row: lease.OutboxRow, problem: str, now_ms: int) -> Resent:
    """Keep ``row`` unsent and put it off (`invalid_pause` of its tries: 5 s, doubling,
    up to a minute: a row does not mend itself), its ``problem`` on record as its error;
    log it at ERROR once per put-off (by the replica whose sweep took it)."""
    later = now_ms + round(invalid_pause(row.tries + 1) * 1000)
    if not claim(engine, row.id, row.next_try_ms, later, error=f"invalid: {problem}"):
        return Resent.NOT_CLAIMED
    log.error(
        "job %r: occurrence %s is never sent as it is: %s; it is kept unsent (repair or "
        "delete the row)",
        row.name,
        row.id,
        problem,
    )
    return Resent.INVALID


def occurrence_of(row: lease.OutboxRow) -> Occurrence:
    """The occurrence ``row`` records, to send again under its id.

    Raises:
        ValueError: ``row`` cannot be sent as it is (see `row_problem`): nothing is ever
            sent under an id that is not its occurrence's.
    """
    problem = row_problem(row)
    if problem is not None:
        raise ValueError(problem)
    payload = row.payload
    return Occurrence(
        id=row.id,
        name=row.name,
        instant=row.instant.astimezone(UTC),
        headers=dict(payload["headers"]),
        app=payload.get("app", ""),
        again=True,
        args=payload.get("args", "{}"),
        trigger=payload.get("trigger", "schedule"),
    )


def to_send(
    engine: Engine,
    name: str,
    recorded: list[tuple[Occurrence, lease.OutboxRow, bool]],
    dead: list[lease.OutboxRow],
    *,
    now_ms: int,
    hold_ms: int,
) -> list[tuple[Occurrence, int]]:
    """What a round of job ``name`` sends, oldest instant first, each held by it until
    the paired ms (``now_ms + hold_ms``): of the rows it ``recorded`` (occurrence, row,
    whether it wrote it), the new ones, and those on record already that are unsent and
    due (claimed, as the sweep does); and every row of ``dead``, rows a round of the job
    that died held (claimed from their recorded next try: a sweep that took one first
    keeps it). A row on record that is sent is not sent again; one held by an attempt
    that is not the dead round's is left to it and the sweep; a row of ``dead`` that
    cannot be sent as it is is left to the sweep, which puts it off and logs it."""
    until = now_ms + hold_ms
    taken = {row.id: row for row in dead}
    sends: list[tuple[Occurrence, int]] = []
    for occurrence, row, new in recorded:
        held_by_dead = taken.pop(row.id, None) is not None
        if row.sent_ms is not None:
            log.info("job %r: occurrence %s was sent already", name, occurrence.id)
        elif new:
            sends.append((occurrence, until))
        elif row.next_try_ms > now_ms and not held_by_dead:
            # That attempt, or the sweep once the hold ends, sends it.
            log.info(
                "job %r: occurrence %s is held by an attempt to send it; not sent again",
                name,
                occurrence.id,
            )
        elif claim(engine, row.id, row.next_try_ms, until):
            sends.append((occurrence_of(row), until))
    for row in taken.values():
        if row_problem(row) is None and claim(engine, row.id, row.next_try_ms, until):
            sends.append((occurrence_of(row), until))
    if dead:
        log.warning(
            "job %r: %d occurrence(s) recorded by a round that died holding the lease were "
            "held unsent; this round sends them now",
            name,
            len(dead),
        )
    return sorted(sends, key=lambda send: send[0].instant)
