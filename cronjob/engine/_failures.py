"""What a job's policy does when its rounds fail: pause the job, call the failure hook.

`Failures` is told of every round's end once it is settled (on the finisher's
thread for an end recorded with others, on the round's own thread otherwise: a
per-instance round, a manual one). It never runs user code there:

- **The self-pause** (``pause_after_failures=N``, leased jobs): when a round of such a
  job ends ``failed`` or ``timed_out`` and its end is on record, one query over the job's
  latest rounds in the history decides, on the finisher's thread, before the end is
  handed back to the dispatcher (so this replica starts no next round before the pause
  is on record). The job pauses when the newest N of its rounds that count — ``failed``
  and ``timed_out`` count, ``succeeded`` and a ``resumed`` note end the run — all failed.
  An attempt to be retried, a round cut short or given up, a missed start deadline
  neither count nor end the run. The history is the replicas' shared record, so failures
  on every replica count together; two replicas that decide at once both write the
  pause, and [lease.LeaseStore.set_paused][] changes a paused row no more, so the
  job is paused (and noted, and the warning logged) once. Should the history keep fewer
  counted rows than N, they decide, unless the history may have been pruned of the
  job's older rounds (the job is older than the history keeps, or the history holds as
  many of its rounds as it keeps per job): then the lease row's failures in a row do.
- **The failure hook** (a job's ``on_failure``, else its registry's): called once per
  round that ended ``failed``, ``timed_out`` or ``missed_deadline``, with its
  [cronjob.admin.RoundRecord][], on one daemon thread of its own (``cronjob-hooks``),
  started on the first call: a scheduler whose jobs have no hook has no such thread.
  Hooks run one at a time, in the order the rounds ended; what a hook raises is logged
  with its traceback and the next one runs. At stop the scheduler waits up to
  `HOOKS_STOP_SECONDS` (real seconds) for the hooks queued; a hook still running
  then is left to its daemon thread, and the rest queued are dropped, with a warning.
- **The success hook** (a job's ``on_success``): called once per round that ended
  ``succeeded``, with its record, on the same thread, in the same order, as the
  failure hooks; what it raises is logged.
- **The heartbeat** (a job's ``heartbeat=URL``, see `cronjob.engine._heartbeat`): a
  ping as a round starts (not a retry's attempt: the round goes on), as it succeeds,
  and as it ends ``failed``, ``timed_out`` or ``missed_deadline``, each queued on the
  same thread (a round cut short pings no end: its second run starts again). At most
  `MAX_QUEUED_PINGS` wait at once; more (an endpoint that hangs, a job every second)
  are dropped, with a warning: the endpoint then alerts, as it should. A schedule made
  of data pings its own heartbeat, else its task's (`follow`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Final

import lease

from .._policy import FailureHook, SuccessHook
from .._round import Outcome
from ._heartbeat import Event, ping
from ._state import Reason

if TYPE_CHECKING:
    from .._history import History
    from .._records import RoundRecord
    from .._registry import Job, Registry
    from ._ports import Lookup
    from ._state import Run

__all__ = [
    "HOOKS_STOP_SECONDS",
    "MAX_QUEUED_PINGS",
    "PAUSED_BY",
    "Failures",
    "Hooks",
    "check_history",
    "hooked",
    "round_record",
]

log = logging.getLogger("cronjob")

#: Who a job that paused itself was paused by, on record (``paused_by``).
PAUSED_BY: Final = "cronjob"
#: Real seconds a stopping scheduler waits for the failure hooks queued to run.
HOOKS_STOP_SECONDS: Final = 5.0

#: The ends a failure hook is told of.
HOOKED: Final = frozenset({Outcome.FAILED, Outcome.TIMED_OUT, Outcome.MISSED_DEADLINE})
#: The ends told with a success hook or a heartbeat.
TOLD_ALL: Final = HOOKED | {Outcome.SUCCEEDED}
#: Heartbeat pings that may wait for the hooks thread at once; more are dropped.
MAX_QUEUED_PINGS: Final = 100
#: The ends that count towards ``pause_after_failures``.
COUNTED: Final = frozenset(Outcome(word) for word in lease.COUNTED_FAILURES)
#: The history's outcomes the self-pause reads: those that count, and those that end a
#: run of failures (a success, an operator's resume).
_READ: Final = (*sorted(lease.COUNTED_FAILURES), "succeeded", "resumed")


def check_history(jobs: tuple[Job, ...], history: object) -> None:
    """Refuse a self-pause the scheduler's history cannot count.

    Args:
        jobs: The registry's jobs.
        history: The scheduler's [History][cronjob.History], or ``None``.

    Raises:
        ValueError: a job has ``pause_after_failures`` and there is no history, or the
            history keeps fewer rounds per job than N failed rounds and their retries.
    """
    for job in jobs:
        wanted = job.policy.pause_after_failures
        if wanted is None:
            continue
        if history is None:
            raise ValueError(
                f"job {job.name!r}: pause_after_failures counts its rounds in the round "
                "history, and this scheduler keeps none (history=None)"
            )
        rows = wanted * (1 + job.policy.retries)
        per_job = getattr(history, "per_job", rows)
        if per_job < rows:
            raise ValueError(
                f"job {job.name!r}: pause_after_failures={wanted} with retries="
                f"{job.policy.retries} needs the history to keep {rows} rounds per job, "
                f"it keeps {per_job}"
            )


def hooked(registry: Registry) -> bool:
    """Whether any job of ``registry`` has a failure hook (its own or the registry's), a
    success hook or a heartbeat, or the registry has tasks (whose schedules may carry a
    heartbeat of their own): the hooks' object, whose thread starts on first use."""
    policies = [job.policy for job in registry.jobs] + [task.policy for task in registry.tasks]
    return (
        registry.on_failure is not None
        or bool(registry.tasks)
        or any(
            policy.on_failure is not None
            or policy.on_success is not None
            or policy.heartbeat is not None
            for policy in policies
        )
    )


class Hooks:
    """One daemon thread that calls the failure hooks handed to it, one at a time.

    Started by the first `call_later`; `close` lets the calls queued run,
    for a bounded time.
    """

    def __init__(self, name: str = "cronjob-hooks") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Heartbeat pings queued and not yet sent.
        self._pings = 0

    @property
    def thread(self) -> threading.Thread | None:
        """The thread, once started."""
        return self._thread

    def call_later(self, hook: FailureHook, record: RoundRecord) -> None:
        """Call ``hook(record)`` on the hooks thread; dropped (logged) once closed."""
        with self._lock:
            if self._closed:
                log.warning(
                    "job %r: the scheduler has stopped; its hook is not called (round of %s)",
                    record.job,
                    record.instant.isoformat(),
                )
                return
            self._put(lambda: _call(hook, record))

    def ping_later(self, job: str, url: str, event: Event) -> None:
        """Ping job ``job``'s heartbeat ``url`` for ``event`` on the hooks thread; dropped
        (logged) once closed or when `MAX_QUEUED_PINGS` wait already."""
        with self._lock:
            if self._closed:
                log.warning(
                    "job %r: the scheduler has stopped; its %s ping is not sent", job, event
                )
                return
            if self._pings >= MAX_QUEUED_PINGS:
                log.warning(
                    "job %r: its %s ping is dropped: %d heartbeat pings wait already (an "
                    "endpoint that does not answer?)",
                    job,
                    event,
                    self._pings,
                )
                return
            self._pings += 1

            def send() -> None:
                with self._lock:
                    self._pings -= 1
                ping(job, url, event)

            self._put(send)

    def _put(self, call: Callable[[], None]) -> None:
        """Queue ``call``, starting the thread if need be (under the lock)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put(call)

    def close(self, timeout: float = HOOKS_STOP_SECONDS) -> bool:
        """Refuse new calls; wait up to ``timeout`` real seconds for those queued.

        Returns:
            ``True`` when every call queued has run (or none was); ``False`` when a hook
            still runs: it is left to its daemon thread, the calls behind it dropped.
        """
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is None:
                return True
            self._queue.put(None)
        # Real time, as the scheduler's bound on its last statements: a hook is the
        # application's code, it may wait on anything, and stop must end.
        thread.join(timeout)
        if thread.is_alive():
            log.warning(
                "a failure hook still runs %.0f s after the scheduler began to stop: it is "
                "left running on its daemon thread, and the hooks queued behind it are "
                "not called",
                timeout,
            )
            return False
        return True

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            item()


class Failures:
    """A scheduler's failure policies: the self-pause and the failure hooks.

    Args:
        store: The lease store (the history read, the pause written).
        registry: The jobs and the registry-wide hook.
        replica_id: This replica, on the records handed to hooks of rounds not on record.
        hooks: Where hooks run; ``None`` when no job has a hook.
        history: What the history keeps (``None``: nothing), to tell a run of failures
            that is short from one whose older rounds were pruned.
    """

    def __init__(
        self,
        *,
        store: lease.LeaseStore,
        registry: Registry,
        replica_id: str,
        hooks: Hooks | None,
        history: History | None = None,
    ) -> None:
        self._store = store
        self._history = history
        self._replica_id = replica_id
        self._hooks = hooks
        fallback = registry.on_failure
        self._hook_of: Mapping[str, FailureHook | None] = {
            job.name: job.policy.on_failure or fallback for job in registry.jobs
        } | {task.name: task.policy.on_failure or fallback for task in registry.tasks}
        policies = [(job.name, job.policy) for job in registry.jobs]
        policies += [(task.name, task.policy) for task in registry.tasks]
        self._success_of: Mapping[str, SuccessHook] = {
            name: policy.on_success for name, policy in policies if policy.on_success is not None
        }
        self._beat_of: Mapping[str, str] = {
            name: policy.heartbeat for name, policy in policies if policy.heartbeat is not None
        }
        self._told = TOLD_ALL if self._success_of or self._beat_of else HOOKED
        leased = [(job.name, job.policy) for job in registry.jobs if job.leased]
        leased += [(task.name, task.policy) for task in registry.tasks]
        self._pause_after: Mapping[str, int] = {
            name: policy.pause_after_failures
            for name, policy in leased
            if policy.pause_after_failures is not None
        }
        #: The task of a schedule made of data, by its id (``None``: not a schedule): its
        #: rounds take their task's policy (set by the scheduler when it follows any).
        self.task_of: Callable[[str], str | None] = _no_task
        #: The heartbeat of a schedule made of data by its id (its own, else its task's).
        self.heartbeat_of: Callable[[str], str | None] = _no_task
        self._schedules: Lookup | None = None
        #: Whether any end needs a look: the runner skips the call otherwise.
        self.active = hooks is not None or bool(self._pause_after)
        #: Whether any job has a heartbeat, or may (a schedule's own): the runner tells
        #: `started` then.
        self.beats = hooks is not None and bool(self._beat_of or registry.tasks)

    @property
    def told(self) -> frozenset[Outcome]:
        """The ends `ended` wants to be told of (the others are not handed in): the
        successes too while a job has a success hook or a heartbeat (a schedule's own)."""
        if self._told is HOOKED and self._schedules is not None and self._schedules.beating:
            return TOLD_ALL
        return self._told

    def follow(self, schedules: Lookup) -> None:
        """Take the task and the heartbeat of a schedule made of data from ``schedules``
        (set by the scheduler when it follows any): its rounds take its policies."""
        self.task_of = schedules.task_of
        self.heartbeat_of = schedules.heartbeat_of
        self._schedules = schedules

    def ended(self, ends: list[tuple[Outcome, RoundRecord, bool]]) -> None:
        """Act on rounds that ended: ``(outcome, record, on_record)`` each, ``on_record``
        when the end was written to the lease table. Never raises."""
        for outcome, record, on_record in ends:
            if outcome is Outcome.SUCCEEDED and self._hooks is not None:
                self._succeeded(record)
            if outcome not in HOOKED:
                continue  # most ends: a success, a round cut short, a retried attempt
            name = record.job
            key = self.task_of(name) or name  # a schedule's task; a job's own name
            self._beat(key, name, "fail")
            if on_record and outcome in COUNTED and key in self._pause_after:
                try:
                    self._maybe_pause(name, self._pause_after[key])
                except Exception:  # a database error: the next failure looks again
                    log.exception("job %r: counting its failed rounds failed", name)
            hook = self._hook_of.get(key)
            if hook is not None and self._hooks is not None:
                self._hooks.call_later(hook, record)

    def started(self, run: Run) -> None:
        """``run``'s round started (on its own thread): its heartbeat's start ping, queued
        (not for a retry's attempt: the round started already)."""
        if not self._beat_of and not (self._schedules is not None and self._schedules.beating):
            return  # no heartbeat anywhere (a replica of tasks is told of every start)
        if run.reason is not Reason.RETRY:
            name = run.ctx.name
            self._beat(self.task_of(name) or name, name, "start")

    def _succeeded(self, record: RoundRecord) -> None:
        """A round ended ``succeeded``: its success hook and its heartbeat's ping."""
        name = record.job
        key = self.task_of(name) or name
        hook = self._success_of.get(key)
        if hook is not None and self._hooks is not None:
            self._hooks.call_later(hook, record)
        self._beat(key, name, "success")

    def _beat(self, key: str, name: str, event: Event) -> None:
        """Queue job ``name``'s heartbeat ping for ``event`` (``key``: its policy's name)."""
        # A schedule's own, else its task's (which its own includes); a job's own.
        url = self.heartbeat_of(name) or self._beat_of.get(key)
        if url is not None and self._hooks is not None:
            self._hooks.ping_later(name, url, event)

    def _pruned(self, name: str, row: lease.LeaseRow) -> bool:
        """Whether ``name``'s history may have lost rounds to pruning: the job is older
        than the history keeps rounds (or its age is not on record), or the history
        holds as many of its rounds as it keeps per job."""
        history = self._history
        if history is None or row.deployed is None or row.last_end is None:
            return True
        if row.last_end - row.deployed >= timedelta(days=history.days):
            return True
        return len(self._store.rounds(name, limit=history.per_job)) >= history.per_job

    def close_hooks(self, seconds: float) -> None:
        """Let the hooks queued run for up to ``seconds`` real seconds, then refuse more
        (see `Hooks.close`)."""
        if self._hooks is not None:
            self._hooks.close(max(0.0, min(seconds, HOOKS_STOP_SECONDS)))

    def _maybe_pause(self, name: str, wanted: int) -> None:
        """Pause ``name`` if its newest ``wanted`` counted rounds all failed."""
        rows = self._store.rounds(name, limit=wanted, outcomes=_READ)
        if any(row.outcome not in lease.COUNTED_FAILURES for row in rows):
            return  # a success or a resume among them: the run is shorter than N
        if len(rows) < wanted:
            # Fewer counted rounds on record than N: the run is that short, unless the
            # history may have lost some of it to pruning; then the lease row's failures
            # in a row, which no pruning touches, decide (they count the rounds given up
            # too: an over-count only a pruned history can leave).
            row = self._store.read([name]).get(name)
            if row is None or row.failures < wanted or not self._pruned(name, row):
                return
        last = rows[0].error if rows and rows[0].error else "no error on record"
        reason = _bounded(f"paused after {wanted} failed rounds in a row; last: {last}")
        if self._store.set_paused([name], paused=True, by=PAUSED_BY, reason=reason):
            log.warning(
                "job %r paused itself on every replica: %s. `cronjob resume %s` runs it again",
                name,
                reason,
                name,
            )


def round_record(
    run: Run, outcome: Outcome, ending: lease.Ending | None, replica_id: str
) -> RoundRecord:
    """The record a failure hook is handed: the history row the end was written with,
    or, without one (history off, a per-instance round), the same values from ``run``."""
    from .._records import record_of

    row = None if ending is None else ending.record
    ctx = run.ctx
    if row is None:
        ended = ending.ended if ending is not None else ctx.instant
        row = lease.RoundRow(
            name=ctx.name,
            instant=ctx.instant,
            attempt=ctx.attempt,
            holder=replica_id,
            why=run.reason.why,
            started=run.started if run.started is not None else ended,
            ended=ended,
            outcome=outcome.value,
            error=None if ending is None else ending.error,
            trace_id=ctx.trace_id or None,
            requested_by=ctx.requested_by,
        )
    return record_of(row)


def _bounded(reason: str) -> str:
    """``reason`` cut to what the lease row keeps (marked)."""
    limit = lease.REASON_LENGTH
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def _call(hook: FailureHook | SuccessHook, record: RoundRecord) -> None:
    """Call a hook on the hooks thread; what it raises is logged, the next one runs."""
    try:
        hook(record)
    except Exception:  # the application's bug: logged, the next hook runs
        kind = "success" if record.outcome == "succeeded" else "failure"
        log.exception(
            "job %r: its %s hook %s raised (round of %s, %s)",
            record.job,
            kind,
            _named(hook),
            record.instant.isoformat(),
            record.outcome,
        )


def _named(hook: object) -> str:
    """``module.qualname`` of a hook, for its log line."""
    module = getattr(hook, "__module__", None) or "?"
    return f"{module}.{getattr(hook, '__qualname__', repr(hook))}"


def _no_task(_name: str) -> str | None:
    return None
