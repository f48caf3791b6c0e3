"""Annotate log records (standard logging and structlog) with the unit of work in progress."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from opentelemetry import trace

from ._context import _active_span_context, current

__all__ = ["LogFilter", "add_context", "install_log_filter"]


def _fields() -> dict[str, str] | None:
    """Return the log fields of the current unit, or ``None`` outside any unit."""
    unit = current()
    if unit is None:
        return None
    span_context = _active_span_context(unit)
    if span_context is not None:
        span_id = trace.format_span_id(span_context.span_id)
    else:
        span_id = unit.span_id or ""
    return {
        "work_kind": unit.kind,
        "work_name": unit.name,
        "trace_id": unit.trace_id,
        "span_id": span_id,
    }


#: What a record gets outside a unit: empty strings, so format strings never fail.
_EMPTY = {"work_kind": "", "work_name": "", "trace_id": "", "span_id": ""}


class LogFilter(logging.Filter):
    """Add the unit of work in progress to every record; never drops a record.

    Sets ``record.work_kind``, ``record.work_name``, ``record.trace_id`` (32 hex digits)
    and ``record.span_id`` (16 hex digits: the innermost current span of the unit's
    trace, else the root span, else empty), all empty strings outside a unit, so a format
    string may always name them::

        logging.basicConfig(
            format="%(levelname)s %(work_name)s trace=%(trace_id)s %(message)s"
        )
        execctx.install_log_filter()

    or with ``logging.config.dictConfig``: ``"filters": {"execctx": {"()":
    "execctx.LogFilter"}}`` and ``"filters": ["execctx"]`` on each handler.

    A field the record already has is kept: the first filter to see a record wins, so a
    filter on a ``QueueHandler`` (which runs in the logging thread) is not overwritten
    by one behind the ``QueueListener`` (which runs elsewhere and sees no unit).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_fields() or _EMPTY).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def install_log_filter(target: logging.Logger | logging.Handler | None = None) -> None:
    """Add a [LogFilter][execctx.LogFilter] to a handler, or to every handler of a logger.

    One-line setup, after the handlers exist (``logging.basicConfig()``, ``dictConfig``)::

        execctx.install_log_filter()          # every handler of the root logger

    The filter goes on handlers, not on the logger, because a logger's own filters do
    not see records that propagate up from its child loggers. A handler that already has
    a [LogFilter][execctx.LogFilter] is left alone, so calling this twice is harmless.

    Args:
        target: A handler, or a logger whose current handlers get the filter; default
            the root logger.

    Raises:
        ValueError: when the logger has no handlers (the filter would see nothing).
    """
    if isinstance(target, logging.Handler):
        handlers = [target]
    else:
        logger = target if target is not None else logging.getLogger()
        handlers = list(logger.handlers)
        if not handlers:
            raise ValueError(
                f"logger {logger.name!r} has no handlers; add them first"
                " (e.g. logging.basicConfig()) or pass a handler"
            )
    for handler in handlers:
        if not any(isinstance(f, LogFilter) for f in handler.filters):
            handler.addFilter(LogFilter())


def add_context(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor adding the unit of work in progress to the event dict.

    Inside a unit it adds ``work_kind``, ``work_name``, ``trace_id`` and ``span_id`` (as
    [LogFilter][execctx.LogFilter] does; keys already bound are kept); outside a unit it adds
    nothing. Needs no structlog import here; put it before the renderer::

        structlog.configure(processors=[execctx.add_context, structlog.processors.JSONRenderer()])
    """
    fields = _fields()
    if fields is not None:
        for key, value in fields.items():
            if key != "span_id" or value:
                event_dict.setdefault(key, value)
    return event_dict
