"""``cronjob run``: import the job modules, run the scheduler until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import traceback

import lease

from .._exceptions import CronjobError
from .._logging import LOGGERS, stderr_handler
from ..engine import Scheduler, resolve_database

__all__ = ["run_command"]

log = logging.getLogger("cronjob")

#: Exit statuses: bad input (a module, a URL, a database that cannot carry leases).
EXIT_USAGE = 2


def _configure_logging() -> None:
    """Show the log on stderr at ``$CRONJOB_LOG_LEVEL`` (INFO), unless it is configured.

    A root logger with a handler was configured by the framework the command runs in
    (Django's ``LOGGING``, for ``manage.py cronjob run``): a second root handler would
    print every line twice, so none is added; only cronjob's loggers whose level it left
    unset get the level, and its handlers print their lines, in its format.
    """
    level = os.environ.get("CRONJOB_LOG_LEVEL", "INFO").upper()
    root = logging.getLogger()
    if root.handlers:
        for name in LOGGERS:
            logger = logging.getLogger(name)
            if logger.level == logging.NOTSET:
                logger.setLevel(level)
        return
    root.addHandler(stderr_handler())
    root.setLevel(level)


def _fail(message: str) -> int:
    print(f"cronjob: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _fail_with_traceback(message: str) -> int:
    """Fail with ``message``, then the traceback of the exception being handled.

    The one clear line comes first: it is what a reader (or ``head``) sees, and the
    traceback below it is the detail.
    """
    status = _fail(message)
    traceback.print_exc()
    return status


def freeze_start_up() -> None:
    """Leave what start-up built out of the cyclic garbage collector's full collections.

    The process is ``cronjob run``'s own: the modules, the registry, the jobs' states and
    schedules, the engine live until it exits. Each full collection would traverse them
    all again: at 10,000 jobs that is ~150,000 objects, ~50-100 ms with the interpreter
    held, and the rounds of an instant at that scale set one off about every instant
    (decisions.md, "Garbage collection at scale"). An application that runs a scheduler
    in a process of its own can do the same after its start-up.

    Only the freeze, which runs no code of anyone's: the collection that clears start-up's
    garbage first (`gc.collect`, which runs finalizers) is made before the
    scheduler's threads start, with nothing else running.
    """
    gc.freeze()


#: The signals that stop ``cronjob run``: the first drains, a second exits at once.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def run_command(args: argparse.Namespace) -> int:
    """Run ``cronjob run [--database-url URL] MODULE...``; return the exit status.

    The stop signals are blocked first, in this thread and so in every thread started
    from it (the scheduler's, and any a job module starts as it is imported), and taken
    by this thread with `signal.sigwait` once the scheduler runs. No handler runs
    inside whatever code a signal happens to interrupt (a handler that needs a lock the
    interrupted code holds never returns), and no signal is delivered to a thread other
    than the one waiting for it (which would then never wake). Restored on return.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return _run(args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _run(args: argparse.Namespace) -> int:
    _configure_logging()
    sys.path.insert(0, os.getcwd())
    for module in args.modules:
        try:
            importlib.import_module(module)
        except CronjobError as exc:  # a job refused at registration: our message says it all
            return _fail(f"module {module!r}: {exc}")
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module == exc.name or module.startswith(f"{exc.name}.")):
                return _fail(f"no module named {module!r} (searched the working directory first)")
            # The module exists but imports something missing.
            return _fail_with_traceback(f"cannot import job module {module!r}: {exc}")
        except Exception as exc:
            return _fail_with_traceback(
                f"cannot import job module {module!r}: {type(exc).__name__}: {exc}"
            )

    database = resolve_database(args.database_url)
    try:
        scheduler = Scheduler(database, max_workers=args.max_workers)
        gc.collect()  # start-up's garbage, while this is the only thread (see below)
        scheduler.start()
        freeze_start_up()
    except (lease.UnsupportedDatabase, lease.MigrationRequired, lease.MigrationFailed) as exc:
        return _fail(str(exc))
    except lease.LeaseError as exc:
        return _fail(f"database {lease.redact(str(database))}: {exc}")
    except Exception as exc:
        url = lease.redact(str(database)) if isinstance(database, str) else "engine"
        return _fail(f"cannot start on database {url}: {type(exc).__name__}: {exc}")
    try:
        # A signal that came during start-up waited (blocked): it is taken here at once.
        signum = signal.sigwait(STOP_SIGNALS)
        log.info("%s received: draining", signal.Signals(signum).name)
        _exit_on_a_second_signal()
    finally:
        scheduler.stop()
    if scheduler._lingering:
        # Rounds that ignored the drain still run, their leases kept: ending the process
        # ends them, and the leases then expire as a killed process's do. End it now
        # rather than let the interpreter's shutdown wait behind their busy threads.
        logging.shutdown()
        os._exit(0)
    return 0


def _exit_on_a_second_signal() -> None:
    """A second stop signal during the drain ends the process at once (128 + signal)."""

    def wait() -> None:
        signum = signal.sigwait(STOP_SIGNALS)
        log.warning("second %s: exiting without waiting", signal.Signals(signum).name)
        os._exit(128 + signum)

    threading.Thread(target=wait, name="cronjob-second-signal", daemon=True).start()
