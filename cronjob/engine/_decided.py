"""The ends the policies decide, past a job's own end: recorded as any end, then told to
the failure policies.

- **A round that outlived its timeout** (the policies' forced exit, see
  ``cronjob.engine._policies``): before the process ends, the round is put on record as
  ``timed_out`` (row and history) while its lease stays held until it expires with the
  process, so the self-pause counts it and the failure hook runs once for it, whichever
  replica counts next.
- **A retry given up at its timer** (the job's next instant is due): the round ends
  ``failed``, with a history row for the attempt that never started, counted and hooked
  as any failed round.
- **A retry given up in its backoff** (a drain began, the lease was lost): a history
  row ``'given up'`` for the attempt that never started, the lease given back if held.

A round with a timeout can end two ways at once (its job returning as the policies
record it): `DecidedEnds.take_end` lets one of them settle it.

Threads: the records are written on the control thread; ``take_end`` on either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Final

import lease

from .._clock import Clock
from .._round import Outcome, Round
from ._failures import Failures
from ._metrics import GIVEN_UP
from ._state import Flags, Reason, Run

__all__ = ["SUPERSEDED_WHY", "DecidedEnds", "error_summary", "noting_given_up", "round_where"]

log = logging.getLogger("cronjob")

#: The ``why`` of the history row of an unfinished round a later claim gave up.
SUPERSEDED_WHY: Final = "superseded"

#: The end recorder's ``_ending``: the record of a round's end.
_Ending = Callable[..., lease.Ending]
#: The end recorder's ``_tell_failures``.
_Tell = Callable[[list[tuple[Run, Outcome, "lease.Ending | None", bool]]], None]


class DecidedEnds:
    """Records the ends the policies decide (see the module's docstring).

    Args:
        clock: The scheduler's clock.
        replica_id: This replica, on each record.
        store: The lease store.
        flags: The scheduler's life flags: after a crash nothing is written.
        history: Whether the history is kept (a row with each end).
        ending: Builds an end's record (the end recorder's).
        tell_failures: Hands ends to the failure policies (the end recorder's).
        failures: The failure policies, for their hooks at a forced exit; ``None``.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        replica_id: str,
        store: lease.LeaseStore,
        flags: Flags,
        history: bool,
        ending: _Ending,
        tell_failures: _Tell,
        failures: Failures | None,
    ) -> None:
        self._clock = clock
        self._replica_id = replica_id
        self._store = store
        self._flags = flags
        self._history = history
        self._ending = ending
        self._tell_failures = tell_failures
        self._failures = failures
        self._end_lock = threading.Lock()

    def take_end(self, run: Run) -> bool:
        """Take ``run``'s end to settle: ``False`` if it was taken already. A round whose
        job has a timeout can end two ways at once, its job returning as the policies
        record it for the forced exit (`record_outlived`): one end only is
        recorded, counted and told to the hooks."""
        with self._end_lock:
            if run.end_taken:
                return False
            run.end_taken = True
            return True

    def record_outlived(self, run: Run) -> bool | None:
        """Put on record the end of a round whose job still runs past its timeout's
        grace, before the forced exit ends the process (control thread).

        The round ended ``timed_out``: on the lease row and in the history, its lease
        still held (it expires with the process, so no replica runs the job while it
        may still run here) and its attempt 2 (never run a second time); then the
        failure policies hear of it as of any timed-out round (the self-pause's count,
        the failure hook). Whichever replica counts next finds it in the history.

        Returns:
            ``None`` when the job ended meanwhile (its own end stands: no exit is
            needed); else whether the end is on record.
        """
        if not self.take_end(run):
            return None
        ended, outcome, ctx = self._clock.now(), Outcome.TIMED_OUT, run.ctx
        run.outcome = outcome
        seconds = self._clock.monotonic() - run.started_mono
        run.state.metrics.ended(outcome, None, seconds, given_up=False)
        ending = self._ending(run, outcome, None, ended, holding=True)
        recorded = self._write(ending)
        if recorded:
            log.warning(
                "round of %s timed out and ignored its cancellation: on record as timed_out "
                "before the process ends (its lease expires with it)",
                round_where(ctx),
            )
        else:
            log.warning(
                "round of %s: its end is not on record (the lease is gone)", round_where(ctx)
            )
        self._tell_failures([(run, outcome, ending, recorded)])
        return recorded

    def record_given_up_retry(self, run: Run, error: str) -> bool:
        """Put on record the end of a round whose retry will not start, the job's next
        instant being due (control thread): it ended ``failed``, its lease freed, with a
        history row for the attempt that never started (``why`` retry, ``error``); then
        the failure policies hear of it as of any failed round (the self-pause's count,
        the failure hook).

        Returns:
            Whether the end is on record.
        """
        ended, ctx, outcome = self._clock.now(), run.ctx, Outcome.FAILED
        run.outcome = outcome
        record = self._unstarted(run, outcome.value, error, ended)
        assert run.token is not None
        ending = lease.Ending(
            name=ctx.name,
            token=run.token,
            ended=ended,
            succeeded=False,
            error=error,
            record=record,
            outcome=outcome.value,
        )
        recorded = self._write(ending)
        self._tell_failures([(run, outcome, ending, recorded)])
        return recorded

    def record_given_up(self, run: Run, error: str, *, lost: bool) -> bool:
        """Put on record a retry given up before it started (control thread): the
        scheduler began to drain, or ``lost``, the round's lease was lost during its
        backoff. The attempt that never started goes in the history as ``'given up'``
        (``why`` retry, ``error``), so `cronjob history --failed` shows it.

        With its lease still held, the lease is given back in the same transaction (the
        row ``cut``, ``'given up'``: its attempt is 2 already); a lost lease is no longer
        this round's to write, so only the history row is added. Nothing is written
        after a crash; without the history kept, only the lease is given back.

        Returns:
            Whether the give-up is on record (the lease given back, or the row added).
        """
        if self._flags.crashed:
            return False
        ctx, ended = run.ctx, self._clock.now()
        record = self._unstarted(run, GIVEN_UP, error, ended)
        try:
            if not lost and run.token is not None:
                return self._store.give_back(ctx.name, run.token, record=record)
            if record is None:
                return False
            self._store.add_rounds([record])
            return True
        except lease.LeaseError as exc:
            log.error("job %r: recording its retry given up failed: %s", ctx.name, exc)
            return False

    def _unstarted(
        self, run: Run, outcome: str, error: str, ended: datetime
    ) -> lease.RoundRow | None:
        """The history row of ``run``'s next attempt, which never started (``None``
        without the history kept)."""
        if not self._history:
            return None
        ctx = run.ctx
        return lease.RoundRow(
            name=ctx.name,
            instant=ctx.instant,
            attempt=ctx.attempt + 1,
            holder=self._replica_id,
            why=Reason.RETRY.why,
            started=ended,
            ended=ended,
            outcome=outcome,
            error=error,
            trace_id=ctx.trace_id or None,
            requested_by=ctx.requested_by,
        )

    def settle_hooks(self, seconds: float) -> None:
        """Let the failure hooks queued run for up to ``seconds`` (real seconds), then
        refuse more: the process is about to end (the forced exit)."""
        if self._failures is not None:
            self._failures.close_hooks(seconds)

    def _write(self, ending: lease.Ending) -> bool:
        """Write ``ending`` (unless crashed); whether it is on record."""
        if self._flags.crashed:
            return False
        try:
            return (ending.name, ending.token) in self._store.finish_many([ending])
        except lease.LeaseError as exc:
            log.error("job %r: recording the end of its round failed: %s", ending.name, exc)
            return False


def noting_given_up(
    work: Callable[[], lease.ClaimBatch], *, store: lease.LeaseStore, holder: str, clock: Clock
) -> Callable[[], lease.ClaimBatch]:
    """``work`` (a claim, run on the control thread), then the unfinished rounds it gave
    up (``superseded``) put in the history as ``'given up'`` by ``holder``, ``why``
    `SUPERSEDED_WHY`: their lease is the claim's now, so nothing else would put them on
    record (`cronjob history --failed` shows them). A round whose end is on record as a
    failure already (the row's last end at or after its instant: ``timed_out`` held to
    the forced exit, a second run ``given up``, a retry given up) is not recorded twice;
    one that never ended (its replica died) or was cut short and never run again is.

    A failure to read or add them is logged; the claim stands. Two more statements,
    only when a claim gave a round up."""

    def noted() -> lease.ClaimBatch:
        batch = work()
        if not batch.superseded:
            return batch
        ended, started = clock.now(), batch.instant.isoformat()
        try:
            rows = store.read(batch.superseded)
            records = [
                lease.RoundRow(
                    name=name,
                    instant=old_instant,
                    attempt=old_attempt,
                    holder=holder,
                    why=SUPERSEDED_WHY,
                    started=ended,
                    ended=ended,
                    outcome=GIVEN_UP,
                    error=f"given up unfinished: instant {started} started first",
                )
                for name, (old_instant, old_attempt) in batch.superseded.items()
                if not _failure_on_record(rows.get(name), old_instant)
            ]
            store.add_rounds(records)
        except lease.LeaseError as exc:
            log.error("putting the rounds a claim gave up on record failed: %s", exc)
        return batch

    return noted


#: The outcomes of an end on record that a give-up must not repeat.
_ON_RECORD: Final = frozenset({"failed", GIVEN_UP, "timed_out", "missed_deadline", "retrying"})


def _failure_on_record(row: lease.LeaseRow | None, instant: datetime) -> bool:
    """Whether the lease row ``row`` (read after a claim replaced its round of
    ``instant``) says that round's end is on record as a failure, or an attempt to be
    retried (whose give-up its replica records)."""
    if row is None or row.last_end is None or row.last_outcome not in _ON_RECORD:
        return False
    return row.last_end >= instant


def round_where(ctx: Round) -> str:
    """The round in the end's log lines: ``job 'x' instant … attempt n``."""
    return f"job {ctx.name!r} instant {ctx.instant.isoformat()} attempt {ctx.attempt}"


def error_summary(error: BaseException) -> str:
    """``"Type: message"`` of a job's failure, for the record: never its traceback or
    locals (bounded when stored, see [lease.RoundRow][])."""
    kind = type(error).__qualname__
    try:
        message = str(error)
    except Exception:  # a broken __str__ must not keep the end from its record
        message = "<the message could not be read>"
    return f"{kind}: {message}" if message else kind
