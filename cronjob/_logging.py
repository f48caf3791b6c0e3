"""The library's own log lines made visible where nothing else shows them.

cronjob never configures logging on import or by default: that is the application's.
Two places own their output and do: ``cronjob run`` (its own process, see
`cronjob.admin._run`) and, when asked with ``log_level=``, [lifespan][cronjob.lifespan]
(`visible_logs`), for an ASGI server such as uvicorn, whose default logging
configures only its own loggers: the root logger has no handler, and cronjob's INFO lines
(the scheduler's start and stop, the minute summaries) would vanish.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Final

import execctx

__all__ = ["LINE_FORMAT", "LOGGERS", "RoundFormatter", "check_level", "visible_logs"]

#: The line of ``cronjob run`` and of ``lifespan(log_level=...)``: time, level, logger.
LINE_FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
#: The loggers of the library's packages.
LOGGERS: Final = ("cronjob", "lease", "execctx")


class RoundFormatter(logging.Formatter):
    """Plain log lines, with ``[job=… trace=…]`` on the ones made inside a round."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        name = getattr(record, "work_name", "")
        if name:
            line += f"  [job={name} trace={getattr(record, 'trace_id', '')}]"
        return line


def stderr_handler() -> logging.Handler:
    """A handler writing `LINE_FORMAT` lines to standard error, rounds annotated."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RoundFormatter(LINE_FORMAT))
    execctx.install_log_filter(handler)
    return handler


def check_level(level: int | str) -> int:
    """The number of a level given as a name (``"INFO"``, any case) or a number.

    Raises:
        ValueError: a name logging does not know, or a negative number.
    """
    if isinstance(level, bool) or not isinstance(level, int | str):
        raise ValueError(f"log_level must be a level name or number, not {level!r}")
    if isinstance(level, str):
        known = logging.getLevelNamesMapping()
        if level.upper() not in known:
            raise ValueError(f"log_level {level!r} is not a logging level ({', '.join(known)})")
        return known[level.upper()]
    if level < 0:
        raise ValueError(f"log_level must be >= 0, not {level!r}")
    return level


@contextlib.contextmanager
def visible_logs(level: int | None) -> Iterator[None]:
    """Show the library's lines at ``level`` and above while the block runs.

    ``None`` does nothing. Otherwise the loggers of `LOGGERS` are set to ``level``;
    and only when no handler would receive their records — neither they nor the root
    logger has one, so Python would print warnings alone, bare, through its last-resort
    handler — one handler writing `LINE_FORMAT` to standard error is added to them.
    An application that configured logging keeps its handlers and its format: its root
    handlers get the lines. On exit the levels are restored and the handler removed.
    """
    if level is None:
        yield
        return
    loggers = [logging.getLogger(name) for name in LOGGERS]
    before = [logger.level for logger in loggers]
    handler = None
    if not logging.getLogger().handlers and not any(logger.handlers for logger in loggers):
        handler = stderr_handler()
        for logger in loggers:
            logger.addHandler(handler)
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, old in zip(loggers, before, strict=True):
            logger.setLevel(old)
            if handler is not None:
                logger.removeHandler(handler)
