"""``cronjob pause``, ``resume``, ``trigger`` and ``forget``: an operator's control of the
jobs on every replica.

Thin layers over [cronjob.admin.pause][], [resume][cronjob.admin.resume],
[trigger][cronjob.admin.trigger], `cronjob.admin.forget` and friends. Exit statuses: 0 done,
or nothing to do
(already paused, not paused: said so) — for ``trigger --wait``, the round succeeded; 1
``trigger --wait``: the round failed, was given up, refused, expired, or still ran at the
timeout; 2 bad input (an unknown job, a reason too long, no tables; ``forget``: a job a live
replica registers, or no replica live); 3 the database could
not be reached; 4 ``trigger`` refused now (a round holds the lease, the job is paused
without ``--force``), nothing written; 5 ``trigger``: no live replica has the job (a
leased job's request is written and runs if one starts within 10 minutes; a per-instance
job's, or one for a ``--replica`` not live, is not), and ``--wait`` does not wait.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from .. import admin
from .._clock import Clock
from ._format import _cell, _time
from ._read_cli import EXIT_USAGE, _database, _guarded, _print_json

__all__ = [
    "EXIT_NO_REPLICA",
    "EXIT_REFUSED",
    "add_commands",
    "run_forget",
    "run_pause",
    "run_resume",
    "run_trigger",
]

#: ``cronjob trigger``: refused now (busy, paused); nothing was written.
EXIT_REFUSED = 4
#: ``cronjob trigger``: no live replica has the job. A leased job's request is written
#: (a replica starting within the ttl runs it); a per-instance job's is not.
EXIT_NO_REPLICA = 5
#: ``cronjob trigger --wait``: the round did not succeed (or had not ended by the timeout).
EXIT_NOT_SUCCEEDED = 1


_Changes = Sequence[admin.PauseChange]
#: What ``pause`` or ``resume`` does: to one job (``(database, name, **options)``), to
#: every job on record (``(database, **options)``), and the options both take.
_Change = tuple[
    Callable[..., admin.PauseChange], Callable[..., Sequence[admin.PauseChange]], dict[str, Any]
]
#: What is said of the changes made: ``(args, changes, out)``.
_Say = Callable[[argparse.Namespace, _Changes, TextIO], None]


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
    resume.add_argument(
        "--catch-up",
        action="store_true",
        help="also run the latest instant skipped while paused (within a day), once",
    )
    trigger = commands.add_parser(
        "trigger",
        help="run one round of a job now, on one replica, without moving its schedule",
        description=(
            "Ask for one round of a job now. A replica takes it within one sweep (15 s) "
            "under the job's lease, so it never overlaps a round: if one is running, the "
            "request is refused (exit 4). The schedule does not move. The round sees "
            "ctx.trigger == Trigger.MANUAL; the history records it as manual, with who "
            "asked. A per-instance job runs on every live replica (or --replica ID). A "
            "request no replica takes within 10 minutes expires. When no live replica "
            "has the job, it says so and exits 5 without waiting: a leased job's request "
            "is still written and runs if a replica starts within those 10 minutes (a "
            "deploy); a per-instance job's, or one for a --replica not live, is not."
        ),
    )
    trigger.add_argument("name", metavar="NAME", help="the job (or schedule id) to run")
    trigger.add_argument(
        "--wait",
        action="store_true",
        help="wait for the round's end, print its outcome, exit 0 only if it succeeded",
    )
    trigger.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="with --wait: give up waiting after this long (exit 1; the round goes on)",
    )
    trigger.add_argument("--force", action="store_true", help="run it even while paused")
    trigger.add_argument(
        "--replica",
        metavar="ID",
        default=None,
        help="a per-instance job: run it on this replica only",
    )
    trigger.add_argument("--json", action="store_true", help="print the request(s) as JSON")
    trigger.add_argument("--by", metavar="WHO", default=None, help="who (default: user@host)")
    trigger.add_argument("--database-url", metavar="URL", default=None, help=database_help)
    forget = commands.add_parser(
        "forget",
        help="delete a retired job's lease row and history",
        description=(
            "Delete the record of a retired job, one that no live replica registers any "
            "more (renamed or removed from the code): its lease row, its rounds in the "
            "history and its requests for a round now. Refused (exit 2, nothing deleted) "
            "while a live replica registers it, while no replica is live, for a live "
            "schedule's id (cronjob.schedules.remove removes a schedule), and for a name "
            "not on record."
        ),
    )
    forget.add_argument("name", metavar="NAME", help="the job to forget")
    forget.add_argument("--json", action="store_true", help="print what was deleted as JSON")
    forget.add_argument("--database-url", metavar="URL", default=None, help=database_help)
    for parser, what in ((pause, "pause"), (resume, "resume")):
        parser.add_argument(
            "name", metavar="NAME", nargs="?", help=f"the job (or schedule id) to {what}"
        )
        parser.add_argument(
            "--all", action="store_true", help=f"{what} every job on record instead"
        )
        parser.add_argument("--by", metavar="WHO", default=None, help="who (default: user@host)")
        parser.add_argument("--database-url", metavar="URL", default=None, help=database_help)


def run_pause(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob pause NAME|--all``: says what it paused, and which rounds run on."""
    options = {"reason": args.reason, "by": args.by}
    return _changing(args, (admin.pause, admin.pause_all, options), _say_paused, out, err)


def run_resume(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob resume NAME|--all``."""
    options = {"by": args.by, "catch_up": args.catch_up}
    return _changing(args, (admin.resume, admin.resume_all, options), _say_resumed, out, err)


def _say_paused(args: argparse.Namespace, changes: _Changes, out: TextIO) -> None:
    if args.all:
        print(f"paused {_jobs(changes, _by(changes))}", file=out)
        for change in changes:
            if not change.changed:
                print(f"  {_cell(change.job)} was paused already", file=out)
    else:
        (change,) = changes
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


def _say_resumed(args: argparse.Namespace, changes: _Changes, out: TextIO) -> None:
    if args.all:
        print(f"resumed {_jobs(changes)}", file=out)
    else:
        (change,) = changes
        if change.changed:
            print(
                f"resumed {_cell(change.job)}: its next instant runs; those skipped do not",
                file=out,
            )
        else:
            print(f"{_cell(change.job)} is not paused: nothing changed", file=out)
    for change in changes:
        if change.catch_up is not None:
            print(
                f"  {_cell(change.job)}: catching up {_time(change.catch_up)} UTC, skipped "
                "while paused (a replica claims it within 15 s)",
                file=out,
            )
        elif args.catch_up and change.changed:
            print(f"  {_cell(change.job)}: no instant skipped while paused to catch up", file=out)


def run_trigger(
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    clock: Clock | None = None,
) -> int:
    """``cronjob trigger NAME [--wait]``; ``clock`` paces ``--wait`` (tests pass a fake)."""
    out, err = out or sys.stdout, err or sys.stderr

    def act() -> int:
        database = _database(args)
        try:
            request = admin.trigger(
                database,
                args.name,
                force=args.force,
                replica=args.replica,
                by=args.by,
            )
        except admin.TriggerRefused as exc:
            if exc.why is admin.Refusal.NO_REPLICA:
                print(f"cronjob: no live replica: {exc}", file=err)
                return EXIT_NO_REPLICA
            print(f"cronjob: refused: {exc}", file=err)
            return EXIT_REFUSED
        where = (
            f"on {len(request.replicas)} replica(s): {', '.join(map(_cell, request.replicas))}"
            if request.replicas
            else "by one replica"
        )
        if not args.json and not request.no_live_replica:
            print(
                f"requested a round of {_cell(request.job)} now, {where}, by "
                f"{_cell(request.requested_by)} at {_time(request.requested)} UTC "
                f"(request {', '.join(map(str, request.ids))}; taken within 15 s, or it "
                f"expires at {_time(request.expires)} UTC)",
                file=out,
            )
        if request.no_live_replica:
            # Nobody to take it now: say so, and never wait for nothing.
            print(
                f"cronjob: no live replica has {_cell(request.job)}: request "
                f"{', '.join(map(str, request.ids))} is recorded and runs when a replica "
                f"that has the job starts, if one does before {_time(request.expires)} UTC "
                "(it expires then)",
                file=err,
            )
        if not args.wait or request.no_live_replica:
            if args.json:
                _print_json(request, out)
            return EXIT_NO_REPLICA if request.no_live_replica else 0
        found = admin.wait(database, request, timeout=args.timeout, clock=clock)
        if args.json:
            _print_json(found, out)
        else:
            for r in found:
                print(_ended(r), file=out)
        ok = all(r.succeeded for r in found)
        return 0 if ok else EXIT_NOT_SUCCEEDED

    return _guarded(act, err)


def run_forget(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``cronjob forget NAME``: says what it deleted; a refusal is one line and exit 2."""
    out, err = out or sys.stdout, err or sys.stderr

    def act() -> int:
        try:
            done = admin.forget(_database(args), args.name)
        except admin.ForgetRefused as exc:
            print(f"cronjob: error: refused: {exc}", file=err)
            return EXIT_USAGE
        if args.json:
            _print_json(done, out)
            return 0
        rounds = f"{done.rounds} round{'s' if done.rounds != 1 else ''} of history"
        requests = f"{done.requests} request{'s' if done.requests != 1 else ''} for a round now"
        row = "its lease row, " if done.lease_row else ""
        print(f"forgot {_cell(done.job)}: {row}{rounds}, {requests}", file=out)
        return 0

    return _guarded(act, err)


def _ended(r: admin.RequestStatus) -> str:
    """One line: how request ``r``'s round ended (or that it has not)."""
    head = f"{_cell(r.job)}"
    if r.ran_on is not None:
        head += f" on {_cell(r.ran_on)}"
    if r.open:
        return f"{head}: still {r.state} at the timeout (attempt {r.attempt}); it goes on"
    if r.state == admin.RequestState.REFUSED:
        return f"{head}: refused ({r.outcome}): a round held the lease, or the job was paused"
    if r.state == admin.RequestState.EXPIRED:
        return f"{head}: expired: no replica took it within {admin.REQUEST_TTL:g} s"
    took = ""
    if r.started is not None and r.ended is not None:
        took = f" in {(r.ended - r.started).total_seconds():.1f} s"
    error = f": {_cell(r.error)}" if r.error else ""
    return f"{head}: {r.outcome}{took} (attempt {r.attempt}){error}"


def _changing(
    args: argparse.Namespace,
    change: _Change,
    say: _Say,
    out: TextIO | None,
    err: TextIO | None,
) -> int:
    """Pause or resume what ``args`` names: one job or, with ``--all``, every job on
    record; ``say`` what changed on ``out`` (default: stdout). An error is one line on
    ``err`` (default: stderr) and the exit status says which; a name and ``--all`` both,
    or neither, is bad input."""
    out, err = out or sys.stdout, err or sys.stderr
    one, every, options = change

    def act() -> int:
        if (args.name is None) == (not args.all):
            raise ValueError("name one job, or give --all (not both)")
        database = _database(args)
        changes = every(database, **options) if args.all else (one(database, args.name, **options),)
        say(args, changes, out)
        return 0

    return _guarded(act, err)


def _jobs(changes: _Changes, by: str = "") -> str:
    """``2 jobs[ by WHO]: one, two``: those of ``changes`` that changed something."""
    changed = [c for c in changes if c.changed]
    if not changed:
        return "no job (none on record in that state)"
    names = ", ".join(_cell(c.job) for c in changed)
    return f"{len(changed)} job{'s' if len(changed) != 1 else ''}{by}: {names}"


def _by(changes: _Changes) -> str:
    """`` by WHO``: who paused the first of ``changes`` that changed something."""
    changed = [c for c in changes if c.changed]
    return "" if not changed else f" by {_cell(changed[0].paused_by or '?')}"


def _since(change: admin.PauseChange) -> str:
    return f" (by {_cell(change.paused_by or '?')} since {_time(change.paused_since)} UTC)"
