"""Jobs for the fault suite, registered from ``$FAULTS_JOBS`` (a JSON list).

Each entry is ``{"name", "spec", "mode", "duration", "per_instance", "options"}``
(``options``: keyword options for ``register``, the job's policies); each round appends
JSON lines to ``$FAULTS_LOG``: ``start`` and ``end`` (with ``outcome``), and ``cancelled``
when a job that ignores its cancellation notices it. Every line carries the job, the
instant, the attempt, the trigger (``schedule`` or ``manual``), the replica, the pid, the
wall time ``t`` and ``mono``, the host's ``CLOCK_MONOTONIC`` (one time base for every
process, even one whose wall clock runs ahead under libfaketime with
``FAKETIME_DONT_FAKE_MONOTONIC=1``).

Modes:

- ``work``: waits ``duration`` seconds with ``ctx.wait``; on cancellation it stops and
  raises it (the round is cut short).
- ``async_work``: the same as an async job.
- ``stubborn``: sleeps ``duration`` seconds, ignoring its cancellation (logged once).
- ``forever``: ``stubborn`` that never returns.
- ``fail``: raises ``RuntimeError`` (a round that ran to its end, failed).
- ``system_exit`` / ``keyboard_interrupt``: raises that ``BaseException``;
  ``async_system_exit``: an async job raising ``SystemExit``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import cronjob

LOG = os.environ.get("FAULTS_LOG", "")


def emit(ev: str, ctx: cronjob.Round | None = None, **fields: Any) -> None:
    """Append one event to the log: one ``write`` on an ``O_APPEND`` file, so lines of
    concurrent processes never interleave."""
    record: dict[str, Any] = {"ev": ev}
    if ctx is not None:
        record.update(
            job=ctx.name,
            instant=ctx.instant.isoformat(),
            attempt=ctx.attempt,
            replica=ctx.replica,
            trace=ctx.trace_id,
            trigger=ctx.trigger.value,
        )
    record.update(fields, pid=os.getpid(), t=time.time(), mono=time.monotonic())
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _cause(ctx: cronjob.Round) -> str:
    return type(ctx.cause).__name__ if ctx.cause is not None else ""


def _ignore_cancellation(ctx: cronjob.Round, seconds: float) -> None:
    noticed = False
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled and not noticed:
            noticed = True
            emit("cancelled", ctx, cause=_cause(ctx))
        time.sleep(0.05)


def make_job(mode: str, duration: float) -> Any:
    if mode == "async_work":

        async def async_job(ctx: cronjob.Round) -> None:
            emit("start", ctx)
            if await ctx.wait_async(duration):
                emit("end", ctx, outcome="cut", cause=_cause(ctx))
                ctx.check()
            emit("end", ctx, outcome="done")

        return async_job

    if mode == "async_system_exit":

        async def async_exit(ctx: cronjob.Round) -> None:
            emit("start", ctx)
            emit("end", ctx, outcome="failed")
            raise SystemExit(4)

        return async_exit

    def job(ctx: cronjob.Round) -> None:
        emit("start", ctx)
        if mode == "work":
            if ctx.wait(duration):
                emit("end", ctx, outcome="cut", cause=_cause(ctx))
                ctx.check()
        elif mode == "stubborn":
            _ignore_cancellation(ctx, duration)
        elif mode == "forever":
            _ignore_cancellation(ctx, float("inf"))
        elif mode == "fail":
            emit("end", ctx, outcome="failed")
            raise RuntimeError(f"job {ctx.name} fails on purpose")
        elif mode == "system_exit":
            emit("end", ctx, outcome="failed")
            raise SystemExit(3)
        elif mode == "keyboard_interrupt":
            emit("end", ctx, outcome="failed")
            raise KeyboardInterrupt
        else:
            raise AssertionError(f"unknown mode {mode!r}")
        emit("end", ctx, outcome="done")

    return job


for _entry in json.loads(os.environ.get("FAULTS_JOBS", "[]")):
    _register = cronjob.register_per_instance if _entry.get("per_instance") else cronjob.register
    _register(
        make_job(_entry["mode"], float(_entry.get("duration", 0.0))),
        _entry["spec"],
        _entry["name"],
        **_entry.get("options", {}),
    )
