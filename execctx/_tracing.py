"""Enter a unit of work: its root span, its trace id, and the current-unit variable."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Mapping
from types import TracebackType

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider

from ._context import WorkUnit, _reset_current, _set_current

__all__ = ["Work", "work"]

#: Instrumentation scope of every span this package starts.
TRACER_NAME = "execctx"
#: Root-span attribute keys this package sets (a caller's attributes never replace them).
KIND_ATTRIBUTE = "work.kind"
NAME_ATTRIBUTE = "work.name"
OUTCOME_ATTRIBUTE = "work.outcome"


class Work:
    """A unit of work in progress, as yielded by [work][execctx.work].

    Attributes:
        unit: The unit's identity, the value [execctx.current][] returns inside it.
        span: The unit's root span (a non-recording span when no SDK is configured).
    """

    __slots__ = ("_ended", "_error", "_outcome", "span", "unit")

    def __init__(self, unit: WorkUnit, span: Span) -> None:
        self.unit = unit
        self.span = span
        self._outcome: str | None = None
        self._error: BaseException | None = None
        self._ended = False

    def set_outcome(self, outcome: str, *, error: BaseException | None = None) -> None:
        """Record how the unit ended; applied to the root span when the block exits.

        The span gets the attribute ``work.outcome = outcome``; with ``error`` it also
        gets the exception as an event and status ERROR, without it status OK. A later
        call replaces an earlier one. An exception escaping the ``with`` block is recorded
        as well and always makes the status ERROR.

        Raises:
            ValueError: when ``outcome`` is empty.
            RuntimeError: when the unit has already ended.
        """
        if not outcome:
            raise ValueError("outcome must not be empty")
        if self._ended:
            raise RuntimeError(f"the unit of work {self.unit.name!r} has already ended")
        self._outcome = outcome
        self._error = error

    def _finish(self, escaped: BaseException | None) -> None:
        self._ended = True
        if not self.span.is_recording():  # no SDK, or not sampled: all of it is a no-op
            return
        if self._outcome is not None:
            self.span.set_attribute(OUTCOME_ATTRIBUTE, self._outcome)
        if self._error is not None:
            self.span.record_exception(self._error, escaped=self._error is escaped)
        if escaped is not None and escaped is not self._error:
            self.span.record_exception(escaped, escaped=True)
        failure = escaped if escaped is not None else self._error
        if failure is not None:
            self.span.set_status(Status(StatusCode.ERROR, f"{type(failure).__name__}: {failure}"))
        elif self._outcome is not None:
            self.span.set_status(Status(StatusCode.OK))


def work(
    kind: str,
    name: str,
    *,
    attributes: Mapping[str, str | int | bool] | None = None,
    span_name: str | None = None,
    parent: otel_context.Context | None = None,
    tracer_provider: TracerProvider | None = None,
) -> contextlib.AbstractContextManager[Work]:
    """Run the ``with`` block as one unit of work, under one root span.

    Usage::

        with execctx.work("round", "refresh-report", attributes={"attempt": 1}) as w:
            run_the_job()
            w.set_outcome("ran to its end")

    On entry: starts the root span ``span_name`` (default ``f"{kind} {name}"``) in a new
    trace (or as a child of ``parent`` when given), with ``attributes`` plus
    ``work.kind`` and ``work.name``; makes it the current span, so spans the block opens
    are its children; and makes the unit current ([execctx.current][]). The trace id
    is the span's when an OpenTelemetry SDK records it, else a fresh random W3C trace id,
    so logs and SQL comments are correlated even without tracing.

    On exit, whatever happened: applies [Work.set_outcome][execctx.Work.set_outcome],
    records an escaping exception (status ERROR) and re-raises it, ends the span, and
    restores the previous current unit and span. Units nest; the inner one starts its own
    trace.

    A unit is bound to the thread or asyncio task that entered it (context variables):
    enter it where the job runs, or run the job in a copy of the context
    (``asyncio.to_thread``, ``contextvars.copy_context().run``).

    Args:
        kind: What sort of work, e.g. ``"round"``.
        name: Which piece of work, e.g. the job's name. Any text.
        attributes: Extra facts for the unit and its root span.
        span_name: The root span's name, default ``f"{kind} {name}"``.
        parent: OpenTelemetry context whose span becomes the root's parent; default a
            new trace (the caller's current span is deliberately not used).
        tracer_provider: Where spans go; default the global provider. A
            `NoOpTracerProvider` records nothing, and with
            no ``parent`` the unit then skips the tracer altogether (its span is the
            invalid span, as that provider's would be).

    The context manager is an object, not a generator: a scheduler enters thousands
    of units a second. Enter it once.

    Raises:
        ValueError, TypeError: on entry, as [WorkUnit][execctx.WorkUnit] does for bad values.
    """
    return _WorkScope(kind, name, attributes, span_name, parent, tracer_provider)


class _WorkScope:
    """What [work][execctx.work] returns: enters the unit, and leaves it whatever happened."""

    __slots__ = ("_args", "_handle", "_otel_token", "_token")

    def __init__(
        self,
        kind: str,
        name: str,
        attributes: Mapping[str, str | int | bool] | None,
        span_name: str | None,
        parent: otel_context.Context | None,
        tracer_provider: TracerProvider | None,
    ) -> None:
        self._args = (kind, name, attributes, span_name, parent, tracer_provider)

    def __enter__(self) -> Work:
        kind, name, attributes, span_name, parent, tracer_provider = self._args
        # Built (and so validated) before the span starts: bad values leave no span.
        unit = WorkUnit._with_own_ids(kind, name, _random_trace_id(), None, attributes or {})
        span: Span
        if parent is None and isinstance(tracer_provider, trace.NoOpTracerProvider):
            # What a no-op tracer starts in a new trace is the invalid span: no tracer
            # asked, no span attributes built (a scheduler's rounds without an SDK).
            span = trace.INVALID_SPAN
        else:
            span = _tracer(tracer_provider).start_span(
                span_name or f"{kind} {name}",
                context=parent if parent is not None else otel_context.Context(),
                attributes={**unit.attributes, KIND_ATTRIBUTE: kind, NAME_ATTRIBUTE: name},
                record_exception=False,
                set_status_on_exception=False,
            )
            span_context = span.get_span_context()
            if span_context.is_valid:  # an SDK (or a valid parent): the trace's own id wins
                unit = WorkUnit._with_own_ids(
                    kind,
                    name,
                    trace.format_trace_id(span_context.trace_id),
                    trace.format_span_id(span_context.span_id),
                    unit.attributes,
                )
        handle = self._handle = Work(unit, span)
        self._token = _set_current(unit)
        # The root span made current, as ``trace.use_span`` does (without its exception
        # handling, which is off here). Without an SDK and with no span around, the span
        # is the invalid span that is current already: attaching it would change nothing
        # anyone can read, so it is not attached.
        self._otel_token = (
            None
            if span is trace.get_current_span()
            else otel_context.attach(trace.set_span_in_context(span))
        )
        return handle

    def __exit__(
        self,
        kind: type[BaseException] | None,
        escaped: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Record ``escaped`` (never swallowed: returns ``None``), end the span, restore."""
        handle = self._handle
        try:
            if self._otel_token is not None:
                otel_context.detach(self._otel_token)
        finally:
            try:
                handle._finish(escaped)
            finally:
                handle.span.end()
                _reset_current(self._token)


#: This package's tracer from the global provider: as ``trace.get_tracer`` at module
#: level always is, a proxy until an SDK sets the provider, then that provider's tracer.
#: Asked for per unit, the global provider is looked up in ``os.environ`` each time.
_global_tracer = trace.get_tracer(TRACER_NAME)

#: The provider passed in last and its tracer: a provider builds a new tracer each time
#: it is asked, and a process passes one provider in all but its tests.
_last_tracer: tuple[TracerProvider, Tracer] | None = None


def _tracer(tracer_provider: TracerProvider | None) -> Tracer:
    """Return this package's tracer from ``tracer_provider`` (default the global one)."""
    global _last_tracer
    if tracer_provider is None:
        return _global_tracer
    last = _last_tracer
    if last is not None and last[0] is tracer_provider:
        return last[1]
    tracer = tracer_provider.get_tracer(TRACER_NAME)
    _last_tracer = (tracer_provider, tracer)
    return tracer


def _random_trace_id() -> str:
    """Return a random W3C trace id (32 lowercase hex digits, never all zero).

    From `random`'s shared generator, as OpenTelemetry's SDK draws its ids: seeded
    from ``os.urandom`` at import and again in each forked child (so two processes never
    share a sequence), thread-safe, and without the system call per id that
    `secrets` makes. A trace id names a unit of work; it is no secret.
    """
    while not (value := random.getrandbits(128)):
        pass
    return f"{value:032x}"
