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

A round with a timeout can end two ways at once (its job returning as the policies
record it): `DecidedEnds.take_end` lets one of them settle it.

Threads: the records are written on the control thread; ``take_end`` on either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import lease

from .._clock import Clock
from .._round import Outcome, Round
from ._failures import Failures
from ._state import Flags, Reason, Run

__all__ = ["DecidedEnds", "error_summary", "round_where"]

log = logging.getLogger("cronjob")

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
        record = None
        if self._history:
            record = lease.RoundRow(
                name=ctx.name,
                instant=ctx.instant,
                attempt=ctx.attempt + 1,
                holder=self._replica_id,
                why=Reason.RETRY.why,
                started=ended,
                ended=ended,
                outcome=outcome.value,
                error=error,
                trace_id=ctx.trace_id or None,
                requested_by=ctx.requested_by,
            )
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
