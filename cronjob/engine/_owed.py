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


def owe(state: JobState, held: datetime, instant: datetime, ttl: float) -> None:
    """Give ``state``'s round of ``instant``, whose claim gave up its job's unfinished
    round of ``held``, the instants that round kept from every claim (``held`` too), and
    the rows it held, if the job publishes its instants."""
    if not publishes(state.job):
        return
    owed = owed_instants(
        state.job.schedule, held, instant, ttl, before=state.before, changed=state.changed
    )
    _hand(state, instant, held, owed)


def owe_second_run(
    state: JobState,
    instant: datetime,
    issued: datetime,
    ttl: float,
    *,
    gave_up: datetime | None,
    expired: bool,
) -> None:
    """Give the second run of ``state``'s round of ``instant`` (claimed at ``issued``)
    what it owes, if its job publishes its instants: what the instant's first claim owed
    (``gave_up``: the unfinished round it gave up, which the row keeps through the second
    runs, see [lease.LeaseStore.claim_rerun][]), whether that claim was given back unrun
    or its round died; and, if the first run's lease ``expired`` (its replica died, it
    was not given back), the instants after ``instant`` that lease kept, up to now."""
    if not publishes(state.job) or (gave_up is None and not expired):
        return
    schedule, before, changed = state.job.schedule, state.before, state.changed
    owed: tuple[datetime, ...] = ()
    if gave_up is not None:
        owed = owed_instants(schedule, gave_up, instant, ttl, before=before, changed=changed)
    if expired:
        after = owed_instants(schedule, instant, issued, ttl, before=before, changed=changed)
        owed += tuple(at for at in after if at > instant)
    _hand(state, instant, instant if gave_up is None else gave_up, owed[:OWED_LIMIT])


def _hand(state: JobState, instant: datetime, held: datetime, owed: tuple[datetime, ...]) -> None:
    """Hand the round of ``instant`` the instants ``owed`` and the rows the dead round of
    ``held`` recorded and still held."""
    state.owed = Owed(instant, owed, takes_over=True)
    if not owed:
        return
    log.warning(
        "job %r: its round of %s died holding the lease over %d instant(s): the round of %s "
        "publishes them",
        state.job.name,
        held.isoformat(),
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


def owe_ran_over(state: JobState, held: datetime, ended: datetime, instant: datetime) -> None:
    """Give ``state``'s round of ``instant`` (just claimed) the instants of its hand-off
    job that the job's previous round, which held the lease from ``held`` (its instant,
    or its start if later) until ``ended``, kept from their claims: those after ``held``
    and before ``instant`` that came before that end (and `OWED_SLACK` after it: a claim
    is sent ahead of its instant).

    The replica that ran that round claims the latest of them as it ends (`owe_overrun`);
    if another replica's claim of a later instant, sent ahead, took the row first, that
    follow-up wins nothing, and only this claim can tell what the round kept. Where the
    follow-up did win, it owes the same instants (the outbox records each once)."""
    if not publishes(state.job):
        return
    end = min(instant, ended + timedelta(seconds=OWED_SLACK))
    kept = _between(state.job.schedule, held, end, OWED_LIMIT)
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
