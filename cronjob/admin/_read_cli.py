"""``cronjob status`` and ``cronjob history``: what the scheduler did, for people and scripts.

Both read the database through [cronjob.admin][] and need no application module.
Neither writes, nor migrates: a database without the tables, or at an older revision,
gets one line saying which, and is left as it was.

Exit statuses: 0 all is well; 1 (``status``) a job is failing, stale, registered with
specs that disagree, a schedule whose task no live replica registers, or an occurrence
handed to a task queue still unsent after ``--unsent-after`` seconds — one line on
stderr says which, so the command serves as a probe or an alert check (a retired job,
which no live replica registers, never is: it is listed apart); 2 bad input (an unknown
job, no schedule of ``--task``, a bad option, no tables, an older schema); 3 the database
could not be read.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TextIO

import lease

from .. import admin
from .._policy import policy_text
from ..engine import resolve_database
from ._format import (
    _ack_row,
    _cell,
    _duration,
    _last,
    _pause_row,
    _state,
    _time,
    _why,
)
from ._outbox import UNSENT_AFTER

__all__ = ["add_commands", "run_history", "run_status"]

EXIT_UNHEALTHY: Final = 1
EXIT_USAGE: Final = 2
EXIT_DATABASE: Final = 3

#: The widest an error is shown in a table (``--json`` has it whole).
ERROR_WIDTH: Final = 80
#: The widest a job's policies are shown in the table (``--json`` has them whole).
POLICY_WIDTH: Final = 80

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])(?:\s+ago)?$")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def add_commands(commands: Any, database_help: str) -> None:
    """Add ``status`` and ``history`` to the ``cronjob`` command's subparsers."""
    status = commands.add_parser(
        "status",
        help="show the jobs, their state and the live replicas (exit 1 if one needs a human)",
        description=(
            "Show every job on record — spec, next instant, state, last outcome, duration, "
            "failures in a row — then the retired jobs (on record, but registered by no "
            "live replica), then the live replicas. Exits 1, with one line on stderr, "
            "when a job is failing or stale (no successful end within two periods plus "
            "60 s), its replicas registered different specs, or it is a schedule whose "
            "task no live replica registers; never for a retired job."
        ),
    )
    status.add_argument(
        "name", metavar="NAME", nargs="?", help="show this job (or schedule id) only"
    )
    status.add_argument(
        "--task", metavar="T", default=None, help="show the schedules of task T only"
    )
    status.add_argument(
        "--unsent-after",
        type=float,
        default=UNSENT_AFTER,
        metavar="SECONDS",
        help="exit 1 when an occurrence handed to a task queue is still unsent after "
        f"SECONDS (default {UNSENT_AFTER:g})",
    )
    status.add_argument(
        "--serve",
        type=_address,
        default=None,
        metavar="HOST:PORT",
        help="serve the status page (read only) at http://HOST:PORT/ until interrupted",
    )
    history = commands.add_parser(
        "history",
        help="list a job's latest rounds",
        description="List the latest rounds of a job, newest first.",
    )
    history.add_argument("name", metavar="NAME", help="the job, or a schedule's id")
    history.add_argument(
        "--limit", type=_limit, default=20, metavar="N", help="at most N rounds (default 20)"
    )
    history.add_argument(
        "--failed",
        action="store_true",
        help="only rounds that failed, timed out, missed their start deadline or were given up",
    )
    history.add_argument(
        "--since",
        type=_since,
        default=None,
        metavar="WHEN",
        help="only rounds that ended since WHEN: a time ('2026-03-02 09:00', UTC unless it "
        "names an offset), or '2h', '30m ago', '1d', 'today', 'yesterday'",
    )
    for parser in (status, history):
        parser.add_argument("--database-url", metavar="URL", default=None, help=database_help)
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def run_status(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob status``: the table (or JSON); the exit status says whether all is well.

    ``out`` and ``err`` default to the standard streams of the moment of the call.
    """
    out, err = out or sys.stdout, err or sys.stderr
    if args.serve is not None:
        return _serve(args, err)

    def show() -> int:
        report = admin.status(_database(args))
        jobs = report.jobs
        if args.name is not None:
            jobs = tuple(job for job in jobs if job.name == args.name)
            if not jobs:
                raise admin.UnknownJob(f"no job named {args.name!r} is on record")
            report = dataclasses.replace(report, jobs=jobs)
        if args.task is not None:
            jobs = tuple(job for job in report.jobs if job.task == args.task)
            if not jobs:
                raise admin.UnknownJob(f"no schedule of task {args.task!r} is on record")
            report = dataclasses.replace(report, jobs=jobs)
        if args.json:
            _print_json(_jsonable(report) | {"healthy": report.healthy}, out)
        else:
            _print_status(report, out)
        problems = report.problems
        if report.outbox.overdue(report.checked_at, after=args.unsent_after):
            problems += (
                f"outbox: {report.outbox.unsent} occurrence(s) unsent, the oldest recorded "
                f"{_time(report.outbox.oldest)}",
            )
        if problems:
            noun = "job needs" if len({p.split(":", 1)[0] for p in problems}) == 1 else "jobs need"
            print(f"cronjob: {noun} attention: " + "; ".join(problems), file=err)
            return EXIT_UNHEALTHY
        return 0

    return _guarded(show, err)


def run_history(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob history NAME``: the job's latest rounds, newest first."""
    out, err = out or sys.stdout, err or sys.stderr

    def show() -> int:
        rounds = admin.history(
            _database(args), args.name, limit=args.limit, failed=args.failed, since=args.since
        )
        if args.json:
            _print_json(rounds, out)
            return 0
        if not rounds:
            print(f"no rounds of {_cell(args.name)} on record", file=out)
            return 0
        rows = [
            [
                _time(r.instant),
                str(r.attempt),
                _why(r),
                _cell(r.replica),
                _time(r.started),
                _duration(r.duration),
                str(r.outcome),
                _cell(r.error or "", ERROR_WIDTH),
            ]
            for r in rounds
        ]
        headers = ["INSTANT (UTC)", "ATTEMPT", "WHY", "REPLICA", "STARTED", "DURATION"]
        _print_table([*headers, "OUTCOME", "ERROR"], rows, out)
        return 0

    return _guarded(show, err)


# -- output -------------------------------------------------------------------------------


def _print_status(report: admin.Status, out: TextIO) -> None:
    rows = []
    # Retired jobs are shown apart, after the others: nothing runs them on purpose.
    jobs = [job for job in report.jobs if job.activity is not admin.Activity.RETIRED]
    for job in jobs:
        spec = job.spec if job.spec is not None else "?"
        if job.specs_seen:
            spec += " (replicas disagree)"
        rows.append(
            [
                _cell(job.name),
                _cell(spec),
                "paused" if job.paused else _time(job.next_instant),
                _state(job, pause_detail=False),
                _last(job),
                _duration(job.last_duration),
                str(job.consecutive_failures) if not job.per_instance else "-",
                str(job.missed) if not job.per_instance else "-",
            ]
        )
    headers = ["JOB", "SPEC", "NEXT (UTC)", "STATE", "LAST", "DURATION", "FAILURES", "MISSED"]
    if any(job.task != job.name for job in jobs):  # a column once a schedule is shown
        headers.insert(1, "TASK")
        for row, job in zip(rows, jobs, strict=True):
            row.insert(1, _cell(job.task))
    if any(job.policies for job in jobs):  # a column only when some job has one
        headers.append("POLICIES")
        for row, job in zip(rows, jobs, strict=True):
            row.append(_cell(policy_text(job.policies), POLICY_WIDTH) or "-")
    if rows:
        _print_table(headers, rows, out)
    elif not report.retired:
        print("no jobs on record", file=out)
    pauses = [row for row in map(_pause_row, report.jobs) if row is not None]
    if pauses:  # who paused what, when and why: beside the jobs, not in their STATE cell
        print(file=out)
        _print_table(["PAUSED", "BY", "SINCE (UTC)", "REASON"], pauses, out)
    acks = [row for row in map(_ack_row, report.jobs) if row is not None]
    if acks:  # missed instants acknowledged: who, up to when, why
        print(file=out)
        _print_table(["ACKNOWLEDGED", "INSTANTS", "UP TO (UTC)", "BY", "AT", "REASON"], acks, out)
    if report.retired:
        if rows:
            print(file=out)
        _print_retired(report.retired, out)
    if report.outbox.unsent:
        print(
            f"outbox: {report.outbox.unsent} occurrence(s) not yet accepted by their task "
            f"queue, the oldest recorded {_time(report.outbox.oldest)} UTC",
            file=out,
        )
    print(file=out)
    replicas = [
        [
            _cell(r.id),
            _cell(r.host),
            str(r.pid),
            _cell(r.version),
            _time(r.started),
            _time(r.last_seen),
            str(len(r.jobs)),
        ]
        for r in report.replicas
    ]
    if replicas:
        headers = ["REPLICA", "HOST", "PID", "VERSION", "STARTED (UTC)", "LAST SEEN", "JOBS"]
        if any(r.tasks for r in report.replicas):  # the tasks they run schedules of
            headers.append("TASKS")
            for row, replica in zip(replicas, report.replicas, strict=True):
                row.append(_cell(", ".join(replica.tasks), POLICY_WIDTH) or "-")
        _print_table(headers, replicas, out)
    else:
        print("no live replicas (none seen in the last minute)", file=out)


def _print_retired(jobs: tuple[admin.JobStatus, ...], out: TextIO) -> None:
    """The retired jobs, under a line that says what they are and how to remove one."""
    print(
        f"retired: {len(jobs)} job{'s' if len(jobs) != 1 else ''} on record that no live "
        "replica registers (cronjob forget NAME deletes one)",
        file=out,
    )
    rows = [
        [
            _cell(job.name),
            _cell(job.spec if job.spec is not None else "?"),
            _last(job),
            _time(job.last_success),
        ]
        for job in jobs
    ]
    _print_table(["JOB", "SPEC", "LAST", "LAST SUCCESS (UTC)"], rows, out)


def _print_table(headers: list[str], rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip(), file=out)


def _print_json(value: Any, out: TextIO) -> None:
    """Print ``value`` on ``out`` as indented JSON: dataclasses as objects, instants in
    ISO 8601 UTC, durations in seconds, enums as their values."""
    print(json.dumps(_jsonable(value), indent=2), file=out)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, admin.RoundRecord):
            fields["duration"] = _jsonable(value.duration)
        return fields
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_jsonable(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    return value


# -- input --------------------------------------------------------------------------------


def _database(args: argparse.Namespace) -> str:
    database = resolve_database(args.database_url)
    assert isinstance(database, str)
    return database


def _guarded(show: Callable[[], int], err: TextIO) -> int:
    try:
        return show()
    except (admin.StatusError, admin.UnknownJob, ValueError) as exc:
        print(f"cronjob: error: {exc}", file=err)
        return EXIT_USAGE
    except lease.LeaseError as exc:
        print(f"cronjob: error: the database could not be read: {exc}", file=err)
        return EXIT_DATABASE


def _serve(args: argparse.Namespace, err: TextIO) -> int:
    """``cronjob status --serve HOST:PORT``: the page, until interrupted (exit 0)."""
    from . import _web as web

    host, port = args.serve
    try:
        web.serve(
            _database(args),
            host,
            port,
            ready=lambda url: print(f"cronjob: status page at {url} (Ctrl-C stops)", file=err),
        )
    except OSError as exc:
        print(f"cronjob: error: cannot serve at {host}:{port}: {exc.strerror or exc}", file=err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        pass
    return 0


def _address(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT, like 127.0.0.1:8321, got {text!r}")
    return host.strip("[]"), int(port)


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 1 <= value <= admin.HISTORY_LIMIT:
        raise argparse.ArgumentTypeError(f"must be from 1 to {admin.HISTORY_LIMIT}, got {value}")
    return value


def _since(text: str, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> datetime:
    """A time as people type it; relative forms count back from the wall clock's now."""
    spoken = text.strip().lower()
    relative = _RELATIVE.match(spoken)
    if relative is not None:
        return now() - timedelta(seconds=int(relative[1]) * _UNITS[relative[2]])
    if spoken in ("today", "yesterday"):
        midnight = now().replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight - timedelta(days=1 if spoken == "yesterday" else 0)
    from dateutil import parser as dateutil_parser  # only `history --since` needs it

    try:
        moment = dateutil_parser.parse(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: try '2026-03-02 09:00', '2h', '30m ago' or 'yesterday'"
        ) from None
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)
