"""The unit of work in progress: its identity as a value, and the variable that holds it."""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

__all__ = ["WorkUnit", "current"]

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
#: An attribute's value: str, int or bool (a bool is an int).
_ATTRIBUTE_TYPES = (str, int)

#: The unit of work the running code belongs to; ``None`` outside any unit. Set and reset
#: only by `execctx.work`, so each thread and each asyncio task sees its own.
_current_unit: ContextVar[WorkUnit | None] = ContextVar("execctx_current_unit", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkUnit:
    """The identity of one unit of work (e.g. one round of a cron job).

    Attributes:
        kind: What sort of work this is, e.g. ``"round"``; never empty.
        name: Which piece of work, e.g. ``"refresh-report"``; never empty. May hold any
            character: whoever writes it somewhere (a SQL comment) encodes it.
        trace_id: The W3C trace id: 32 lowercase hex digits, not all zero.
        span_id: The root span's id (16 lowercase hex digits), or ``None`` when no
            OpenTelemetry SDK records spans.
        attributes: Extra read-only facts about the unit, also set on its root span.

    Raises:
        ValueError: when ``kind`` or ``name`` is empty or an id is not in W3C form.
        TypeError: when an attribute key is not a string or a value not str, int or bool.
    """

    kind: str
    name: str
    trace_id: str
    span_id: str | None = None
    attributes: Mapping[str, str | int | bool] = field(
        default_factory=lambda: types.MappingProxyType({}), hash=False
    )

    def __post_init__(self) -> None:
        _check_identity(self.kind, self.name, self.attributes)
        if not _TRACE_ID.fullmatch(self.trace_id) or not self.trace_id.strip("0"):
            raise ValueError(
                f"trace_id must be 32 lowercase hex digits, not all zero: {self.trace_id!r}"
            )
        if self.span_id is not None and (
            not _SPAN_ID.fullmatch(self.span_id) or not self.span_id.strip("0")
        ):
            raise ValueError(
                f"span_id must be 16 lowercase hex digits, not all zero: {self.span_id!r}"
            )
        # A private copy behind a read-only view: the caller's dict may change later.
        object.__setattr__(self, "attributes", types.MappingProxyType(dict(self.attributes)))

    @classmethod
    def _with_own_ids(
        cls,
        kind: str,
        name: str,
        trace_id: str,
        span_id: str | None,
        attributes: Mapping[str, str | int | bool],
    ) -> WorkUnit:
        """A unit whose ids this package made itself ([execctx.work][]): ``kind``,
        ``name`` and ``attributes`` are checked as the constructor checks them, the ids
        are not (a fresh random id, or one formatted from a valid span context).

        Entered thousands of times a second by a scheduler: the constructor's id checks
        and its field-by-field frozen assignments cost more than the rest of a unit.
        """
        _check_identity(kind, name, attributes)
        unit = object.__new__(cls)
        assign = object.__setattr__
        assign(unit, "kind", kind)
        assign(unit, "name", name)
        assign(unit, "trace_id", trace_id)
        assign(unit, "span_id", span_id)
        assign(unit, "attributes", types.MappingProxyType(dict(attributes)))
        return unit


def _check_identity(kind: object, name: object, attributes: Mapping[Any, object]) -> None:
    """Refuse an empty ``kind`` or ``name`` and attributes that are not str keys to str,
    int or bool values, as [WorkUnit][execctx.WorkUnit] does."""
    # Checked on every unit entered (thousands a second in a scheduler): plain tests,
    # no loop over the two names, one isinstance per attribute (a bool is an int).
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty string, got {kind!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    for key, value in attributes.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"attribute keys must be non-empty strings, got {key!r}")
        if not isinstance(value, _ATTRIBUTE_TYPES):
            raise TypeError(f"attribute {key!r} must be str, int or bool, got {value!r}")


def current() -> WorkUnit | None:
    """Return the unit of work the calling code runs in, or ``None`` outside any unit.

    Each thread and each asyncio task has its own answer: a task sees the unit that was
    current where it was created; a new thread starts outside any unit unless it runs in a
    copied context (``asyncio.to_thread`` and ``loop.run_in_executor`` via
    ``contextvars.copy_context().run`` do; a bare ``ThreadPoolExecutor.submit`` does not).
    """
    return _current_unit.get()


def _set_current(unit: WorkUnit) -> Token[WorkUnit | None]:
    """Make ``unit`` current; the caller resets the returned token in ``finally``."""
    return _current_unit.set(unit)


def _reset_current(token: Token[WorkUnit | None]) -> None:
    _current_unit.reset(token)


def _active_span_context(unit: WorkUnit) -> trace.SpanContext | None:
    """Return the innermost current span context that belongs to ``unit``'s trace.

    That is the span the code is in right now (the root span, or a child the job opened),
    which is what a log line or a SQL statement should point at. ``None`` when no valid
    span of the unit's trace is current (no SDK, or code that switched to another trace).
    """
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid and trace.format_trace_id(span_context.trace_id) == unit.trace_id:
        return span_context
    return None
