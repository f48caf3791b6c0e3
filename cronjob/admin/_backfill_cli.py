"""``cronjob backfill NAME --from T1 --to T2 [--max N]``: a thin layer over
[cronjob.admin.backfill][]. Exit statuses: 0 queued (or nothing owed: said so); 2 bad
input, an unknown job, or a range of more than ``--max`` instants (nothing written); 3
the database could not be reached.
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
            "Instants at or after now are the schedule's."
        ),
    )
    command.add_argument("name", metavar="NAME", help="the job (or schedule id)")
    command.add_argument("--from", dest="start", metavar="T1", type=instant, required=True)
    command.add_argument("--to", dest="end", metavar="T2", type=instant, required=True)
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
    """``cronjob backfill NAME --from T1 --to T2 [--max N]``: exit 0 queued (or nothing
    owed), 2 bad input or a range over ``--max`` (nothing written), 3 no database."""
    out, err = out or sys.stdout, err or sys.stderr

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

    return _guarded(act, err)
