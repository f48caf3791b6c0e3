"""``cronjob schedules``: the schedules made of data on record, for people and scripts.

Reads the ``cronjob_schedule`` table (see `cronjob.schedules`) and the schedules' lease
rows (for their pause) on the database the replicas share, as ``cronjob status`` does:
no application module, nothing written, nothing migrated. The table shows each schedule's
id, task, spec (or ``@at <instant>``), next instant, start, end and the size of its
arguments in bytes, never the arguments themselves (they may hold what an operator's
terminal should not); ``--json`` has them whole. The policies a schedule sets for itself
(its task's are in ``cronjob status``) get a column when some schedule has any, in both
forms, a heartbeat by its host only (the path of a ping URL is its check's key). Removed
schedules (tombstones) are not listed.

Exit statuses as ``cronjob status``'s: 0 listed (none on record is said, still 0), 2 bad
input (no tables, an older schema), 3 the database could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any, TextIO

import lease

from .._policy import policy_text
from ..schedules._policies import described
from . import _scheduled
from ._base import at_ms, store_on
from ._format import _cell, _time
from ._read_cli import POLICY_WIDTH, _database, _guarded, _print_json, _print_table
from ._spec import next_instant

__all__ = ["add_command", "run_schedules"]


def add_command(commands: Any, database_help: str) -> None:
    """Add ``schedules`` to the ``cronjob`` command's subparsers."""
    parser = commands.add_parser(
        "schedules",
        help="list the schedules made of data (cronjob.schedules), by id",
        description=(
            "List the schedules made of data on record, sorted by id: id, task, spec (or "
            "@at INSTANT for a one-off), next instant (within start and end; 'paused' "
            "while paused), start, end, the size of the arguments in bytes, and the "
            "policies a schedule sets for itself (when some has any). The arguments "
            "themselves are shown only with --json."
        ),
    )
    parser.add_argument("--task", metavar="T", default=None, help="only the schedules of task T")
    parser.add_argument(
        "--prefix", metavar="P", default=None, help="only the schedules whose id starts with P"
    )
    parser.add_argument("--database-url", metavar="URL", default=None, help=database_help)
    parser.add_argument(
        "--json", action="store_true", help="print JSON for scripts (arguments included)"
    )


def run_schedules(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob schedules [--task T] [--prefix P] [--json]``."""
    out, err = out or sys.stdout, err or sys.stderr

    def show() -> int:
        with store_on(_database(args)) as store:
            now = at_ms(store.now_ms())
            rows = _scheduled.read(store, task=args.task, prefix=args.prefix)
            leases = store.read([row.id for row in rows])
        listed = []
        for row in rows:
            lease_row = leases.get(row.id)
            paused = lease_row is not None and lease_row.paused is not None
            schedule = _scheduled.timing_of(row)
            following = None if schedule is None or paused else next_instant(schedule, now)
            listed.append((row, paused, following))
        if args.json:
            _print_json([_entry(row, paused, following) for row, paused, following in listed], out)
            return 0
        if not listed:
            which = "".join(
                f" {what} {_cell(value)!r}"
                for what, value in (("of task", args.task), ("with prefix", args.prefix))
                if value is not None
            )
            print(f"no schedules{which} on record", file=out)
            return 0
        table = [
            [
                _cell(row.id),
                _cell(row.task),
                _cell(_scheduled.shown_spec(row)),
                "paused" if paused else _time(following),
                _time(row.start),
                _time(row.end),
                str(len(row.args.encode("utf-8"))),
            ]
            for row, paused, following in listed
        ]
        headers = ["ID", "TASK", "SPEC", "NEXT (UTC)", "START (UTC)", "END (UTC)", "ARGS (BYTES)"]
        if any(row.policies for row, _paused, _following in listed):
            headers.append("OWN POLICIES")
            for line, (row, _paused, _following) in zip(table, listed, strict=True):
                line.append(_cell(policy_text(described(row.policies)), POLICY_WIDTH) or "-")
        _print_table(headers, table, out)
        return 0

    return _guarded(show, err)


def _entry(row: lease.ScheduleRow, paused: bool, following: datetime | None) -> dict[str, Any]:
    """One schedule for ``--json``: its record, its pause and next instant."""
    return {
        "id": row.id,
        "task": row.task,
        "spec": row.spec,
        "at": row.at,
        "shown_spec": _scheduled.shown_spec(row),
        "next_instant": following,
        "paused": paused,
        "start": row.start,
        "end": row.end,
        "args_bytes": len(row.args.encode("utf-8")),
        "args": json.loads(row.args),
        "policies": described(row.policies),
        "created": row.created,
        "updated": row.updated,
    }
