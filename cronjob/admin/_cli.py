"""The ``cronjob`` command line.

``cronjob next SPEC`` shows when a schedule fires; ``cronjob run MODULE...`` imports the
modules that register jobs and runs the scheduler (see `cronjob.admin._run`);
``cronjob status`` and ``cronjob history NAME`` show what the replicas did (see
`cronjob.admin._read_cli`), ``cronjob schedules`` the schedules made of data (see
`cronjob.admin._schedules_cli`); ``cronjob pause``, ``resume`` and ``trigger`` stop, restart
and run a job now on every replica, and ``cronjob forget`` deletes a retired job's record
(see `cronjob.admin._control_cli`); ``cronjob beat -A APP`` runs a Celery app's
``beat_schedule`` (see `cronjob.contrib.celery`, imported only by that command).

Bad input gets one line on stderr, ``cronjob: error: ...``, and exit status 2, never a
traceback. This is the one place in the package that reads the wall clock: the default
``--after`` of ``cronjob next`` is now, and so are the relative times of ``history
--since``.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import NoReturn, TextIO

from .._exceptions import ScheduleError
from .._jitter import jitter_delay
from .._policy import policy_text
from .._registry import Job, default_registry
from .._schedule import DstMark, Schedule, parse
from ..engine import DEFAULT_MAX_WORKERS
from ._ack_cli import add_missed_command, run_missed
from ._backfill_cli import add_backfill_command, run_backfill
from ._control_cli import add_commands as add_control_commands
from ._control_cli import run_forget, run_pause, run_resume, run_trigger
from ._read_cli import add_commands, run_history, run_status
from ._schedules_cli import add_command as add_schedules_command
from ._schedules_cli import run_schedules

__all__ = ["main"]

#: How many instants ``cronjob next`` shows unless told otherwise.
DEFAULT_COUNT = 5

#: ``cronjob beat``'s round threads unless told otherwise. Its rounds are hand-offs,
#: which spend their thread waiting (for their group's record and mark, for the broker),
#: and the records of an instant's rounds share one transaction only when every round
#: has a thread: at 167 entries a second, 64 threads started them in three waves, each
#: with its own record and mark (docs/benchmarks.md, #47). Threads start on demand.
BEAT_MAX_WORKERS = 256

_DST_NOTES = {
    DstMark.SKIPPED: "[DST: local time skipped -> first instant after the gap]",
    DstMark.FIRST_PASS: "[DST: repeated local time, first pass]",
    DstMark.SECOND_PASS: "[DST: repeated local time, second pass]",
}


_DATABASE_HELP = (
    "the primary database (default: $CRONJOB_DATABASE_URL, else an embedded SQLite file "
    "in the working directory)"
)


class _UsageError(Exception):
    """Raised when the command line cannot be honoured; its message is shown as is."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage and exits on its own; we want one line and a return
    # value from main(), so raise instead (subparsers inherit this class).
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _instant(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time, e.g. 2026-03-08T06:00:00Z"
        ) from None
    # A naive value is read as UTC, never as the local zone: the output is about
    # instants, and the machine's zone is no part of any schedule.
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def _build_parser(prog: str, jobs_imported: bool) -> _Parser:
    parser = _Parser(
        prog=prog,
        description="Run import-time registered jobs on cron schedules.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    show = commands.add_parser(
        "next",
        help="show the next instants of a schedule",
        description=(
            "Show the next instants of a schedule spec, in UTC and in the spec's zone, "
            "marking those a daylight-saving transition touches."
        ),
    )
    show.add_argument(
        "spec",
        metavar="SPEC",
        help="e.g. '0 */5 * * * *', '@every 1h30m' or a CRON_TZ= spec; or the name of a job "
        "registered by a --module (or by the framework's app), to show its policies too",
    )
    show.add_argument(
        "--module",
        dest="modules",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this module (it registers jobs) so that SPEC may name one of its jobs",
    )
    show.add_argument(
        "-n",
        dest="count",
        type=_count,
        default=DEFAULT_COUNT,
        metavar="N",
        help=f"how many instants to show (default {DEFAULT_COUNT})",
    )
    show.add_argument(
        "--after",
        type=_instant,
        default=None,
        metavar="TIME",
        help="start strictly after this ISO 8601 time; a time without an offset is UTC "
        "(default: now)",
    )

    run = commands.add_parser(
        "run",
        help="import modules that register jobs and run them until SIGTERM or SIGINT",
        description=(
            "Import the modules, which register their jobs, and run the scheduler until "
            "SIGTERM or SIGINT, then drain."
        ),
    )
    run.add_argument("--database-url", metavar="URL", default=None, help=_DATABASE_HELP)
    run.add_argument(
        "--max-workers",
        metavar="N",
        type=_positive,
        default=DEFAULT_MAX_WORKERS,
        help=f"threads for sync rounds running at once (default: {DEFAULT_MAX_WORKERS})",
    )
    run.add_argument(
        "modules",
        metavar="MODULE",
        # A framework's command has imported the jobs already: modules are optional.
        nargs="*" if jobs_imported else "+",
        help="a module to import",
    )
    _add_beat_command(commands)
    _add_stream_worker_command(commands)
    add_commands(commands, _DATABASE_HELP)
    add_schedules_command(commands, _DATABASE_HELP)
    add_control_commands(commands, _DATABASE_HELP)
    add_backfill_command(commands, _DATABASE_HELP, _instant)
    add_missed_command(commands, _DATABASE_HELP, _instant)
    return parser


def _add_beat_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    """``cronjob beat -A APP``: argparse only; Celery is imported when it runs."""
    beat = commands.add_parser(
        "beat",
        help="run a Celery app's beat_schedule on this replica, instead of celery beat",
        description=(
            "Load the Celery app (as celery -A does), register each beat_schedule entry "
            "as a job that sends its task once per instant, and run them like cronjob run "
            "(needs the celery extra)."
        ),
    )
    beat.add_argument(
        "-A", "--app", required=True, metavar="MODULE[:APP]", help="the Celery app, e.g. proj"
    )
    beat.add_argument(
        "--list",
        action="store_true",
        help="print each entry as a job (name, spec, task), tab-separated, and exit",
    )
    beat.add_argument("--database-url", metavar="URL", default=None, help=_DATABASE_HELP)
    beat.add_argument(
        "--max-workers",
        metavar="N",
        type=_positive,
        default=BEAT_MAX_WORKERS,
        help=f"threads for sync rounds running at once (default: {BEAT_MAX_WORKERS})",
    )
    for option, knob, seconds, what, derived in (
        (
            "--retry-within",
            "retry_within",
            _seconds_or_zero,
            "the round retries a refused send",
            "until shortly before the next instant",
        ),
        (
            "--hold",
            "hold",
            _seconds,
            "an attempt keeps its outbox row from the other replicas",
            "the hand-off's",
        ),
        (
            "--send-timeout",
            "send_timeout",
            _seconds,
            "one send waits for the broker",
            "below the hold",
        ),
    ):
        beat.add_argument(
            option,
            dest=knob,
            metavar="SECONDS",
            type=seconds,
            default=None,
            help=(
                f"seconds {what}, for every entry whose options set no cronjob_{knob} "
                f"(default: derived, {derived})"
            ),
        )
    beat.add_argument(
        "modules", metavar="MODULE", nargs="*", help="more modules that register jobs"
    )


def _add_stream_worker_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    """``cronjob stream-worker MODULE...``: argparse only; redis is imported when it runs."""
    worker = commands.add_parser(
        "stream-worker",
        help="run the handlers of a Redis Stream's occurrences (cronjob.contrib.streams)",
        description=(
            "Import the modules (they register the handlers and the jobs), then read the "
            "stream in the consumer group, check each entry and run its handler once per "
            "occurrence id, until SIGTERM (needs the redis extra)."
        ),
    )
    worker.add_argument("--redis", required=True, metavar="URL", help="redis://host:port/db")
    worker.add_argument("--stream", required=True, metavar="KEY", help="the stream's key")
    worker.add_argument("--group", required=True, metavar="NAME", help="the consumer group")
    worker.add_argument("--consumer", metavar="NAME", default=None, help="this consumer's name")
    worker.add_argument(
        "--claim-idle",
        metavar="SECONDS",
        type=float,
        default=None,
        help="take over an entry pending this long with another consumer (default: 60)",
    )
    worker.add_argument("--database-url", metavar="URL", default=None, help=_DATABASE_HELP)
    worker.add_argument("modules", metavar="MODULE", nargs="+", help="a module to import")


def _run_stream_worker(args: argparse.Namespace) -> int:
    try:
        # Deferred: `import cronjob` and every other command never import redis.
        from ..contrib.streams._cli import run_stream_worker
    except ImportError as exc:
        raise _UsageError(
            f"cronjob stream-worker needs redis ({exc}): pip install 'cronjob-lease[redis]'"
        ) from None
    return run_stream_worker(args)


def _run_beat(args: argparse.Namespace) -> int:
    try:
        # Deferred: `import cronjob` and every other command never import Celery.
        from ..contrib.celery._beat_cli import run_beat
    except ImportError as exc:
        raise _UsageError(
            f"cronjob beat needs Celery ({exc}): pip install 'cronjob-lease[celery]'"
        ) from None
    return run_beat(args)


def _seconds(text: str) -> float:
    value = _seconds_or_zero(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


def _seconds_or_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, not {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = "cronjob",
    database_url: str | None = None,
    jobs_imported: bool = False,
) -> int:
    """Run the ``cronjob`` command line.

    The framework commands (``manage.py cronjob``, ``flask cronjob``) are this same
    command line, given their defaults through the keywords.

    Args:
        argv: The arguments after the program name; ``None`` reads ``sys.argv[1:]``.
        prog: The program's name in usage and help.
        database_url: The default of every command's ``--database-url`` (the framework's
            database); ``None`` leaves it to ``$CRONJOB_DATABASE_URL`` and the SQLite file.
        jobs_imported: The caller has imported the modules that register jobs, so
            ``run`` needs no ``MODULE`` (with none, it runs the default registry).

    Returns:
        The exit status: 0 on success, 2 for bad input (after one line on stderr);
        ``status`` returns 1 when a job needs a human, and ``status``/``history`` 3 when
        the database could not be read.
    """
    parser = _build_parser(prog, jobs_imported)
    try:
        args = parser.parse_args(argv)
        if getattr(args, "database_url", "") is None:  # a command with --database-url
            args.database_url = database_url
        if args.command == "run":
            from ._run import run_command  # deferred: the scheduler is not needed for `next`

            return run_command(args)
        if args.command == "beat":
            return _run_beat(args)
        if args.command == "stream-worker":
            return _run_stream_worker(args)
        commands: dict[str, Callable[[argparse.Namespace], int]] = {
            "status": run_status,
            "history": run_history,
            "pause": run_pause,
            "resume": run_resume,
            "trigger": run_trigger,
            "forget": run_forget,
            "backfill": run_backfill,
            "missed": run_missed,
            "schedules": run_schedules,
        }
        if args.command in commands:
            return commands[args.command](args)
        job = _named_job(args.spec, args.modules, jobs_imported)
        if job is not None:
            return _show_job_next(job, args.count, args.after, sys.stdout)
        return _show_next(args.spec, args.count, args.after, sys.stdout)
    except (_UsageError, ScheduleError) as exc:
        print(f"cronjob: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help: argparse has printed it and asks to exit
        return exc.code if isinstance(exc.code, int) else 0


def _named_job(spec: str, modules: list[str], jobs_imported: bool) -> Job | None:
    """The job of the default registry named ``spec``, once ``modules`` are imported;
    ``None`` when neither a module nor the framework registered jobs, or none has that
    name (``spec`` is then a schedule spec).

    Raises:
        _UsageError: a module cannot be imported, or registers a job it cannot.
    """
    if not modules and not jobs_imported:
        return None
    sys.path.insert(0, os.getcwd())  # as `cronjob run`: the working directory first
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise _UsageError(
                f"cannot import job module {module!r}: {type(exc).__name__}: {exc}"
            ) from exc
    found = [job for job in default_registry.jobs if job.name == spec]
    if not found and modules and not _looks_like_spec(spec):
        names = ", ".join(sorted(job.name for job in default_registry.jobs)) or "none"
        raise _UsageError(f"no job named {spec!r} is registered (jobs: {names})")
    return found[0] if found else None


def _looks_like_spec(text: str) -> bool:
    """Whether ``text`` could be a schedule spec rather than a job's name."""
    return text.startswith(("@", "CRON_TZ=", "TZ=")) or " " in text.strip()


def _show_job_next(job: Job, count: int, after: datetime | None, out: TextIO) -> int:
    """``cronjob next JOB``: the job's next instants, then its policies."""
    kind = "leased" if job.leased else "per instance"
    print(f"job {job.name!r} ({kind}): {job.schedule.spec}", file=out)
    described = policy_text(job.policy.describe())
    print(f"policies: {described or 'none'}", file=out)
    return _show_next(job.schedule.spec, count, after, out, job=job)


def _show_next(
    spec: str, count: int, after: datetime | None, out: TextIO, *, job: Job | None = None
) -> int:
    """Print the next ``count`` instants of ``spec`` after ``after``; with a ``job``
    that has a ``jitter``, each instant's delayed start too (the same on every replica)."""
    schedule = parse(spec)
    start = after if after is not None else datetime.now(UTC)
    zone = schedule.zone
    if schedule.period is not None:
        where = f"every {schedule.period}s from the Unix epoch, UTC"
    elif zone is None:
        where = "UTC"
    else:
        rule = "fixed-time" if schedule.fixed_time else "wildcard"
        where = f"zone {zone.key}, {rule} DST rule"
    noun = "instant" if count == 1 else "instants"
    print(f"next {count} {noun} of {spec!r} ({where}) after {start.isoformat()}:", file=out)
    moment = start
    for _ in range(count):
        found = schedule.next(moment)
        if found is None:
            print("  (no further instant up to the end of year 9999)", file=out)
            break
        line = _format_line(schedule, found)
        jitter = None if job is None else job.policy.jitter
        if job is not None and jitter is not None:
            delay = jitter_delay(job.name, found, jitter, schedule.next(found))
            line += f"  starts +{delay.total_seconds():g}s (jitter)"
        print(line, file=out)
        moment = found
    return 0


def _format_line(schedule: Schedule, instant: datetime) -> str:
    parts = [instant.isoformat()]
    if schedule.zone is not None:
        parts.append(instant.astimezone(schedule.zone).isoformat())
        mark = schedule._dst_mark(instant)
        if mark is not None:
            parts.append(_DST_NOTES[mark])
    return "  " + "  ".join(parts)
