"""The instants a hand-off job owes after a round of it kept them from every claim.

A job that publishes its instants (``cronjob.contrib.handoff``: its function's
``publishes`` is ``True``) must lose none of them: each is recorded in the outbox and
sent on its own. Two kinds of round keep an instant from its claims, which the lease
refuses while the round holds it:

- **A round that died.** A round whose replica died (kill -9) keeps the job's lease until
  it runs out, and every claim of the instants meanwhile is refused. The next round of
  the job on any replica — the claim that gives the dead round up, or the dead round's
  second run — is handed those instants (`owe`): it records them in the outbox beside
  its own and publishes them first, each under its own id (a row already recorded is
  not sent twice). A claim that gave it up and was then given back unrun, or died in
  turn, leaves them to its round's second run (`owe_second_run`): the lease row keeps
  the round that claim gave up through every second run. It also takes over the rows
  the dead round recorded and still held (``Owed.takes_over``): they are sent at once,
  not at the end of their hold.
- **A round that ran past its next instants.** A hand-off's round is bounded by its next
  instant, but a round claimed late (a second run, a catch-up) runs after instants of
  its own, and any round may overrun under load: the claims of the instants that fall
  while it holds the lease are refused, and the replica running it is the only one that
  knows (see ``cronjob.engine._overlap``). As it ends, that replica claims the latest of
  them at once and hands that round the others (`owe_overrun`), whatever the job's
  ``overlap`` policy: a hand-off never skips an instant as an overrun. If another
  replica's claim of a later instant takes the row before that follow-up, that claim
  owes them (`owe_ran_over`): the row tells when the round took the lease and ended.

A hand-off's round ends before its next instant, so a dead round's lease ran out at most
the lease's ttl after that instant; an instant later than that was free to claim, and
one nobody claimed then is the job's catch-up policy's (every replica was down).

What a claim owes is in its replica's memory until its round records it; a claim whose
round never does (killed right after it, or given back unrun: a drain met it, it came
back too late, no thread could take it) leaves it on the lease row alone. The claims
that replace such rounds keep the row's ``prev_start_ms`` (see ``lease._claims``), so
the row tells how long the lease was held before the round that takes it next, from the
last round that ran to its end: that claim (`owe_ran_over`, beside `owe`) or that second
run (`owe_second_run`'s ``held``) owes every instant of that hold, each recorded once.
A claim sent late (an overdue instant, a catch-up) owes the instants between its own and
its sending too: no claim won them, the lease it replaced refused them.

Dispatcher thread only.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Final

from .._registry import Job
from .._schedule import Schedule
from ._state import JobState, Owed, Run

__all__ = [
    "OWED_LIMIT",
    "OWED_SLACK",
    "first_kept",
    "owe",
    "owe_overrun",
    "owe_ran_over",
    "owe_second_run",
    "owed_instants",
    "publishes",
]

log = logging.getLogger("cronjob")

#: The most instants a dead hand-off round's lease held that the next round owes.
OWED_LIMIT: Final = 1000
#: Seconds past a hand-off round's lease that its instants may still have been refused:
#: the claims' lead, the grace, and a clock's drift.
OWED_SLACK: Final = 2.0
#: How far before its claim a round's lease counts from (the scheduler's wall clock is
#: read against its monotonic clock for the claim's time, see `first_kept`).
_CLAIM_SLACK: Final = timedelta(seconds=1)

_TICK = timedelta(microseconds=1)


def publishes(job: Job) -> bool:
    """Whether ``job``'s rounds publish their instants (a hand-off): it owes the instants
    its rounds kept from every claim."""
    return getattr(job.fn, "publishes", False) is True


def owe(
    state: JobState,
    held: datetime,
    instant: datetime,
    ttl: float,
    *,
    issued: datetime | None = None,
) -> None:
    """Give ``state``'s round of ``instant``, whose claim (sent at ``issued``) gave up its
    job's unfinished round of ``held``, the instants that round kept from every claim
    (``held`` too), and the rows it held, if the job publishes its instants.

    Those after ``instant`` too, up to when the claim was sent: a claim sent late (an
    instant overdue on a replica whose claims came back too late, a catch-up) takes the
    row only now, and the instants between its own and now had their claims refused by
    the lease it replaced (none won them: the row's instant was older). The round
    publishes them; the job goes on after the latest (see `first_kept`)."""
    if not publishes(state.job):
        return
    until = instant if issued is None else max(instant, issued)
    owed = owed_instants(
        state.job.schedule, held, until, ttl, before=state.before, changed=state.changed
    )
    _hand(state, instant, held, tuple(at for at in owed if at != instant))


def owe_second_run(
    state: JobState,
    instant: datetime,
    issued: datetime,
    ttl: float,
    *,
    gave_up: datetime | None,
    expired: bool,
    held: tuple[datetime, datetime] | None = None,
) -> None:
    """Give the second run of ``state``'s round of ``instant`` (claimed at ``issued``)
    what it owes, if its job publishes its instants: what the instant's first claim owed
    (``gave_up``: the unfinished round it gave up, which the row keeps through the second
    runs, see [lease.LeaseStore.claim_rerun][]), whether that claim was given back unrun
    or its round died; if the first run's lease ``expired`` (its replica died, it was not
    given back), the instants after ``instant`` that lease kept, up to now; and the
    instants the row says the lease kept before this claim (``held``: from when, until
    when, see [lease.ClaimBatch][]), up to now.

    The rule for ``held``: the first run never recorded what its claim owed for a round
    that ran past its instants (``owe_overrun``, ``owe_ran_over``: the row's previous
    round ended), nor, handed back, the instants its own lease kept after ``instant``
    until the give-back (the row's last end): a drain met it, or its claim came back too
    late. The row says both: the instants between when that round held the lease and
    that end (and `OWED_SLACK` after it) are owed here, each once."""
    if not publishes(state.job) or (gave_up is None and not expired and held is None):
        return
    schedule, before, changed = state.job.schedule, state.before, state.changed
    owed: tuple[datetime, ...] = ()
    if gave_up is not None:
        owed = owed_instants(schedule, gave_up, instant, ttl, before=before, changed=changed)
    if expired:
        after = owed_instants(schedule, instant, issued, ttl, before=before, changed=changed)
        owed += tuple(at for at in after if at > instant)
    if held is not None:
        start, end = held
        kept = _between(
            schedule, start, min(issued, end + timedelta(seconds=OWED_SLACK)), OWED_LIMIT
        )
        owed = tuple(sorted({*owed, *(at for at in kept if at != instant)}))
    dead = gave_up is not None or expired
    _hand(state, instant, instant if gave_up is None else gave_up, owed[:OWED_LIMIT], dead=dead)


def _hand(
    state: JobState,
    instant: datetime,
    held: datetime,
    owed: tuple[datetime, ...],
    *,
    dead: bool = True,
) -> None:
    """Hand the round of ``instant`` the instants ``owed`` and, if a round died holding
    the lease (``dead``), the rows that round of ``held`` recorded and still held."""
    state.owed = Owed(instant, owed, takes_over=dead)
    if not owed:
        return
    log.warning(
        "job %r: its round of %s %s the lease over %d instant(s): the round of %s publishes them",
        state.job.name,
        held.isoformat(),
        "died holding" if dead else "and the rounds before it, none on record, held",
        len(owed),
        instant.isoformat(),
    )


def owed_instants(
    schedule: Schedule,
    held: datetime,
    instant: datetime,
    ttl: float,
    *,
    before: Schedule | None = None,
    changed: datetime | None = None,
) -> tuple[datetime, ...]:
    """The instants of a hand-off job's ``schedule`` that its unfinished round of
    ``held`` kept from every claim, until the claim of ``instant`` gave it up, oldest
    first (at most `OWED_LIMIT`): ``held`` itself if it is an instant of the timing it
    was claimed under (its replica may have died before recording it), and each instant
    after it and before ``instant`` that came before that lease could have run out. A
    hand-off's round ends before its next instant (see ``cronjob.contrib.handoff``), so
    its lease ran out at most ``ttl`` seconds (and `OWED_SLACK`, for the claims' lead)
    after the instant that follows ``held``; a later instant was free to claim, and one
    nobody claimed is the catch-up policy's (every replica was down).

    A schedule made of data whose timing changed (``changed``, as this replica saw it;
    ``before``: the timing until then) after ``held`` was claimed: ``held`` and its bound
    are the earlier timing's, as the dead round was; the instants kept are the earlier
    timing's before the change and the new one's after it, none of the new timing's
    from before the change (they were never the job's)."""
    old = before if before is not None and changed is not None and changed > held else None
    timing = schedule if old is None else old
    following = timing.next(held)
    owed: list[datetime] = []
    if following is not None and timing.next(held - _TICK) == held:
        owed.append(held)
    if following is None:
        return tuple(owed)
    end = min(instant, following + timedelta(seconds=ttl + OWED_SLACK))
    if old is not None and changed is not None:
        owed += _between(old, held, min(end, changed), OWED_LIMIT - len(owed))
        owed += _between(schedule, changed - _TICK, end, OWED_LIMIT - len(owed))
        return tuple(owed)
    owed += _between(schedule, held, end, OWED_LIMIT - len(owed))
    return tuple(owed)


def _between(schedule: Schedule, after: datetime, end: datetime, limit: int) -> list[datetime]:
    """The instants of ``schedule`` after ``after`` and before ``end``, at most ``limit``."""
    found: list[datetime] = []
    at = schedule.next(after)
    while at is not None and at < end and len(found) < limit:
        found.append(at)
        at = schedule.next(at)
    return found


def first_kept(run: Run, now: datetime, mono: float) -> datetime | None:
    """The first instant of a hand-off job whose claims ``run``'s lease may have refused
    and that ``run`` did not publish: the first after its own instant and the instants it
    owed, and not before its claim was issued (``now`` and ``mono``: the scheduler's
    clocks read together)."""
    claimed = now - timedelta(seconds=max(0.0, mono - run.claimed_mono)) - _CLAIM_SLACK
    return run.state.job.schedule.next(max(run.ctx.instant, *run.ctx._owed, claimed))


def owe_overrun(state: JobState, first: datetime, ended: datetime) -> datetime:
    """A round of ``state``'s hand-off job held its lease over ``first`` and every
    instant after it up to its end (``ended``): their claims were refused. Return the
    latest of them, for this replica to claim at once, and hand that round the earlier
    ones (at most `OWED_LIMIT`, the oldest)."""
    schedule = state.job.schedule
    follow = schedule.prev(ended + _TICK) or first
    owed: list[datetime] = []
    at: datetime | None = first
    while at is not None and at < follow and len(owed) < OWED_LIMIT:
        owed.append(at)
        at = schedule.next(at)
    state.owed = Owed(follow, tuple(owed), takes_over=False)
    log.warning(
        "job %r: its round ran until %s, holding the lease over %d instant(s) from %s: the "
        "round of %s, claimed now, publishes them",
        state.job.name,
        ended.isoformat(),
        len(owed) + 1,
        first.isoformat(),
        follow.isoformat(),
    )
    return follow


def owe_ran_over(
    state: JobState,
    held: datetime,
    ended: datetime,
    instant: datetime,
    *,
    issued: datetime | None = None,
) -> None:
    """Give ``state``'s round of ``instant`` (just claimed, the claim sent at ``issued``)
    the instants of its hand-off job that the job's previous round, which held the lease
    from ``held`` (its instant, or its start if later) until ``ended``, kept from their
    claims: those after ``held`` and before ``instant`` (or before ``issued``, for a claim
    sent late: see `owe`) that came before that end (and `OWED_SLACK` after it: a claim
    is sent ahead of its instant). The row may tell of several rounds that never ran to
    their end as one hold, from the start of the round before them (see
    ``lease._previous.ended_round``).

    The replica that ran that round claims the latest of them as it ends (`owe_overrun`);
    if another replica's claim of a later instant, sent ahead, took the row first, that
    follow-up wins nothing, and only this claim can tell what the round kept. Where the
    follow-up did win, it owes the same instants (the outbox records each once)."""
    if not publishes(state.job):
        return
    until = instant if issued is None else max(instant, issued)
    end = min(until, ended + timedelta(seconds=OWED_SLACK))
    kept = [at for at in _between(state.job.schedule, held, end, OWED_LIMIT) if at != instant]
    if not kept:
        return
    known = state.owed if state.owed is not None and state.owed.instant == instant else None
    owed = tuple(sorted({*kept, *(known.instants if known is not None else ())}))[:OWED_LIMIT]
    state.owed = Owed(instant, owed, takes_over=known is not None and known.takes_over)
    log.warning(
        "job %r: its round holding the lease from %s ran until %s, over %d instant(s): the "
        "round of %s publishes them",
        state.job.name,
        held.isoformat(),
        ended.isoformat(),
        len(kept),
        instant.isoformat(),
    )
