"""Each round as one unit of work: its root span, its trace id in logs and in SQL."""

from __future__ import annotations

from datetime import datetime
from types import TracebackType

from opentelemetry.trace import TracerProvider

import execctx

from .._round import Outcome, Round

__all__ = ["RoundScope", "round_scope"]

#: The kind of unit a round is, in execctx and on its root span (``work.kind``).
KIND = "round"


class RoundScope:  # used as a function too: ``with round_scope(...) as scope``
    """Run the block as the round's unit of work and give ``ctx`` its trace id.

    The root span is named ``cronjob <job>`` and carries the job, the instant, the
    attempt, the replica and why the round runs (``cronjob.reason``: ``schedule``,
    ``catch-up``, ``catch-up after an outage``, ``re-run``); spans the job opens are its
    children, and every log record and (instrumented) SQL statement made inside carries
    the job name and trace id. Entering it returns the scope itself, which puts the
    round's outcome on the span (`outcome`).

    An object over [execctx.work][]'s, not a generator: entered once per round,
    thousands of times a second at scale.
    """

    __slots__ = ("_ctx", "_handle", "_work")

    def __init__(
        self,
        ctx: Round,
        replica: str,
        tracer_provider: TracerProvider | None = None,
        *,
        reason: str = "schedule",
    ) -> None:
        attributes: dict[str, str | int | bool] = {
            "cronjob.job": ctx.name,
            "cronjob.instant": _isoformat(ctx.instant),
            "cronjob.attempt": ctx.attempt,
            "cronjob.replica": replica,
            "cronjob.reason": reason,
        }
        self._ctx = ctx
        self._work = execctx.work(
            KIND,
            ctx.name,
            attributes=attributes,
            span_name=f"cronjob {ctx.name}",
            tracer_provider=tracer_provider,
        )

    def __enter__(self) -> RoundScope:
        handle = self._handle = self._work.__enter__()
        self._ctx.trace_id = handle.unit.trace_id
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._work.__exit__(kind, error, traceback)

    def outcome(self, outcome: Outcome, error: BaseException | None) -> None:
        """Put the outcome on the root span; a job's own failure also sets status ERROR.

        Nothing to do on a span that records nothing (no SDK): the span drops it anyway.
        """
        handle = self._handle
        if not handle.span.is_recording():
            return
        handle.set_outcome(outcome.value, error=error if outcome is Outcome.FAILED else None)
        if outcome is Outcome.CUT_SHORT and error is not None:
            handle.span.set_attribute("cronjob.cause", f"{type(error).__name__}: {error}")


round_scope = RoundScope


#: The last instant written out and its text: the rounds of one instant start together,
#: thousands at scale, and writing an aware datetime out is not cheap.
_last_instant: tuple[datetime, str] | None = None


def _isoformat(instant: datetime) -> str:
    """``instant.isoformat()``, remembered for the next round of the same instant."""
    global _last_instant
    last = _last_instant
    if last is not None and last[0] == instant and last[0].tzinfo is instant.tzinfo:
        return last[1]
    text = instant.isoformat()
    _last_instant = (instant, text)
    return text
