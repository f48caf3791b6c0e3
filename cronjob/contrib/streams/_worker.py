"""The consuming side: a worker that reads a stream in a consumer group, checks each
entry and runs its handler once per occurrence id.

Threads: `Worker.run` owns everything on the thread that calls it (the reads, the
checks, the handlers, one entry at a time); `Worker.stop` (SIGTERM, SIGINT, another
thread) only sets an event the loop reads between entries.

Each entry gets one disposition, checked in this order (see
`cronjob.contrib._validation`):

1. structure or id does not check out: copied to ``<stream>:dead`` with a ``reason``
   and acknowledged (invalid);
2. nothing names the schedule now and the occurrence was never admitted: acknowledged
   as terminal, neither run nor dead-lettered (obsolete);
3. its instant is no firing of the schedule's current spec: dead-lettered (invalid);
   skipped for a manual round (the entry's ``trigger`` is ``manual``), whose instant
   is the moment it was asked for;
4. no handler for it in this worker: left pending (unavailable), for another worker or
   a later XAUTOCLAIM;
5. admitted (its descriptor pinned at the first claim, adopted by later ones) and run
   through ``cronjob.contrib.run_once``: acknowledged once it ran or had run; a
   failure is left pending and retried after `CLAIM_IDLE` (XAUTOCLAIM) until the pinned
   retry budget is spent, then dead-lettered.
"""

from __future__ import annotations

import enum
import logging
import os
import secrets
import signal
import socket
import threading
from collections.abc import Mapping
from typing import Any, Final

import redis
from opentelemetry import propagate, trace
from opentelemetry.metrics import MeterProvider
from sqlalchemy import Engine

import lease

from ..._clock import Clock, SystemClock
from ..._registry import Registry, default_registry
from .._once import OccurrenceBusy, _engine, run_once
from .._validation import (
    Claim,
    InvalidOccurrence,
    check_claim,
    check_identity,
    check_structure,
)
from ._handlers import Handler, Handlers, Occurrence, default_handlers
from ._metrics import StreamMeters
from ._publish import connect

__all__ = ["BLOCK", "CLAIM_IDLE", "DEAD_SUFFIX", "Disposition", "Worker", "consumer_name"]

log = logging.getLogger("cronjob")
tracer = trace.get_tracer(__name__)

#: Seconds an entry stays pending with a consumer before XAUTOCLAIM takes it over (a
#: consumer that died, a failed run's retry, a handler not available then).
CLAIM_IDLE: Final = 60.0
#: Seconds one XREADGROUP waits for a new entry: how soon a stop is seen when idle.
BLOCK: Final = 1.0
#: The dead stream of ``stream`` is ``stream + DEAD_SUFFIX``.
DEAD_SUFFIX: Final = ":dead"


class Disposition(enum.StrEnum):
    """What became of an entry (`Worker.handle`)."""

    #: Its handler ran (or had run): acknowledged.
    DONE = "done"
    #: Its schedule is gone and it was never admitted: acknowledged as terminal.
    OBSOLETE = "obsolete"
    #: Its structure, id or instant did not check out: dead-lettered.
    INVALID = "invalid"
    #: No handler for it here: left pending.
    UNAVAILABLE = "unavailable"
    #: Its handler runs elsewhere, or the database could not be reached: left pending.
    BUSY = "busy"
    #: Its handler failed, with retries left: left pending.
    RETRY = "retry"
    #: Its handler failed past its retries: dead-lettered.
    DEAD = "dead"


def consumer_name() -> str:
    """A consumer name of this process: ``host-pid-random``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Worker:
    """Reads ``stream`` as a member of consumer group ``group`` and runs the handlers.

    Args:
        redis_client_or_url: A ``redis.Redis`` or a ``redis://`` URL.
        stream: The stream's key; dead letters go to ``stream + ":dead"``.
        group: The consumer group, created (with the stream) if missing, from the
            stream's first entry.
        database: The lease database (URL or `Engine`); ``None`` reads
            ``$CRONJOB_DATABASE_URL`` as ``cronjob run`` does. It must be at revision
            0015 or later (a replica migrates it).
        registry: The jobs the replicas register (a job of the schedule's name names
            it); ``None``: the default registry. The database's schedule rows and the
            replicas' records name schedules too.
        consumer: This process's consumer name; by default `consumer_name`.
        handlers: The handlers; ``None``: those `handler` registered.
        claim_idle: Seconds before a pending entry is taken over (`CLAIM_IDLE`).
        block: Seconds one read waits for an entry (`BLOCK`).
        clock: Where "now" comes from (the system clock by default).
        meter_provider: Where the counters go; ``None``: OpenTelemetry's global one.
    """

    def __init__(
        self,
        redis_client_or_url: redis.Redis | str,
        *,
        stream: str,
        group: str,
        database: str | Engine | None = None,
        registry: Registry | None = None,
        consumer: str | None = None,
        handlers: Handlers | None = None,
        claim_idle: float = CLAIM_IDLE,
        block: float = BLOCK,
        clock: Clock | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        for what, value in (("stream", stream), ("group", group)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"Worker: {what} must be a non-empty string, got {value!r}")
        if not isinstance(claim_idle, int | float) or not claim_idle > 0:
            raise ValueError(f"Worker: claim_idle must be seconds > 0, got {claim_idle!r}")
        self.redis = connect(redis_client_or_url)
        self.stream = stream
        self.dead_stream = stream + DEAD_SUFFIX
        self.group = group
        self.consumer = consumer or consumer_name()
        self.engine = _engine(database)
        self.registry = registry if registry is not None else default_registry
        self.handlers = handlers if handlers is not None else default_handlers
        self.claim_idle = float(claim_idle)
        self.block = float(block)
        self.clock: Clock = clock or SystemClock()
        self.meters = StreamMeters(stream, meter_provider)
        self._stop = threading.Event()
        self._next_claim = 0.0

    def __repr__(self) -> str:
        return f"<Worker {self.stream!r} {self.group!r} {self.consumer!r}>"

    def stop(self) -> None:
        """Ask `run` to return once the entry in hand is done (any thread, a signal)."""
        self._stop.set()

    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) unless it exists."""
        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def run(self) -> None:
        """Read and handle entries until `stop` (SIGTERM or SIGINT on the main thread):
        the entry in hand is finished, then it returns (a drain). Redis errors are
        logged and retried after a pause.
        """
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, frame: self.stop())
        log.info("stream worker %s: reading %r as group %r", self.consumer, self.stream, self.group)
        ready = False
        while not self._stop.is_set():
            try:
                if not ready:
                    self.ensure_group()
                    ready = True
                self.step()
            except (redis.RedisError, OSError) as exc:
                ready = False
                log.warning("stream worker %s: Redis failed (%s); retrying", self.consumer, exc)
                self._stop.wait(1.0)
        log.info("stream worker %s: drained", self.consumer)

    def step(self) -> int:
        """One pass: take over idle entries (at most every ``claim_idle / 2`` seconds),
        then read one new entry; returns how many entries were handled."""
        handled = 0
        now = self.clock.monotonic()
        if now >= self._next_claim:
            self._next_claim = now + self.claim_idle / 2
            handled += self._reclaim()
        if self._stop.is_set():
            return handled
        read: Any = self.redis.xreadgroup(
            self.group,
            self.consumer,
            {self.stream: ">"},
            count=1,
            block=max(1, round(self.block * 1000)),
        )
        for _stream, entries in read or []:
            for entry_id, fields in entries:
                self.handle(_text(entry_id), fields or {})
                handled += 1
        return handled

    def _reclaim(self) -> int:
        handled, start = 0, "0-0"
        while not self._stop.is_set():
            answer: Any = self.redis.xautoclaim(
                self.stream,
                self.group,
                self.consumer,
                min_idle_time=round(self.claim_idle * 1000),
                start_id=start,
                count=10,
            )
            start, entries = _text(answer[0]), answer[1]
            for entry_id, fields in entries:
                self.meters.add("reclaimed")
                log.info("stream worker %s: took over entry %s", self.consumer, _text(entry_id))
                if fields is None:  # trimmed away meanwhile
                    self.redis.xack(self.stream, self.group, entry_id)
                    continue
                self.handle(_text(entry_id), fields)
                handled += 1
                if self._stop.is_set():
                    break
            if start == "0-0":
                break
        return handled

    def handle(self, entry_id: str, fields: Mapping[Any, Any]) -> Disposition:
        """Check one entry and give it its disposition (see the module); returns it."""
        decoded = {_text(k): _text(v) for k, v in fields.items()}
        try:
            claim = check_structure(decoded)
            check_identity(claim.app, claim.schedule, claim.instant, claim.occurrence_id)
        except InvalidOccurrence as exc:
            return self._invalid(entry_id, decoded, exc.reason)
        try:
            return self._admitted(entry_id, decoded, claim)
        except lease.LeaseError as exc:
            log.warning(
                "occurrence %s: the lease database failed (%s); left pending",
                claim.occurrence_id,
                exc,
            )
            return Disposition.BUSY

    def _admitted(self, entry_id: str, fields: dict[str, str], claim: Claim) -> Disposition:
        engine = self.engine
        admission = lease.read_admission(engine, claim.occurrence_id)
        if admission is None:
            now = self.clock.now()
            try:
                definition = check_claim(engine, claim, registry=self.registry, now=now)
            except InvalidOccurrence as exc:
                return self._invalid(entry_id, fields, exc.reason)
            if definition is None:
                self.redis.xack(self.stream, self.group, entry_id)
                self.meters.add("obsolete")
                log.info(
                    "occurrence %s: no schedule %r any more; acknowledged as obsolete",
                    claim.occurrence_id,
                    claim.schedule,
                )
                return Disposition.OBSOLETE
            chosen = self.handlers.get(claim.schedule) or self.handlers.get(definition.task)
            if chosen is None:
                return self._unavailable(claim, definition.task)
            admission, won = lease.admit(
                engine,
                claim.occurrence_id,
                schedule=claim.schedule,
                handler=chosen.name,
                timeout_ms=round(chosen.timeout * 1000),
                retries=chosen.retries,
                now_ms=round(now.timestamp() * 1000),
            )
            if won:
                self.meters.add("admitted")
        pinned = self.handlers.get(admission.handler)
        if pinned is None:
            return self._unavailable(claim, admission.handler)
        return self._run(entry_id, fields, claim, admission, pinned)

    def _run(
        self,
        entry_id: str,
        fields: dict[str, str],
        claim: Claim,
        admission: lease.Admission,
        pinned: Handler,
    ) -> Disposition:
        occurrence = Occurrence(
            schedule=claim.schedule,
            instant=claim.instant,
            occurrence_id=claim.occurrence_id,
            args=dict(claim.args),
            app=claim.app,
            attempt=admission.failures + 1,
        )
        carried = propagate.extract({"traceparent": claim.traceparent or ""})
        try:
            with tracer.start_as_current_span(f"stream {claim.schedule}", context=carried):
                run_once(
                    claim.occurrence_id,
                    admission.handler,
                    lambda: pinned.fn(occurrence),
                    database=self.engine,
                    stale_after=admission.timeout_ms / 1000,
                    clock=self.clock,
                )
        except OccurrenceBusy:
            return Disposition.BUSY
        except lease.LeaseError:
            raise
        except Exception as exc:
            failures = lease.count_failure(self.engine, claim.occurrence_id)
            if failures > admission.retries:
                reason = f"handler {admission.handler!r} failed {failures} time(s): {exc!r}"
                self._dead(entry_id, fields, reason[:1000])
                return Disposition.DEAD
            log.warning(
                "occurrence %s: handler %r failed (%r); retried in %gs",
                claim.occurrence_id,
                admission.handler,
                exc,
                self.claim_idle,
            )
            return Disposition.RETRY
        self.redis.xack(self.stream, self.group, entry_id)
        return Disposition.DONE

    def _unavailable(self, claim: Claim, wanted: str) -> Disposition:
        log.warning(
            "occurrence %s: no handler %r in worker %s; left pending",
            claim.occurrence_id,
            wanted,
            self.consumer,
        )
        return Disposition.UNAVAILABLE

    def _invalid(self, entry_id: str, fields: dict[str, str], reason: str) -> Disposition:
        self.meters.add("invalid")
        log.warning("stream entry %s is invalid (%s); dead-lettered", entry_id, reason)
        self._dead(entry_id, fields, reason)
        return Disposition.INVALID

    def _dead(self, entry_id: str, fields: dict[str, str], reason: str) -> None:
        """Copy the entry to the dead stream with ``reason`` and acknowledge it, in one
        MULTI."""
        letter = {**fields, "reason": reason, "entry": entry_id}
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.dead_stream, letter)  # type: ignore[arg-type]
            pipe.xack(self.stream, self.group, entry_id)
            pipe.execute()
        self.meters.add("dead_lettered")
