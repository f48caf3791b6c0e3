"""Tag SQL statements run inside a unit of work with a sqlcommenter-style comment."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, ExecutionContext
from sqlalchemy.engine.interfaces import DBAPICursor

from ._context import WorkUnit, _active_span_context, current

__all__ = ["instrument", "uninstrument"]

#: Paramstyles whose drivers read ``%`` as the start of a placeholder.
_PERCENT_PARAMSTYLES = frozenset({"format", "pyformat"})


def instrument(engine: Engine, *, enabled: bool = True) -> None:
    """Append the unit of work in progress to every statement ``engine`` runs in a unit.

    A statement run inside [execctx.work][] gets, at its end (before a final ``;``)::

        SELECT 1 /*job='refresh-report',trace_id='4bf9…',traceparent='00-4bf9…-00f0…-01'*/

    ``job`` is the unit's name, ``trace_id`` its trace id, ``traceparent`` (W3C) names
    the innermost current span of the unit's trace and is present only when there is
    one (an SDK records spans). Keys are sorted; values are URL-encoded inside single
    quotes, as sqlcommenter does, so no name can end the comment or change the
    statement. Statements outside any unit are left untouched. For drivers that read
    ``%`` as a placeholder (psycopg, PyMySQL) the encoding's ``%`` is doubled whenever
    the driver will interpolate, so the server sees the comment exactly as above.

    Calling it again on the same engine adds nothing; ``enabled=False`` is
    [uninstrument][execctx.uninstrument], so a setting can be passed straight through. For an
    ``AsyncEngine``, pass its ``sync_engine``. The engine is not disposed or changed
    otherwise.
    """
    if not enabled:
        uninstrument(engine)
    elif not event.contains(engine, "before_cursor_execute", _add_comment):
        event.listen(engine, "before_cursor_execute", _add_comment, retval=True)


def uninstrument(engine: Engine) -> None:
    """Stop commenting ``engine``'s statements; harmless when it was never instrumented."""
    if event.contains(engine, "before_cursor_execute", _add_comment):
        event.remove(engine, "before_cursor_execute", _add_comment)


def _add_comment(
    conn: Connection,
    cursor: DBAPICursor,
    statement: str,
    parameters: Any,
    context: ExecutionContext | None,
    executemany: bool,
) -> tuple[str, Any]:
    """The ``before_cursor_execute`` listener (``retval=True``)."""
    unit = current()
    if unit is None:
        return statement, parameters
    # SQLAlchemy hands a statement to the driver without parameters only in this case;
    # then the driver does not interpolate, and a doubled `%` would reach the server.
    interpolated = bool(parameters) or context is None or not context.no_parameters
    double_percent = interpolated and conn.dialect.paramstyle in _PERCENT_PARAMSTYLES
    comment = _comment(unit, double_percent=double_percent)
    body = statement.rstrip()
    if body.endswith(";"):
        return f"{body[:-1]} {comment};", parameters
    return f"{body} {comment}", parameters


def _comment(unit: WorkUnit, *, double_percent: bool) -> str:
    """Return the sqlcommenter comment for ``unit`` (``/*key='value',…*/``)."""
    pairs = {"job": unit.name, "trace_id": unit.trace_id}
    span_context = _active_span_context(unit)
    if span_context is not None:
        pairs["traceparent"] = (
            f"00-{unit.trace_id}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"
        )
    encoded = ",".join(f"{key}='{quote(pairs[key], safe='')}'" for key in sorted(pairs))
    if double_percent:
        encoded = encoded.replace("%", "%%")
    return f"/*{encoded}*/"
