"""RQ: hand each instant of a job to an RQ queue, and run a worker's task once per
occurrence (``pip install 'cronjob-lease[rq]'``).

```python
from redis import Redis
from rq import Queue
import cronjob
from cronjob.contrib.rq import enqueue

queue = Queue("reports", connection=Redis())
cronjob.register(enqueue(queue, "app.tasks.export", kwargs={"full": True}),
                 "0 0 3 * * *", "nightly-export")
```

Each instant's job has the occurrence id as its RQ ``job_id``, and in its ``meta``
(under `META_KEY`) the job's name, the instant (RFC 3339 UTC with ``Z``) and the round's W3C trace
context (`trace_context` reads it back on the worker). On the worker, `once` makes a task
run once per occurrence id.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from opentelemetry import propagate
from opentelemetry.context import Context
from rq import Queue, get_current_job
from rq.job import Job

from .._exceptions import RegistrationError
from ._handoff import Handoff, Occurrence
from ._instant import format_instant
from ._once import STALE_AFTER, run_claimed, run_once
from ._validation import claim_of

__all__ = ["JOB_OPTIONS", "META_KEY", "RQPublisher", "enqueue", "once", "trace_context"]

#: The key of ``job.meta`` that holds what cronjob put there: ``name``, ``instant``
#: (RFC 3339 UTC with ``Z``), ``occurrence_id``, ``app``, ``headers`` (the W3C trace context)
#: and ``trigger`` (the round's, unless it was scheduled: ``manual``, ``backfill``).
META_KEY: Final = "cronjob"
#: The options of ``Queue.enqueue_call`` that `enqueue` passes on (``job_id`` and
#: ``meta`` are cronjob's).
JOB_OPTIONS: Final = frozenset(
    {"timeout", "result_ttl", "ttl", "failure_ttl", "description", "at_front", "retry"}
)

F = TypeVar("F", bound=Callable[..., Any])


def _func_name(func: str | Callable[..., Any]) -> str:
    if isinstance(func, str):
        return func
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


class RQPublisher:
    """Puts one RQ job per occurrence on ``queue`` (see `enqueue`)."""

    target = "rq"

    def __init__(
        self,
        queue: Queue,
        func: str | Callable[..., Any],
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(queue, Queue):
            raise RegistrationError(f"rq: queue must be an rq.Queue, got {queue!r}")
        if not (isinstance(func, str) and func.strip()) and not callable(func):
            raise RegistrationError(
                f"rq: func must be a callable or a dotted path to one, got {func!r}"
            )
        unknown = sorted(set(options or {}) - JOB_OPTIONS)
        if unknown:
            raise RegistrationError(
                f"rq: option(s) {', '.join(unknown)} not passed on (job_id and meta are "
                f"cronjob's); allowed: {', '.join(sorted(JOB_OPTIONS))}"
            )
        self.queue = queue
        self.func = func
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.options = dict(options or {})

    def describe(self) -> dict[str, Any]:
        """The queue's name and the task's path (no connection details)."""
        return {"queue": self.queue.name, "func": _func_name(self.func)}

    def publish(self, occurrence: Occurrence) -> None:
        """Enqueue the occurrence's job, ``job_id`` its id; returns once Redis answered.

        Enqueuing an id again (a retry) writes the job anew and queues it again: a
        second delivery, with the same id (`once` runs its body once)."""
        meta = {
            META_KEY: {
                "name": occurrence.name,
                "instant": format_instant(occurrence.instant),
                "occurrence_id": occurrence.id,
                "app": occurrence.app,
                "headers": dict(occurrence.headers),
            }
        }
        if occurrence.trigger != "schedule":
            meta[META_KEY]["trigger"] = occurrence.trigger
        self.queue.enqueue_call(  # type: ignore[type-var]
            self.func,
            args=self.args,
            kwargs=self.kwargs,
            job_id=occurrence.id,
            meta=meta,
            **self.options,
        )


def enqueue(
    queue: Queue,
    func: str | Callable[..., Any],
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    retry_within: float | None = None,
    hold: float | None = None,
    send_timeout: float | None = None,
    **options: Any,
) -> Handoff:
    """A job function that enqueues ``func`` on ``queue`` once per instant.

    Args:
        queue: The RQ queue (its Redis connection is used to publish).
        func: The task: a dotted path (the replica need not import it) or a callable.
        args: Passed to the task, positionally.
        kwargs: Passed to the task, by keyword.
        retry_within: Seconds the round retries a refused enqueue before it leaves it to
            the sweep; ``None``: derived from the period (see
            [handoff][cronjob.contrib.handoff]).
        hold: Seconds an attempt keeps its row from the other retriers; ``None``:
            derived (see [handoff][cronjob.contrib.handoff]).
        send_timeout: Seconds an enqueue waits for Redis's answer, below ``hold``;
            ``None``: derived (see [handoff][cronjob.contrib.handoff]).
        options: Passed to ``Queue.enqueue_call`` (`JOB_OPTIONS`).

    Raises:
        RegistrationError: ``queue`` is not an ``rq.Queue``, ``func`` neither a
            callable nor a dotted path, an option is not one of `JOB_OPTIONS`, or
            ``retry_within``, ``hold`` or ``send_timeout`` is out of range.
    """
    publisher = RQPublisher(queue, func, args=args, kwargs=kwargs, options=options)
    return Handoff(publisher, retry_within=retry_within, hold=hold, send_timeout=send_timeout)


def trace_context(job: Job | None = None) -> Context:
    """The round's trace context carried by ``job`` (by default the current one), for
    ``tracer.start_as_current_span(..., context=trace_context())`` on the worker; an
    empty context for a job cronjob did not enqueue."""
    job = job or get_current_job()
    carried = (job.meta.get(META_KEY) or {}) if job is not None else {}
    return propagate.extract(dict(carried.get("headers") or {}))


def once(
    func: F | None = None,
    *,
    database: Any = None,
    stale_after: float = STALE_AFTER,
) -> Any:
    """Make an RQ task run its body once per job id (the occurrence id).

    ``@once`` or ``@once(database=..., stale_after=...)`` on the worker's function. See
    [run_once][cronjob.contrib.run_once] for what happens on a second delivery, a body
    that raises and a worker killed in the body.

    A job cronjob enqueued (``meta["cronjob"]`` with its ``name`` and ``instant``) is
    checked first (``cronjob.contrib._once.run_claimed``): an id that is not the one of
    its app, name and instant, or an instant that is no firing of the schedule's current
    spec (unless its ``trigger`` is ``manual``), raises
    `cronjob.contrib.InvalidOccurrence` and runs nothing; an occurrence never started
    whose schedule nothing names any more returns ``None`` without running (obsolete).

    Args:
        database: The lease database (URL or `Engine`); ``None``: ``$CRONJOB_DATABASE_URL``.
        stale_after: Seconds after which a body still marked running may run again.

    Raises:
        RuntimeError: (when called) outside an RQ job.
    """

    def wrap(fn: F) -> F:
        if not callable(fn):
            raise RegistrationError(f"rq.once: expected a function, got {fn!r}")
        task = _func_name(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            job = get_current_job()
            if job is None:
                raise RuntimeError(f"task {task!r}: once runs inside an RQ job only")
            carried = job.meta.get(META_KEY) or {}
            claim = claim_of(
                app=carried.get("app"),
                schedule=carried.get("name"),
                instant=carried.get("instant"),
                occurrence_id=job.id,
                trigger=carried.get("trigger"),
            )
            if claim is not None:
                return run_claimed(
                    claim,
                    task,
                    lambda: fn(*args, **kwargs),
                    database=database,
                    stale_after=stale_after,
                )
            return run_once(
                job.id,
                task,
                lambda: fn(*args, **kwargs),
                database=database,
                stale_after=stale_after,
            )

        return wrapper  # type: ignore[return-value]

    return wrap(func) if func is not None else wrap
