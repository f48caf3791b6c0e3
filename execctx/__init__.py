"""The identity of the unit of work in progress, for spans, log records and SQL statements.

It knows nothing about cron or leases: whoever runs a piece of work wraps it in
[work][execctx.work], and everything the work does while it runs can say which unit it belongs to.

- [WorkUnit][execctx.WorkUnit] (the identity, a value) and [current][execctx.current].
- [work][execctx.work] (enter a unit under its root span) and [Work][execctx.Work].
- [LogFilter][execctx.LogFilter], [install_log_filter][execctx.install_log_filter],
  [add_context][execctx.add_context]: the identity on log records.
- [instrument][execctx.instrument] / [uninstrument][execctx.uninstrument]: the identity
  in SQL statements (sqlcommenter comments).
"""

# The layout, one private module per concern: _context (WorkUnit, current), _tracing (work,
# Work), _logging (LogFilter, install_log_filter, add_context), _sql (instrument,
# uninstrument).

from __future__ import annotations

from ._context import WorkUnit as WorkUnit
from ._context import current as current
from ._logging import LogFilter as LogFilter
from ._logging import add_context as add_context
from ._logging import install_log_filter as install_log_filter
from ._sql import instrument as instrument
from ._sql import uninstrument as uninstrument
from ._tracing import Work as Work
from ._tracing import work as work

__all__ = [
    "LogFilter",
    "Work",
    "WorkUnit",
    "add_context",
    "current",
    "install_log_filter",
    "instrument",
    "uninstrument",
    "work",
]

# Public objects name the public module, so reprs, docs and pickles never show `_x`.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
