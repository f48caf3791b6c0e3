"""Rounds in a child process: the parent side of ``isolation="process"``.

Python cannot kill a thread; it can kill a process. A round of a job registered with
``isolation="process"`` runs in a child process (`cronjob.engine._child`), started
with forkserver where the platform has it, else spawn, never fork (a replica has threads,
and a forked copy of their locks can deadlock). The round's worker thread starts the child
and waits for it on the scheduler's clock (so a fake clock's time moves meanwhile), and:

- hands the round's cancellation to the child (drain, lease loss, timeout: the child's
  ``ctx.wait`` and ``ctx.check`` see it);
- on a timeout or a lost lease, also ends the child: SIGTERM at once, then SIGKILL
  `KILL_GRACE` seconds later if it still runs. The replica lives on; the thread's rule
  (a round still running 5 s after its lost lease or its timeout ends the whole process,
  `cronjob.engine._keeper`) kills the child instead of the process;
- ends the round as a thread's would: a return succeeds, what the job raised comes back
  (pickled, or as text if it cannot be) and is classified as in a thread; a child that
  dies on its own is a failure naming its exit status; a child ended after the round was
  cancelled ends as its cancellation (cut short, timed out).

The child's log records are handled by the parent's loggers, inside the round's unit of
work (its trace id); its spans are children of the round's root span.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import multiprocessing
import multiprocessing.util
import pickle
import signal
import threading
import weakref
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Final, cast

import execctx

from .._clock import Clock
from .._exceptions import LeaseLost, TimedOut
from ._child import ChildSpec, child_main
from ._childdb import ChildDatabases
from ._state import Run

if TYPE_CHECKING:
    from sqlalchemy import Engine

__all__ = ["KILL_GRACE", "START_METHOD", "ChildRounds"]

log = logging.getLogger("cronjob")

#: Seconds between the SIGTERM that ends a timed-out (or lease-lost) round's child and
#: the SIGKILL, if it still runs: well within the 5 s after which a thread's round would
#: end the process, so the child is always gone first.
KILL_GRACE: Final = 2.0

#: How a child starts: forkserver (a fork of a clean server process, cronjob preloaded)
#: where the platform has it, else spawn. Never fork.
START_METHOD: Final = (
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
)


#: The children running rounds now, killed as the process exits (see `_kill_children`).
_CHILDREN: weakref.WeakSet[BaseProcess] = weakref.WeakSet()


def _kill_children() -> None:
    """At exit, SIGKILL the children still running rounds, as the process's own threads
    would end with it. Registered after multiprocessing's exit handler, so it runs
    first: that one SIGTERMs daemonic children and then joins them, and a child that
    ignores SIGTERM would hold the exit forever."""
    for process in list(_CHILDREN):
        with contextlib.suppress(Exception):
            process.kill()


atexit.register(_kill_children)


def _context() -> multiprocessing.context.DefaultContext:
    context = cast(
        "multiprocessing.context.DefaultContext", multiprocessing.get_context(START_METHOD)
    )
    if START_METHOD == "forkserver":
        # Imported once in the server, not in every child: the child's start-up cost.
        context.set_forkserver_preload(["cronjob.engine._child"])
    return context


class ChildRounds:
    """Runs rounds in child processes (one `run` per round, on its worker thread).

    Args:
        clock: The scheduler's clock: the child is waited for on it, and the SIGKILL's
            grace runs on it.
        engine: The scheduler's engine: the child connects as it does
            (`cronjob.engine._childdb`).
    """

    def __init__(self, *, clock: Clock, engine: Engine) -> None:
        self._clock = clock
        self._databases = ChildDatabases(engine)
        self._mp = _context()

    def run(self, run: Run) -> None:
        """Run ``run``'s job in a child process; return or raise as the job did there.

        Called on the round's worker thread, inside its unit of work.

        Raises:
            BaseException: what the job raised (or a `RuntimeError` carrying its type,
                message and traceback as text when it cannot be pickled); the round's
                cancellation when the child was ended after it; `ChildProcessError`
                when the child died on its own (its exit status in the message).
        """
        ctx, job, clock = run.ctx, run.pinned.job, self._clock
        unit = execctx.current()
        lease_clock = clock.lease_clock()
        spec = ChildSpec(
            fn=job.fn,
            is_async=job.is_async,
            name=ctx.name,
            instant=ctx.instant,
            attempt=ctx.attempt,
            replica=ctx.replica,
            trace_id=ctx.trace_id,
            span_id=None if unit is None else unit.span_id,
            trigger=ctx.trigger.value,
            why=ctx.why.value,
            requested_by=ctx.requested_by,
            task=None if ctx._data is None else ctx._data[0],
            args=None if ctx._data is None else ctx._data[1],
            database=self._databases.get(),
            token=run.token,
            lease_now=None if lease_clock is None else lease_clock(),
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        ours, theirs = self._mp.Pipe(duplex=True)
        process = self._mp.Process(
            target=child_main, args=(spec, theirs), name=f"cronjob-round {ctx.name}", daemon=True
        )
        process.start()
        theirs.close()
        run.child = process
        _CHILDREN.add(process)
        try:
            end = self._wait(run, process, ours)
        finally:
            _CHILDREN.discard(process)
            run.child = None
            ours.close()
        _raise_end(run, process, end)

    def _wait(self, run: Run, process: BaseProcess, pipe: Pipe) -> tuple[object, ...] | None:
        """Wait for the child's end, passing the round's cancellation on and ending the
        child on a timeout or a lost lease. Returns its end message (``None``: died)."""
        ctx, clock = run.ctx, self._clock
        waker = ctx._waker()  # set by the round's cancellation, and by the reader below
        finished = threading.Event()
        end: list[tuple[object, ...]] = []

        def read() -> None:
            try:
                while True:
                    message = pipe.recv()
                    if message[0] == "log":
                        record: logging.LogRecord = message[1]
                        logging.getLogger(record.name).handle(record)
                    else:
                        end.append(message)
            except (EOFError, OSError):
                pass
            finally:
                process.join()
                finished.set()
                ctx._wake()

        # In a copy of the round's context: the child's records carry its trace id.
        context = contextvars.copy_context()
        threading.Thread(
            target=context.run, args=(read,), name=f"cronjob-child {ctx.name}", daemon=True
        ).start()
        told = killed = False
        terminated_at: float | None = None
        while True:
            waker.clear()
            if finished.is_set():
                return end[0] if end else None
            cause = ctx.cause
            if cause is not None and not told:
                told = True
                with contextlib.suppress(OSError, ValueError):  # the child is gone already
                    pipe.send(("cancel", type(cause).__name__, str(cause)))
            if isinstance(cause, TimedOut | LeaseLost) and terminated_at is None:
                terminated_at = clock.monotonic()
                log.warning(
                    "job %r instant %s: ending the round's child process %s (SIGTERM): %s",
                    ctx.name,
                    ctx.instant.isoformat(),
                    process.pid,
                    cause,
                )
                process.terminate()
            timeout: float | None = None
            if terminated_at is not None and not killed:
                left = terminated_at + KILL_GRACE - clock.monotonic()
                if left <= 0:
                    killed = True
                    log.warning(
                        "job %r instant %s: the round's child process %s still runs %g s "
                        "after SIGTERM: SIGKILL",
                        ctx.name,
                        ctx.instant.isoformat(),
                        process.pid,
                        KILL_GRACE,
                    )
                    process.kill()
                else:
                    timeout = left
            waker.wait(timeout)


def _raise_end(run: Run, process: BaseProcess, end: tuple[object, ...] | None) -> None:
    """Return or raise as the job did in the child (see `ChildRounds.run`)."""
    ctx = run.ctx
    if end is not None and end[0] == "ok":
        return
    if end is not None:
        blob, kind, message, text = end[1:]
        error: BaseException | None = None
        if isinstance(blob, bytes):
            try:
                error = pickle.loads(blob)
            except Exception:
                error = None
        if not isinstance(error, BaseException):
            error = RuntimeError(
                f"job {ctx.name!r} raised {kind}: {message} (in its child process; the "
                "exception could not be pickled, so it comes back as text)"
            )
        error.add_note(f"raised in the round's child process {process.pid}:\n{text}")
        raise error
    code = process.exitcode
    status = _status(code)
    cause = ctx.cause
    if cause is not None:
        # Ended after the round was cancelled (by us, or by its own choice): the round
        # ends as its cancellation, as a thread's that raised ctx.check() would.
        error = type(cause)(*cause.args)
        error.add_note(f"the round's child process {process.pid} ended with {status}")
        raise error
    raise ChildProcessError(
        f"job {ctx.name!r}: the round's child process {process.pid} died with {status} "
        "before the round ended"
    )


def _status(code: int | None) -> str:
    """``exit status 3`` or ``signal SIGKILL`` of an exit code (negative: a signal)."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"
