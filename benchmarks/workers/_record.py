"""What every replica process records, the same way for every scheduler.

- ``started(name, instant)``: a round of job ``name`` for the scheduled ``instant``
  (epoch seconds) started now (``time.time()``, the host's clock, shared by all replicas);
- every SQL statement the process sends through SQLAlchemy (a class-wide
  ``before_cursor_execute`` listener: ``BEGIN``/``COMMIT`` are not statements there),
  counted per wall-clock second and per kind; a scheduler that does not use SQLAlchemy
  (procrastinate) calls :func:`statement` from its own hook instead;
- every connection checkout from a pool (with ``pool_pre_ping`` each one is an extra
  ``SELECT 1`` round trip that the listener above does not see), per second
  (:func:`checkout` for a pool that is not SQLAlchemy's).

At exit (``atexit``) the process writes it all to ``$BENCH_OUT`` as JSON.

Environment: ``BENCH_JOBS`` (number of jobs), ``BENCH_SPEC`` (their schedule, cronjob
syntax), ``BENCH_OUT`` (the JSON file), ``BENCH_REPLICA`` (a label).
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import re
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

try:
    import sqlalchemy as sa
    from sqlalchemy import event
except ImportError:  # a peer without SQLAlchemy (procrastinate) hooks its own driver
    sa = None  # type: ignore[assignment]

JOBS = int(os.environ.get("BENCH_JOBS", "20"))
SPEC = os.environ.get("BENCH_SPEC", "* * * * * *")
OUT = os.environ.get("BENCH_OUT", "")
REPLICA = os.environ.get("BENCH_REPLICA", str(os.getpid()))
#: Seconds each round works (sleeps) after recording its start.
WORK_SECONDS = float(os.environ.get("BENCH_JOB_SECONDS", "0"))
#: Threads running rounds at once in each replica (every scheduler gets the same).
SLOTS = int(os.environ.get("BENCH_SLOTS", "64"))
#: Also append each start to ``$BENCH_OUT.rounds`` as it happens: a replica killed with
#: ``kill -9`` writes no JSON at exit, and its rounds must still count.
STREAM = os.environ.get("BENCH_STREAM") == "1"
_stream = open(OUT + ".rounds", "a", buffering=1) if STREAM and OUT else None  # noqa: SIM115

_rounds: list[tuple[str, float, float]] = []
#: More of the report: a worker adds ``key -> what to write`` here (called at dump).
EXTRA: dict[str, Callable[[], Any]] = {}
_statements: collections.Counter[tuple[int, str]] = collections.Counter()
_checkouts: collections.Counter[int] = collections.Counter()
_lock = threading.Lock()
_COMMENT = re.compile(r"^\s*((/\*.*?\*/|--[^\n]*)\s*)+", re.S)
_CALL = re.compile(r"\b(\w+)\s*\(")
_BUILTINS = {"unnest", "coalesce", "count", "now", "max", "min", "exists", "any", "array", "select"}
_WORDS = re.compile(r"\s+")


def job_names() -> list[str]:
    return [f"job-{i:05d}" for i in range(JOBS)]


def every_seconds(spec: str) -> int | None:
    """The period of an ``@every Ns`` spec, else ``None`` (a cron spec)."""
    if not spec.startswith("@every "):
        return None
    return int(spec.split()[1].rstrip("s"))


def cron_fields(spec: str) -> dict[str, str]:
    """A six-field cron spec as the keyword arguments of APScheduler's ``CronTrigger``
    (the same in 3 and 4), in UTC."""
    second, minute, hour, day, month, dow = spec.split()
    return {
        "second": second,
        "minute": minute,
        "hour": hour,
        "day": day,
        "month": month,
        "day_of_week": "*" if dow in ("*", "?") else dow,
        "timezone": "UTC",
    }


def started(name: str, instant: float) -> None:
    """Record that a round of ``name`` for ``instant`` starts now."""
    start = time.time()
    _rounds.append((name, instant, start))  # list.append is atomic
    if _stream is not None:
        with _lock:
            _stream.write(f"{name} {instant} {start}\n")


def work() -> None:
    """The round's work: ``$BENCH_JOB_SECONDS`` of sleep (none by default)."""
    if WORK_SECONDS:
        time.sleep(WORK_SECONDS)


def _kind(statement: str) -> str:
    text = _WORDS.sub(" ", _COMMENT.sub("", statement)).strip()
    words = text.split(" ")
    verb = words[0].upper() if words else "?"
    table = ""
    upper = [w.upper() for w in words]
    if verb == "WITH" and "UPDATE" in upper[1:]:
        # cronjob's renewals and finishes on PostgreSQL: the rows locked in a CTE first
        start = len(upper) - 1 - upper[::-1].index("UPDATE")
        words, upper, verb = words[start:], upper[start:], "UPDATE"
    upper = upper[:40]
    for keyword in ("UPDATE", "INTO", "FROM"):
        if keyword in upper:
            index = upper.index(keyword)
            if index + 1 < len(words):
                table = words[index + 1].strip('"(').split("(")[0].lower()
                break
    if verb == "SELECT" and not table:  # a stored function's call (procrastinate)
        table = next(
            (name.lower() for name in _CALL.findall(text) if name.lower() not in _BUILTINS), ""
        )
    detail = ""
    if verb == "UPDATE" and "lease" in table:  # tell cronjob's lease statements apart
        if "prev_instant" in text:
            detail = " claim"
        elif "skipped_through" in text:
            detail = " finish"
        elif re.search(r"SET state\b", text, re.I):
            detail = " give_back"
        else:
            detail = " renew"
    return f"{verb} {table}{detail}".strip()


def statement(text: str) -> None:
    """Count one SQL statement sent now. ``BEGIN``/``COMMIT``/``ROLLBACK`` are not, nor
    is an empty query: psycopg_pool's check of a connection at checkout (procrastinate's
    pool), the round trip ``pool_pre_ping`` is for SQLAlchemy, counted as a checkout."""
    if not text.strip() or text.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
        return
    key = (int(time.time()), _kind(text))
    with _lock:
        _statements[key] += 1


def checkout(*args: Any) -> None:
    """Count one connection checkout from a pool, now."""
    second = int(time.time())
    with _lock:
        _checkouts[second] += 1


def _before_cursor_execute(conn: Any, cursor: Any, text: str, *args: Any) -> None:
    statement(text)


if sa is not None:
    event.listen(sa.engine.Engine, "before_cursor_execute", _before_cursor_execute)
    event.listen(sa.pool.Pool, "checkout", checkout)


def dump() -> None:
    """Write what was recorded to ``$BENCH_OUT`` (at exit; a worker whose scheduler may
    take longer to stop than the harness waits also calls it when told to stop, so a
    replica killed in its shutdown still reports the rounds of the window)."""
    if not OUT:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with _lock:
        statements = [[second, kind, n] for (second, kind), n in _statements.items()]
        checkouts = [[second, n] for second, n in _checkouts.items()]
    document = {
        "replica": REPLICA,
        "pid": os.getpid(),
        "rounds": _rounds,
        "statements": statements,
        "checkouts": checkouts,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_kb": usage.ru_maxrss,
    }
    document.update({key: make() for key, make in EXTRA.items()})
    tmp = OUT + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(document, handle)
    os.replace(tmp, OUT)


atexit.register(dump)
