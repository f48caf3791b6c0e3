"""Each round as one unit of work: its root span, its trace id in logs and in SQL."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.trace import TracerProvider

import execctx

from ._round import Outcome, Round

__all__ = ["RoundScope", "round_scope"]

#: The kind of unit a round is, in execctx and on its root span (``work.kind``).
KIND = "round"


class RoundScope:
    """The round's unit of work, as the scheduler sees it while the round runs."""

    __slots__ = ("_work",)

    def __init__(self, work: execctx.Work) -> None:
        self._work = work

    def outcome(self, outcome: Outcome, error: BaseException | None) -> None:
        """Put the outcome on the root span; a job's own failure also sets status ERROR."""
        self._work.set_outcome(outcome.value, error=error if outcome is Outcome.FAILED else None)
        if outcome is Outcome.CUT_SHORT and error is not None:
            self._work.span.set_attribute("cronjob.cause", f"{type(error).__name__}: {error}")


@contextlib.contextmanager
def round_scope(
    ctx: Round,
    replica: str,
    tracer_provider: TracerProvider | None = None,
    *,
    reason: str = "schedule",
) -> Iterator[RoundScope]:
    """Run the block as the round's unit of work and give ``ctx`` its trace id.

    The root span is named ``cronjob <job>`` and carries the job, the instant, the
    attempt, the replica and why the round runs (``cronjob.reason``: ``schedule``,
    ``catch-up``, ``catch-up after an outage``, ``re-run``); spans the job opens are its
    children, and every log record and (instrumented) SQL statement made inside carries
    the job name and trace id.
    """
    attributes: dict[str, str | int | bool] = {
        "cronjob.job": ctx.name,
        "cronjob.instant": ctx.instant.isoformat(),
        "cronjob.attempt": ctx.attempt,
        "cronjob.replica": replica,
        "cronjob.reason": reason,
    }
    with execctx.work(
        KIND,
        ctx.name,
        attributes=attributes,
        span_name=f"cronjob {ctx.name}",
        tracer_provider=tracer_provider,
    ) as w:
        ctx.trace_id = w.unit.trace_id
        yield RoundScope(w)
