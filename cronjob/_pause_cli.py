"""``cronjob pause`` and ``cronjob resume``: stop and restart a job on every replica.

Thin layers over :func:`cronjob.admin.pause` and friends. Exit statuses: 0 done, or
nothing to do (already paused, not paused: said so); 2 bad input (an unknown job, a
per-instance job, a reason too long, no tables); 3 the database could not be reached.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from . import admin
from ._admin_cli import _cell, _database, _guarded, _time

__all__ = ["add_commands", "run_pause", "run_resume"]


def add_commands(commands: Any, database_help: str) -> None:
    """Add ``pause`` and ``resume`` to the ``cronjob`` command's subparsers."""
    pause = commands.add_parser(
        "pause",
        help="pause a job on every replica (a running round runs to its end)",
        description=(
            "Pause a job on every replica, from its next instant: no replica starts, "
            "re-runs or catches up a round of it until it is resumed. A round running now "
            "is not cancelled. Who (user@host), when and why are on record."
        ),
    )
    pause.add_argument(
        "--reason", metavar="TEXT", default=None, help=f"why (at most {admin.REASON_LENGTH} chars)"
    )
    resume = commands.add_parser(
        "resume",
        help="resume a paused job: its next instant runs",
        description=(
            "Resume a paused job on every replica: its next instant runs. The instants "
            "skipped while it was paused are never run (no catch-up, no re-run)."
        ),
    )
    for parser, what in ((pause, "pause"), (resume, "resume")):
        parser.add_argument("name", metavar="NAME", nargs="?", help=f"the job to {what}")
        parser.add_argument(
            "--all", action="store_true", help=f"{what} every job on record instead"
        )
        parser.add_argument("--by", metavar="WHO", default=None, help="who (default: user@host)")
        parser.add_argument("--database-url", metavar="URL", default=None, help=database_help)


def run_pause(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob pause NAME|--all``: says what it paused, and which rounds run on."""
    out, err = out or sys.stdout, err or sys.stderr

    def act() -> int:
        _one_or_all(args)
        database = _database(args)
        if args.all:
            changes = admin.pause_all(database, reason=args.reason, by=args.by)
            changed = [c for c in changes if c.changed]
            print(f"paused {_jobs(changed, _by(changed))}", file=out)
            for change in changes:
                if not change.changed:
                    print(f"  {_cell(change.job)} was paused already", file=out)
        else:
            change = admin.pause(database, args.name, reason=args.reason, by=args.by)
            changes = (change,)
            if change.changed:
                print(f"paused {_cell(change.job)}{_by(changes)}", file=out)
            else:
                print(f"{_cell(change.job)} is paused already{_since(change)}", file=out)
            if change.pause_reason:
                print(f"  reason: {_cell(change.pause_reason)}", file=out)
        for change in changes:
            if change.running_on is not None and change.changed:
                print(
                    f"  {_cell(change.job)}: the round running on {_cell(change.running_on)} "
                    "is not cancelled: it runs to its end",
                    file=out,
                )
        return 0

    return _guarded(act, err)


def run_resume(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob resume NAME|--all``."""
    out, err = out or sys.stdout, err or sys.stderr

    def act() -> int:
        _one_or_all(args)
        database = _database(args)
        if args.all:
            changes = admin.resume_all(database, by=args.by)
            changed = [c for c in changes if c.changed]
            print(f"resumed {_jobs(changed)}", file=out)
        else:
            change = admin.resume(database, args.name, by=args.by)
            if change.changed:
                print(
                    f"resumed {_cell(change.job)}: its next instant runs; those skipped do not",
                    file=out,
                )
            else:
                print(f"{_cell(change.job)} is not paused: nothing changed", file=out)
        return 0

    return _guarded(act, err)


def _one_or_all(args: argparse.Namespace) -> None:
    if (args.name is None) == (not args.all):
        raise ValueError("name one job, or give --all (not both)")


def _jobs(changes: list[admin.PauseChange], by: str = "") -> str:
    """``2 jobs[ by WHO]: one, two``."""
    if not changes:
        return "no job (none on record in that state)"
    names = ", ".join(_cell(c.job) for c in changes)
    return f"{len(changes)} job{'s' if len(changes) != 1 else ''}{by}: {names}"


def _by(changes: tuple[admin.PauseChange, ...] | list[admin.PauseChange]) -> str:
    return "" if not changes else f" by {_cell(changes[0].paused_by or '?')}"


def _since(change: admin.PauseChange) -> str:
    return f" (by {_cell(change.paused_by or '?')} since {_time(change.paused_since)} UTC)"
