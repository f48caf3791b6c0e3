"""Alembic's INFO lines, lowered to DEBUG while the lease migrations run.

Alembic logs at INFO each context it configures, each revision it runs, and each plugin
it sets up as it is imported: on every start of every replica, that would be several
lines of someone else's detail. [migrate][lease.migrate] logs one line of its own instead, and
alembic's lines stay available at DEBUG.

How, without touching the application's logging: a filter on each ``alembic.*``
logger (a logger's filters see only the records created on it, so the parent's would
not do) that rewrites an INFO record to DEBUG — and drops it if that logger would not
log DEBUG — only for records created on a thread that is inside `alembic_at_debug`.
Another thread's alembic records (an application running its own migrations meanwhile)
pass unchanged. Levels, handlers and propagation are never changed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Final

__all__ = ["alembic_at_debug"]

#: The loggers alembic logs on when it migrates or is imported, made before alembic
#: asks for them so that a line logged at import is filtered too. Others under
#: ``alembic.`` that exist by then are found and filtered as well.
_KNOWN: Final = (
    "alembic",
    "alembic.runtime.migration",
    "alembic.runtime.plugins",
    "alembic.ddl.impl",
    "alembic.autogenerate.compare",
    "alembic.util.messaging",
)

_inside = threading.local()
_install_lock = threading.Lock()


class _InfoToDebug(logging.Filter):
    """Rewrites this thread's INFO records to DEBUG while it migrates (see the module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_inside, "depth", 0) or record.levelno != logging.INFO:
            return True
        if record.thread is not None and record.thread != threading.get_ident():
            return True  # made on another thread and handed over: not ours to change
        record.levelno = logging.DEBUG
        record.levelname = logging.getLevelName(logging.DEBUG)
        # Created because the logger logs INFO; kept only if it logs DEBUG too.
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_FILTER: Final = _InfoToDebug("alembic")


def _install() -> None:
    """Put the filter on every ``alembic`` logger there is (once each)."""
    names = set(_KNOWN)
    # list() copies the keys in one step: another thread may add a logger meanwhile.
    names.update(
        name
        for name in list(logging.Logger.manager.loggerDict)
        if name == "alembic" or name.startswith("alembic.")
    )
    with _install_lock:
        for name in sorted(names):
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)


@contextlib.contextmanager
def alembic_at_debug() -> Iterator[None]:
    """Within: alembic's INFO records made on this thread are DEBUG records. Nests."""
    _install()
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        yield
    finally:
        _inside.depth -= 1
