"""``cronjob missed NAME [--ack [--until T] [--reason TEXT] [--by WHO]] [--json]``: a
job's missed instants of the last day, and their acknowledgement — a thin layer over
[cronjob.admin.status][] and [cronjob.admin.acknowledge][].

Without ``--ack`` it reads: the job's missed, skipped (by its catch-up policy) and
acknowledged instants and the latest acknowledgement; exit 1 when some are missed (as
``status``). With ``--ack`` it writes the acknowledgement and prints it; exit 0. Either
way: 2 bad input or an unknown job (nothing written), 3 the database could not be reached.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Final, TextIO

from .. import admin
from ._format import _acknowledged, _cell, _time
from ._read_cli import EXIT_UNHEALTHY, _database, _guarded, _print_json

__all__ = ["add_missed_command", "run_missed"]

#: The longest reason, in characters (a longer one is refused, never cut).
REASON_LENGTH: Final = admin.REASON_LENGTH


def add_missed_command(commands: Any, database_help: str, instant: Any) -> None:
    """Add ``missed`` to the ``cronjob`` command's subparsers."""
    command = commands.add_parser(
        "missed",
        help="a job's missed instants of the last day; --ack acknowledges them",
        description=(
            "Show a job's instants of the last day that no replica ran: missed (no catch-up "
            "decided on them: status exits 1), skipped by its catch-up policy, or "
            "acknowledged. With --ack, acknowledge the missed ones up to --until (now by "
            "default), on record with who (--by) and why (--reason): they stop counting "
            "toward status's exit status. To run them instead, see cronjob backfill."
        ),
    )
    command.add_argument("name", metavar="NAME", help="the job (or schedule id)")
    command.add_argument("--ack", action="store_true", help="acknowledge the missed instants")
    command.add_argument(
        "--until",
        metavar="T",
        type=instant,
        default=None,
        help="the last instant acknowledged (default: now); with --ack",
    )
    command.add_argument(
        "--reason", metavar="TEXT", default=None, help=f"why, at most {REASON_LENGTH} characters"
    )
    command.add_argument("--by", metavar="WHO", default=None, help="who (default: user@host)")
    command.add_argument("--json", action="store_true", help="print the result as JSON")
    command.add_argument("--database-url", metavar="URL", default=None, help=database_help)


def run_missed(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob missed NAME [--ack ...]``: exit 0 (acknowledged, or nothing missed), 1
    some instants missed (without ``--ack``), 2 bad input, 3 no database."""
    out, err = out or sys.stdout, err or sys.stderr
    if not args.ack and (args.until is not None or args.reason is not None or args.by):
        print("cronjob missed: --until, --reason and --by go with --ack", file=err)
        return 2

    def ack() -> int:
        done = admin.acknowledge(
            _database(args), args.name, until=args.until, reason=args.reason, by=args.by
        )
        if args.json:
            _print_json(done, out)
            return 0
        print(
            f"acknowledged the missed instants of {_cell(args.name)} up to "
            f"{_time(done.through)} UTC, by {_cell(done.by or '?')}"
            + (f" ({_cell(done.reason)})" if done.reason else ""),
            file=out,
        )
        return 0

    def show() -> int:
        jobs = [job for job in admin.status(_database(args)).jobs if job.name == args.name]
        if not jobs:
            raise admin.UnknownJob(f"no job named {args.name!r} is on record")
        job = jobs[0]
        if args.json:
            _print_json(
                {
                    "job": job.name,
                    "missed": job.missed,
                    "skipped": job.skipped,
                    "missed_acknowledged": job.missed_acknowledged,
                    "acknowledgement": job.acknowledgement,
                },
                out,
            )
        else:
            print(
                f"{_cell(job.name)}: {job.missed} missed, {job.skipped} skipped by its "
                f"catch-up policy, {job.missed_acknowledged} acknowledged (last day)",
                file=out,
            )
            if job.acknowledgement is not None:
                print(_acknowledged(job.acknowledgement), file=out)
        return EXIT_UNHEALTHY if job.missed else 0

    return _guarded(ack if args.ack else show, err)
