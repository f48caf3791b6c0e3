"""``cronjob beat -A MODULE[:APP]``: a Celery app's ``beat_schedule``, run as jobs.

Loads the app as ``celery -A`` does (``proj``, ``proj.celery``, ``proj.celery:app``),
registers each entry of its ``beat_schedule`` (see `cronjob.contrib.celery._beat`) as a
job of the default registry whose function is `send`, then runs exactly as ``cronjob
run`` does (same options, logging, drain on SIGTERM). A schedule it cannot honour
stops it before it starts: one line on stderr naming the entry, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from celery.app.utils import find_app

from ..._exceptions import CronjobError
from ..._registry import Registry, default_registry
from ...admin._run import EXIT_USAGE, run_command
from ._beat import BeatEntry, BeatScheduleError, app_zone, beat_entries
from ._publisher import CeleryPublisher, OptionError
from ._send import send

__all__ = ["read_beat_schedule", "register_beat_schedule", "run_beat"]


def read_beat_schedule(
    app: Any,
    *,
    retry_within: float | None = None,
    hold: float | None = None,
    send_timeout: float | None = None,
) -> list[BeatEntry]:
    """Read and check every entry of ``app.conf.beat_schedule``, options and knobs
    included (the knobs given here apply to each entry that sets none of its own).

    Raises:
        BeatScheduleError: The first entry that cannot run, named.
    """
    entries = beat_entries(
        app.conf.beat_schedule or {},
        app_zone(app),
        retry_within=retry_within,
        hold=hold,
        send_timeout=send_timeout,
    )
    for entry in entries:
        try:
            CeleryPublisher(
                app, entry.task, args=entry.args, kwargs=entry.kwargs, options=entry.options
            )
        except (OptionError, TypeError) as exc:
            raise BeatScheduleError(f"beat entry {entry.name!r}: {exc}") from None
    return entries


def register_beat_schedule(
    app: Any,
    registry: Registry | None = None,
    *,
    retry_within: float | None = None,
    hold: float | None = None,
    send_timeout: float | None = None,
) -> list[str]:
    """Register each entry of ``app.conf.beat_schedule`` as a job; return their names.

    Each job is `send` of the entry's task, args, kwargs, options and knobs, on the
    entry's schedule read as `cronjob.contrib.celery._beat` says, named by the entry's
    key. Every entry is read and checked before any is registered, so a bad entry
    leaves the registry as it was.

    Args:
        app: The Celery application.
        registry: Where to register; ``None`` for the default registry (``cronjob run``'s).
        retry_within: The hand-off's knob (see `send`) for every entry whose
            ``options`` set no ``cronjob_retry_within``; ``None``: derived.
        hold: As ``retry_within``, for ``cronjob_hold``.
        send_timeout: As ``retry_within``, for ``cronjob_send_timeout``.

    Raises:
        BeatScheduleError: An entry that cannot run (named), an option of an entry's
            ``options`` that the Celery target does not know, or a bad knob (not a
            number of seconds, or a send timeout not below the hold).
        RegistrationError: A name the registry refuses (taken, too long).
    """
    registry = default_registry if registry is None else registry
    entries = read_beat_schedule(
        app, retry_within=retry_within, hold=hold, send_timeout=send_timeout
    )
    jobs = [
        (
            send(
                app,
                entry.task,
                args=entry.args,
                kwargs=entry.kwargs,
                retry_within=entry.retry_within,
                hold=entry.hold,
                send_timeout=entry.send_timeout,
                **entry.options,
            ),
            entry,
        )
        for entry in entries
    ]
    for job, entry in jobs:
        registry.register(job, entry.spec, entry.name)
    return [entry.name for entry in entries]


def load_app(name: str) -> Any:
    """Load a Celery app as ``celery -A`` does (``proj``, ``proj.celery``, ``proj:app``).

    Raises:
        ImportError: The module cannot be imported (the module's own error).
        AttributeError: ``MODULE:APP`` names a module that has no attribute ``APP``. (Celery's
            own loader says "No module named 'MODULE:APP'" then, blaming the module.)
    """
    module_name, colon, attribute = name.partition(":")
    if not colon:
        return find_app(name)
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no attribute {attribute!r}") from None


def run_beat(args: argparse.Namespace) -> int:
    """Run ``cronjob beat``: load the app, register its schedule, then ``cronjob run``;
    with ``--list``, print each entry's job (name, spec, task) and exit."""
    sys.path.insert(0, os.getcwd())  # as `celery -A` and `cronjob run`: here first
    try:
        app = load_app(args.app)
    except Exception as exc:
        return _fail(f"cannot load the Celery app {args.app!r}: {type(exc).__name__}: {exc}")
    knobs = {
        "retry_within": args.retry_within,
        "hold": args.hold,
        "send_timeout": args.send_timeout,
    }
    try:
        if args.list:
            entries = read_beat_schedule(app, **knobs)
            for entry in entries:
                print(f"{entry.name}\t{entry.spec}\t{entry.task}")
            return 0
        names = register_beat_schedule(app, **knobs)
    except (BeatScheduleError, CronjobError) as exc:
        return _fail(str(exc))
    if not names:
        return _fail(f"the Celery app {args.app!r} has no beat_schedule entries")
    return run_command(args)


def _fail(message: str) -> int:
    print(f"cronjob: error: {message}", file=sys.stderr)
    return EXIT_USAGE
