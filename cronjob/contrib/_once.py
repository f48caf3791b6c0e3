"""A worker's body run once per occurrence id: what every target's ``once`` shares.

Task systems deliver at least once: a message may come twice (a replica that died between
its send and its mark sends it again, with the same id; a broker redelivers a message
whose worker died). `run_once` turns that into effectively once: the body runs only if an
insert of the id into the lease database's once-table is new ([lease.begin_once][]).

- The body returns: the id is marked done; a later delivery runs nothing.
- The body raises: the row is deleted and the error goes on, so a redelivery (the task
  system's retry) runs the body again. If deleting the row fails too, the body's error
  still goes on (the deletion's is logged and noted on it); the row then stays
  *running* until ``stale_after``, as if the worker had died.
- The worker dies in the body: the row stays *running*; a delivery within
  ``stale_after`` seconds of its start raises [OccurrenceBusy][cronjob.contrib.OccurrenceBusy]
  (the task system may retry it later), one after that takes the row over and runs it.

`run_claimed` checks a delivery that cronjob published before it runs it (the checks of
`cronjob.contrib._validation`): its id must be the one recomputed from its app, schedule
and instant (else [InvalidOccurrence][cronjob.contrib.InvalidOccurrence] is raised, and
nothing runs); an occurrence never started whose schedule nothing names any more (no
registered job, no schedule row) is obsolete: it returns ``None`` without running, so
the task system acknowledges it as done; an instant that is no firing of the schedule's
current spec raises ``InvalidOccurrence``, unless the round was manual.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Final, TypeVar

import sqlalchemy as sa

import lease

from .._clock import Clock, SystemClock
from .._exceptions import CronjobError
from .._registry import Registry, default_registry
from ..engine import resolve_database
from ._validation import Claim, check_claim, check_identity

__all__ = ["STALE_AFTER", "OccurrenceBusy", "run_claimed", "run_once"]

log = logging.getLogger("cronjob")

T = TypeVar("T")

#: Seconds after which a body still marked running is taken to be dead (its worker was
#: killed) and a redelivery may run it. Longer than any body should take.
STALE_AFTER: Final = 3600.0

_engines: dict[str, sa.Engine] = {}
_engines_lock = threading.Lock()
_SYSTEM = SystemClock()


class OccurrenceBusy(CronjobError, RuntimeError):
    """Raised when a delivery finds the body of its occurrence id running elsewhere
    (started less than ``stale_after`` seconds ago): not run here; a retry after that
    time runs it if the other worker died."""


def _engine(database: str | sa.Engine | None) -> sa.Engine:
    """The engine for ``database``: an `Engine` as given, a URL's made once per process.

    An async driver's URL (``postgresql+asyncpg://``) is run with its sync driver, and
    cached under that sync URL, so the async and the sync spelling share one engine.
    """
    if isinstance(database, sa.Engine):
        return database
    url = resolve_database(database)
    if not isinstance(url, str):  # an AsyncEngine
        raise TypeError(f"once: the database must be a URL or an Engine, got {url!r}")
    if lease.is_async_url(url):
        # Rendered with its password: str() of a URL masks it as ***.
        url = lease.sync_url(url).render_as_string(hide_password=False)
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = lease.create_engine(url)
        return engine


def _ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def run_once(
    occurrence_id: str,
    task: str,
    body: Callable[[], T],
    *,
    database: str | sa.Engine | None = None,
    stale_after: float = STALE_AFTER,
    clock: Clock | None = None,
) -> T | None:
    """Run ``body()`` unless it ran, or runs, for ``occurrence_id``.

    Args:
        occurrence_id: The delivery's id (the message's own id: an occurrence id).
        task: The task's name, on record beside the id.
        body: The work, called with no argument.
        database: The lease database: a URL or an `Engine`; ``None`` reads
            ``$CRONJOB_DATABASE_URL`` (else the embedded SQLite file), as ``cronjob run``.
            Its tables must be at revision 0010 or later (a replica migrates them).
        stale_after: Seconds after which a body still marked running may be run again.
        clock: Where "now" comes from (the system clock by default).

    Returns:
        What ``body`` returned; ``None`` when it had run already (nothing is run).

    Raises:
        OccurrenceBusy: the body runs elsewhere, started less than ``stale_after`` ago.
        ValueError: ``occurrence_id`` or ``task`` is empty, or ``stale_after`` not > 0.
        lease.LeaseError: the database failed (the body did not run).
        Exception: whatever ``body`` raised (the id is forgotten: a redelivery runs it).
    """
    if not isinstance(occurrence_id, str) or not occurrence_id:
        raise ValueError(
            f"once: the occurrence id must be a non-empty string, got {occurrence_id!r}"
        )
    if not isinstance(task, str) or not task:
        raise ValueError(f"once: the task must be a non-empty string, got {task!r}")
    if not isinstance(stale_after, int | float) or not stale_after > 0:
        raise ValueError(f"once: stale_after must be a number of seconds > 0, got {stale_after!r}")
    clock = clock or _SYSTEM
    engine = _engine(database)
    holder = f"{socket.gethostname()}:{os.getpid()}"[: lease.HOLDER_LENGTH]
    token, state = lease.begin_once(
        engine,
        occurrence_id,
        task=task,
        holder=holder,
        now_ms=_ms(clock.now()),
        stale_ms=round(stale_after * 1000),
    )
    if token is None:
        if state == lease.ONCE_RUNNING:
            raise OccurrenceBusy(
                f"task {task!r}: occurrence {occurrence_id} runs elsewhere (started less "
                f"than {stale_after:g}s ago); not run here"
            )
        log.info("task %r: occurrence %s ran already; not run again", task, occurrence_id)
        return None
    try:
        result = body()
    except BaseException as failure:
        try:
            with engine.begin() as conn:
                lease.release_once(conn, occurrence_id, token)
        except Exception as exc:  # the body's error is the one to raise
            log.warning(
                "task %r: occurrence %s failed, and forgetting it failed too (%s): a "
                "redelivery runs it after %gs",
                task,
                occurrence_id,
                exc,
                stale_after,
            )
            failure.add_note(f"cronjob: forgetting occurrence {occurrence_id} failed: {exc}")
        raise
    with engine.begin() as conn:
        if not lease.finish_once(conn, occurrence_id, token, now_ms=_ms(clock.now())):
            log.warning(
                "task %r: occurrence %s ran here, and was taken over meanwhile (stale after "
                "%gs): it may have run twice",
                task,
                occurrence_id,
                stale_after,
            )
    return result


def run_claimed(
    claim: Claim,
    task: str,
    body: Callable[[], T],
    *,
    database: str | sa.Engine | None = None,
    stale_after: float = STALE_AFTER,
    clock: Clock | None = None,
    registry: Registry | None = None,
) -> T | None:
    """Check the delivery's ``claim``, then `run_once` its body under its id.

    Args:
        claim: What the message says (`cronjob.contrib._validation.claim_of`), its
            ``occurrence_id`` the message's own id. (A message cronjob did not publish
            carries no claim: the wrappers run it with `run_once`, by its id alone.)
        task: The task's name, on record beside the id.
        body: The work, called with no argument.
        database: As for `run_once`.
        stale_after: As for `run_once`.
        clock: As for `run_once`.
        registry: The jobs that name schedules; ``None``: the default registry. The
            lease database's schedule rows and replica records name them too.

    Returns:
        What ``body`` returned; ``None`` when it had run already, or the occurrence is
        obsolete (never started, and nothing names its schedule): not run.

    Raises:
        InvalidOccurrence: the id is not that of the app, schedule and instant, or the
            instant is no firing of the schedule's current spec (not for a manual round).
        OccurrenceBusy: as for `run_once`.
        lease.LeaseError: the database failed (nothing ran).
        Exception: whatever ``body`` raised.
    """
    check_identity(claim.app, claim.schedule, claim.instant, claim.occurrence_id)
    clock = clock or _SYSTEM
    engine = _engine(database)
    if lease.once_state(engine, claim.occurrence_id) is None:
        found = check_claim(
            engine,
            claim,
            registry=registry if registry is not None else default_registry,
            now=clock.now(),
        )
        if found is None:
            log.info(
                "task %r: occurrence %s names schedule %r, which is no more; acknowledged as "
                "obsolete, not run",
                task,
                claim.occurrence_id,
                claim.schedule,
            )
            return None
    return run_once(
        claim.occurrence_id,
        task,
        body,
        database=engine,
        stale_after=stale_after,
        clock=clock,
    )
