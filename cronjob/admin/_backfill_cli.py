"""``cronjob backfill NAME --from T1 --to T2 [--max N]`` and ``cronjob backfill NAME
--cancel``: a thin layer over [cronjob.admin.backfill][] and
[cronjob.admin.cancel_backfill][]. Exit statuses: 0 queued (or nothing owed: said so),
or cancelled (or nothing queued: said so); 2 bad input, an unknown job, or a range of
more than ``--max`` instants (nothing written); 3 the database could not be reached.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from .. import admin
from ._format import _cell, _time
from ._read_cli import _database, _guarded, _print_json

__all__ = ["add_backfill_command", "run_backfill"]


def add_backfill_command(commands: Any, database_help: str, instant: Any) -> None:
    """Add ``backfill`` to the ``cronjob`` command's subparsers."""
    command = commands.add_parser(
        "backfill",
        help="run the instants of a past range that have no round on record",
        description=(
            "Queue each instant of [FROM, TO) of a job that has no round on record; the "
            "replicas that register the job run them one at a time, oldest first, under "
            "its lease (why=backfill in the history). Asking again queues nothing more. "
            "Instants at or after now are the schedule's. With --cancel, stop the job's "
            "backfill after the round in flight."
        ),
    )
    command.add_argument("name", metavar="NAME", help="the job (or schedule id)")
    command.add_argument("--from", dest="start", metavar="T1", type=instant, default=None)
    command.add_argument("--to", dest="end", metavar="T2", type=instant, default=None)
    command.add_argument(
        "--cancel",
        action="store_true",
        help="close the instants still queued (the round in flight ends as ever)",
    )
    command.add_argument(
        "--max",
        dest="limit",
        metavar="N",
        type=int,
        default=admin.BACKFILL_LIMIT,
        help=f"the most instants the range may hold (default {admin.BACKFILL_LIMIT:,})",
    )
    command.add_argument("--json", action="store_true", help="print what was queued as JSON")
    command.add_argument("--by", metavar="WHO", default=None, help="who (default: user@host)")
    command.add_argument("--database-url", metavar="URL", default=None, help=database_help)


def run_backfill(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob backfill NAME --from T1 --to T2 [--max N]`` or ``--cancel``: exit 0
    queued (or nothing owed) or cancelled (or nothing queued), 2 bad input or a range
    over ``--max`` (nothing written), 3 no database."""
    out, err = out or sys.stdout, err or sys.stderr
    if args.cancel and (args.start is not None or args.end is not None):
        print("cronjob backfill: --cancel takes no --from or --to", file=err)
        return 2
    if not args.cancel and (args.start is None or args.end is None):
        print("cronjob backfill: --from and --to are required (or --cancel)", file=err)
        return 2

    def cancel() -> int:
        done = admin.cancel_backfill(_database(args), args.name, by=args.by)
        if args.json:
            _print_json(done, out)
            return 0
        running = (
            ""
            if done.running is None
            else f"; the round of {_time(done.running)} UTC in flight ends as ever"
        )
        if not done.cancelled:
            print(f"no backfill of {_cell(done.job)} is queued{running}", file=out)
            return 0
        print(
            f"cancelled the backfill of {_cell(done.job)}: {len(done.cancelled)} instant(s) "
            f"not run, {_time(done.cancelled[0])} to {_time(done.cancelled[-1])} UTC"
            f"{running}",
            file=out,
        )
        return 0

    def act() -> int:
        done = admin.backfill(
            _database(args),
            args.name,
            start=args.start,
            end=args.end,
            by=args.by,
            limit=args.limit,
        )
        if args.json:
            _print_json(done, out)
            return 0
        if not done.queued:
            print(
                f"nothing to backfill for {_cell(done.job)}: each of the {done.instants} "
                "instant(s) of the range has a round on record, or is queued already",
                file=out,
            )
            return 0
        print(
            f"queued {len(done.queued)} instant(s) of {_cell(done.job)} for backfill, "
            f"{_time(done.queued[0])} to {_time(done.queued[-1])} UTC ({done.on_record} "
            "of the range on record or queued already); the replicas run them one at a "
            "time, oldest first (cronjob status shows them)",
            file=out,
        )
        return 0

    return _guarded(cancel if args.cancel else act, err)
