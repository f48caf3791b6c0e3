"""The child process side of a round of a job with ``isolation="process"``.

`child_main` runs in a fresh process (forkserver or spawn) started by
`cronjob.engine._isolated`, with a `ChildSpec` and one end of a pipe. It builds the round's
[Round][cronjob.Round] anew (name, instant, attempt, replica, trace id, task, args), runs
the job under the round's unit of work (its trace id, so the child's log lines and spans
belong to the round), and sends back, on the pipe:

- ``("log", record)``: each log record made in the child, for the parent's handlers;
- ``("ok",)`` or ``("error", pickled or None, type name, message, traceback text)``.

From the parent it reads ``("cancel", type name, message)``: the round's cancellation,
which the child's ``ctx.wait``/``ctx.check`` then see. The fenced ``ctx.transaction()``
runs on the child's own connection (an engine that connects as the scheduler's does: its
URL, its driver's arguments, its isolation level, see `cronjob.engine._childdb`), and checks
inside itself that the round's fencing token still holds the lease, when it opens and
again before it commits, as the parent's does (`cronjob.engine._fencing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import pickle
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import execctx
import lease

from .. import _exceptions
from .._clock import SystemClock
from .._exceptions import Cancelled, LeaseLost, TimedOut
from .._records import Why
from .._round import Round, Trigger, lease_lost
from ._childdb import ChildDatabase

if TYPE_CHECKING:
    from multiprocessing.connection import Connection as Pipe

    from sqlalchemy import Connection, Engine

__all__ = ["EXIT_PARENT_GONE", "ChildSpec", "child_main"]

#: The exit status of a child whose parent (the replica) went away while it ran.
EXIT_PARENT_GONE = 71
#: Real seconds a child whose parent went away gives its job to stop before it exits.
PARENT_GONE_GRACE = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildSpec:
    """Everything the child needs to run one round (pickled to it).

    Attributes:
        fn: The job's function, pickled by reference (module and name).
        is_async: ``fn`` returns a coroutine: the child runs it with `asyncio.run`.
        name, instant, attempt, replica, trace_id, trigger, why, requested_by, task, args:
            The round's identity, as on the parent's [Round][cronjob.Round]
            (``args`` as the JSON text; ``task`` ``None`` for a registered job).
        span_id: The round's root span id in the parent, or ``None`` (no SDK there):
            the child's unit is its child, in the same trace.
        database: How the scheduler's engine connects, for the child's engine.
        token: The round's fencing token; ``None`` for a per-instance round.
        lease_now: The lease clock's time at the round's start when the parent runs on a
            fake clock (the child cannot follow it); ``None``: the database's clock.
        log_level: The parent's root log level: records below it are not sent.
    """

    fn: Callable[..., Any]
    is_async: bool
    name: str
    instant: datetime
    attempt: int
    replica: str
    trace_id: str
    span_id: str | None
    trigger: str
    why: str
    requested_by: str | None
    task: str | None
    args: str | None
    database: ChildDatabase
    token: int | None
    lease_now: datetime | None
    log_level: int


class _PipeHandler(logging.Handler):
    """Sends each record to the parent, made picklable (message formatted, traceback as
    text), as `logging.handlers.QueueHandler` prepares them."""

    def __init__(self, send: Callable[[object], None]) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.msg = record.getMessage()
            record.args = None
            if record.exc_info:
                record.exc_text = "".join(traceback.format_exception(*record.exc_info))
                record.exc_info = None
            self._send(("log", record))
        except Exception:  # a record that cannot travel is lost, never the round
            self.handleError(record)


def child_main(spec: ChildSpec, conn: Pipe) -> None:
    """Run the round ``spec`` describes and send its end on ``conn``; then exit at once
    (threads the job left behind do not hold the child up)."""
    lock = threading.Lock()

    def send(message: object) -> None:
        with lock:
            conn.send(message)

    root = logging.getLogger()
    root.handlers[:] = [_PipeHandler(send)]
    root.setLevel(spec.log_level)
    engine: list[Engine] = []  # made on the first transaction, with its lease store
    store: list[lease.LeaseStore] = []
    ctx = Round(
        name=spec.name,
        instant=spec.instant,
        attempt=spec.attempt,
        replica=spec.replica,
        trace_id=spec.trace_id,
        clock=SystemClock(),
        transaction=lambda ctx: _fenced(spec, ctx, engine, store),
        trigger=Trigger(spec.trigger),
        why=Why(spec.why),
        requested_by=spec.requested_by,
        task=spec.task,
        args=spec.args,
    )
    threading.Thread(
        target=_listen, args=(conn, ctx), name="cronjob-child-cancel", daemon=True
    ).start()
    try:
        _run(spec, ctx)
    except BaseException as exc:  # the child's top: every outcome goes back
        send(("error", *_describe(exc)))
    else:
        send(("ok",))
    finally:
        for made in engine:
            with contextlib.suppress(Exception):
                made.dispose()
        logging.shutdown()
        conn.close()
        os._exit(0)


def _run(spec: ChildSpec, ctx: Round) -> None:
    """Run the job as the round's unit of work, a child of the parent's root span."""
    span_id = spec.span_id or f"{int.from_bytes(os.urandom(8)) | 1:016x}"
    parent = trace.set_span_in_context(
        NonRecordingSpan(
            SpanContext(
                trace_id=int(spec.trace_id, 16),
                span_id=int(span_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED if spec.span_id else 0),
            )
        )
    )
    attributes: dict[str, str | int | bool] = {
        "cronjob.job": spec.name,
        "cronjob.instant": spec.instant.isoformat(),
        "cronjob.attempt": spec.attempt,
        "cronjob.replica": spec.replica,
        "cronjob.isolation": "process",
    }
    with execctx.work(
        "round", spec.name, attributes=attributes, span_name=f"cronjob {spec.name}", parent=parent
    ):
        ctx.check()  # cancelled before it could start
        if spec.is_async:
            asyncio.run(spec.fn(ctx))
        else:
            result = spec.fn(ctx)
            if inspect.iscoroutine(result):
                asyncio.run(result)


def _listen(conn: Pipe, ctx: Round) -> None:
    """Deliver the parent's cancellation to the round; a parent gone (the pipe closed
    without the round's end) cancels it too, and ends the child after a grace."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            ctx._cancel(LeaseLost(f"job {ctx.name!r}: the replica running the round is gone"))
            threading.Event().wait(PARENT_GONE_GRACE)  # real time: a real process's end
            os._exit(EXIT_PARENT_GONE)
        if message[0] == "cancel":
            kind = getattr(_exceptions, message[1], None)
            if not (isinstance(kind, type) and issubclass(kind, Cancelled)):
                kind = Cancelled
            ctx._cancel(kind(message[2]))


@contextlib.contextmanager
def _fenced(
    spec: ChildSpec, ctx: Round, engines: list[Engine], stores: list[lease.LeaseStore]
) -> Iterator[Connection]:
    """The child's ``ctx.transaction()``: on its own engine, fenced by the round's token.

    Raises:
        TimedOut: the round ran past its timeout (at the start or before it commits).
        LeaseLost: the lease is gone when it opens or before it commits.
    """
    _refuse_timed_out(ctx)
    if not engines:
        made = spec.database.engine()
        execctx.instrument(made)
        engines.append(made)
    engine = engines[0]
    if spec.token is None:  # a per-instance round: a plain transaction
        with engine.begin() as conn:
            yield conn
        return
    if not stores:
        now = spec.lease_now
        stores.append(lease.LeaseStore(engine, clock=None if now is None else (lambda: now)))
    store = stores[0]
    with engine.begin() as conn:
        if not store.holds(conn, ctx.name, spec.token):
            raise lease_lost(ctx.name, "the round no longer holds it")
        yield conn
        _refuse_timed_out(ctx)
        if not store.holds(conn, ctx.name, spec.token, final=True):
            raise lease_lost(ctx.name, "taken before the transaction committed")


def _refuse_timed_out(ctx: Round) -> None:
    cause = ctx.cause
    if isinstance(cause, TimedOut):
        raise TimedOut(*cause.args)


def _describe(exc: BaseException) -> tuple[bytes | None, str, str, str]:
    """What the parent needs of the job's exception: itself pickled (``None`` if it
    cannot be), its type's name, its message and its traceback as text."""
    blob: bytes | None
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # an exception whose class cannot rebuild it fails here
    except Exception:
        blob = None
    kind = type(exc)
    name = f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(exc))
    return blob, name, str(exc), text
