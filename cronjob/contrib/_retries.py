"""How long a hand-off keeps trying: the outbox's holds, the round's retries and its bound.

A hand-off's round (``Handoff.__call__``) retries a refused send after `RETRY_PAUSES`
(the Relay peer's 100 ms, 500 ms, 2 s, 5 s), within `round_bound`: shortly before the
job's next instant unless ``retry_within`` was given, so that no round runs into the
next instant's claim. A round whose occurrence is not accepted within it fails with
`NotPublished`; the sweep then retries the row after `retry_pause` (doubling, at most
`RETRY_LONGEST`), as long as it takes. See docs/concepts/outbox.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from itertools import pairwise
from typing import TYPE_CHECKING, Final

from .._clock import SystemClock
from .._exceptions import RegistrationError

if TYPE_CHECKING:
    from .._round import Round
    from .._schedule import Schedule

log = logging.getLogger("cronjob")

__all__ = [
    "HOLD_SECONDS",
    "INVALID_FIRST",
    "RETRY_FIRST",
    "RETRY_LONGEST",
    "RETRY_PAUSES",
    "RETRY_WITHIN",
    "SEND_LEAST",
    "SEND_TIMEOUT",
    "NotPublished",
    "invalid_pause",
    "knobs",
    "retry_pause",
    "round_bound",
    "shortest_gap",
    "warn_overrun",
]

#: Seconds an attempt to send keeps its outbox row from every other retrier (the sweep
#: of each replica); past them, a replica that died while sending is retried for.
HOLD_SECONDS: Final = 10.0
#: Seconds before the sweep's first retry of a send that failed; each retry doubles it.
RETRY_FIRST: Final = 1.0
#: The longest pause between two retries, in seconds (the sweep's).
RETRY_LONGEST: Final = 60.0
#: Seconds a row that cannot be sent (see ``_outbox.row_problem``) is first put off.
INVALID_FIRST: Final = 5.0
#: The pauses of the round's own retries of a refused send (the Relay peer's: five
#: attempts in all), each only if it ends before the round's bound.
RETRY_PAUSES: Final = (0.1, 0.5, 2.0, 5.0)
#: Seconds the round retries a refused send when its job has no next instant to bound
#: it (a manual round of a job with none); otherwise up to shortly before that instant.
RETRY_WITHIN: Final = 10.0
#: The longest wait for the broker's answer to one send, in seconds (real time, like a
#: socket timeout), unless the hold is shorter: then half the hold.
SEND_TIMEOUT: Final = 20.0
#: The part of the gap to its next instant a round leaves free (at most `_MARGIN_MAX`
#: seconds): the next instant's claims go out ahead of it, and must find the lease free.
_MARGIN_SHARE: Final = 0.2
_MARGIN_MAX: Final = 1.0
#: The shortest wait for an answer a send near the round's bound is given, in seconds.
SEND_LEAST: Final = 0.05


#: How many of a cron schedule's next instants `Handoff.check_period` reads for the
#: shortest gap between two (an ``@every`` schedule's period is exact).
_GAP_INSTANTS: Final = 10
#: How many specs a hand-off keeps read (`Handoff.check_period`) before it starts anew.
_GAPS_KEPT: Final = 1000


class NotPublished(RuntimeError):
    """A hand-off round's occurrence was not accepted within the round's retries.

    The round ends failed (its consecutive failures, its ``on_failure`` hook, a
    self-pause and ``status`` see it); its outbox row stays owed, and the sweep of every
    replica goes on sending it with the same id."""


def invalid_pause(tries: int) -> float:
    """Seconds a row that cannot be sent is put off after ``tries`` reads of it:
    `INVALID_FIRST`, doubling, at most `RETRY_LONGEST` (it is logged each time)."""
    return min(RETRY_LONGEST, INVALID_FIRST * float(2 ** min(16, max(0, tries - 1))))


def retry_pause(tries: int) -> float:
    """The sweep's pause before the retry that follows ``tries`` failed attempts, in
    seconds."""
    return min(RETRY_LONGEST, RETRY_FIRST * float(2 ** max(0, tries - 1)))


def round_bound(ctx: Round, retry_within: float | None) -> float:
    """Seconds from now a hand-off's round may go on sending and retrying:
    ``retry_within`` if it was given; else until shortly before the job's next instant
    (a fifth of the gap, at most a second, is left for the next instant's claims), or
    `RETRY_WITHIN` when there is none. Never below zero.

    A round run late (a second run, a catch-up: its next instant has passed already)
    has the instants a dead round kept to send, or its own, long due: it may run over
    the next instant to come, whose claim its lease refuses (the engine has that
    instant claimed and published as the round ends, see ``cronjob.engine._owed``), and
    stops shortly before the one after. Bounded by its own next instant, it would give
    each send a few milliseconds and leave the rest to the sweep, up to a hold later."""
    if retry_within is not None:
        return retry_within
    schedule = ctx._schedule
    following = None if schedule is None else schedule.next(ctx.instant)
    if following is None or schedule is None:
        return RETRY_WITHIN
    now = ctx._clock.now()
    gap = (following - ctx.instant).total_seconds()
    if following <= now:
        upcoming = schedule.next(now)
        following = None if upcoming is None else schedule.next(upcoming)
        if upcoming is None or following is None:
            return RETRY_WITHIN
        gap = (following - upcoming).total_seconds()
    margin = min(_MARGIN_MAX, gap * _MARGIN_SHARE)
    return max(0.0, (following - now).total_seconds() - margin)


def shortest_gap(schedule: Schedule, now: datetime) -> float | None:
    """The shortest gap between two instants of ``schedule``, in seconds: an ``@every``
    schedule's period, else the shortest between its next ten instants after
    ``now``; ``None`` when fewer than two are left (a one-off, an end near)."""
    if schedule.period is not None:
        return float(schedule.period)
    instants: list[datetime] = []
    at: datetime | None = now
    while at is not None and len(instants) < _GAP_INSTANTS:
        at = schedule.next(at)
        if at is not None:
            instants.append(at)
    gaps = [(later - earlier).total_seconds() for earlier, later in pairwise(instants)]
    return min(gaps, default=None)


def warn_overrun(
    name: str,
    schedule: Schedule,
    given: Mapping[str, float],
    gaps: dict[str, float | None],
    now: datetime | None,
) -> None:
    """`Handoff.check_period`'s warning: the knobs ``given`` (seconds by name) against
    the shortest gap of ``schedule`` (read once per spec, kept in ``gaps``)."""
    if not given or schedule.spec in gaps:
        return
    if len(gaps) >= _GAPS_KEPT:
        gaps.clear()
    gap = shortest_gap(schedule, SystemClock().now() if now is None else now)
    gaps[schedule.spec] = gap
    longest = sum(given.values())
    if gap is None or longest < gap:
        return
    log.warning(
        "job %r: %s may keep a round of this hand-off sending for %gs, which reaches "
        "the %gs between two of its instants: the next instant would come due while "
        "it still sends; lower it, or leave it unset to have it derived from the period",
        name,
        " + ".join(f"{key}={value:g}s" for key, value in given.items()),
        longest,
        gap,
    )


def knobs(
    retry_within: float | None, hold: float | None, send_timeout: float | None
) -> tuple[float, float]:
    """The hold and send timeout of a hand-off whose knobs are these (``None``: derived),
    checked.

    Raises:
        RegistrationError: ``retry_within`` is not a number of seconds >= 0, ``hold``
            not > 0, or ``send_timeout`` not between 0 and ``hold``.
    """
    if retry_within is not None and (
        not isinstance(retry_within, int | float) or not retry_within >= 0
    ):
        raise RegistrationError(
            f"handoff: retry_within must be a number of seconds >= 0, got {retry_within!r}"
        )
    if hold is None:
        hold = HOLD_SECONDS
    if not isinstance(hold, int | float) or not hold > 0:
        raise RegistrationError(f"handoff: hold must be a number of seconds > 0, got {hold!r}")
    if send_timeout is None:
        send_timeout = min(SEND_TIMEOUT, hold / 2)
    if not isinstance(send_timeout, int | float) or not 0 < send_timeout < hold:
        raise RegistrationError(
            f"handoff: send_timeout must be a number of seconds > 0 and below the hold "
            f"({hold:g}s), got {send_timeout!r}"
        )
    return float(hold), float(send_timeout)
