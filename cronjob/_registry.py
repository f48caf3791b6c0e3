"""Registration: the jobs an application declares at import time."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import lease

from ._callables import check_fn, is_async, taken_message
from ._exceptions import RegistrationError, ScheduleError
from ._isolation import check_isolatable
from ._policy import DEFAULT_POLICY, FailureHook, Policy, PolicyOptions, check_hook, make_policy
from ._schedule import Schedule, parse

if TYPE_CHECKING:
    from ._round import Round

__all__ = [
    "Job",
    "Registry",
    "Task",
    "default_registry",
    "job",
    "job_per_instance",
    "register",
    "register_per_instance",
    "register_task",
    "task",
]

#: The longest job name: the name is the lease row's key.
MAX_NAME_LENGTH = 200

JobFunction = Callable[["Round"], Any] | Callable[["Round"], Awaitable[Any]]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A registered job: what runs, when, and whether under a lease.

    Attributes:
        name: The job's identity: in every log line about it and as its lease's name.
        fn: The callable run for each round, given the round's [Round][cronjob.Round].
        schedule: When it runs.
        leased: ``True`` for a job run once per instant across all replicas;
            ``False`` for a per-instance job, which every replica runs on its own.
        is_async: calling ``fn`` returns a coroutine (it runs on an asyncio loop): a
            coroutine function, an object whose ``__call__`` is one, or a
            `functools.partial` of either.
        run_at_start: also run once when the replica starts, besides the schedule's
            instants. Per-instance jobs only: a leased job's start-up run is its catch-up.
        policy: Its timeout, retries, start deadline, self-pause and failure hook
            ([Policy][cronjob.Policy]); the defaults keep the seed's behaviour.
        task: For a schedule made of data, the task that runs it; ``None`` for a
            registered job.
        args: For a schedule made of data, the JSON text of its arguments.

    A leased job whose ``fn`` has a ``check_period(name, schedule)`` method (a
    hand-off, `cronjob.contrib.Handoff.check_period`) is checked by it as the job is
    made, registered or a schedule made of data: it logs a warning when the retries
    or the send timeout given to it would keep a round sending past the next instant.

    Raises:
        RegistrationError: ``run_at_start`` on a leased job; a function marked
            ``leased_only`` (a hand-off) as a per-instance job.
    """

    name: str
    fn: Callable[..., Any]
    schedule: Schedule
    leased: bool
    is_async: bool
    run_at_start: bool = False
    policy: Policy = DEFAULT_POLICY
    task: str | None = None
    args: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.run_at_start, bool):
            raise RegistrationError(
                f"job {self.name!r}: run_at_start must be True or False, got {self.run_at_start!r}"
            )
        if not self.leased and getattr(self.fn, "leased_only", False) is True:
            # A hand-off (cronjob.contrib): every replica would publish each instant.
            raise RegistrationError(
                f"job {self.name!r}: {self.fn!r} publishes once per instant under the "
                "lease: register it with register/job, not per instance (every replica "
                "would publish each instant)"
            )
        check_period = getattr(self.fn, "check_period", None)
        if self.leased and callable(check_period):
            # A hand-off (cronjob.contrib.Handoff): warns when the retries or the send
            # timeout it was given would keep a round sending past the next instant.
            check_period(self.name, self.schedule)
        if self.run_at_start and self.leased:
            # Every replica starts: a leased job run at each start would run once per
            # replica, the very thing a lease is for. What a leased job owes at start is
            # the catch-up of its latest missed instant.
            raise RegistrationError(
                f"job {self.name!r}: run_at_start is for per-instance jobs (every replica "
                "runs it as it starts); a leased job catches up its latest missed instant "
                "at start instead"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """A registered task: code whose schedules are data (see `cronjob.schedules`).

    Attributes:
        name: The task's name, which schedules name; unique among a registry's jobs and
            tasks.
        fn: Called with each round of each of its schedules (``ctx.name`` is the
            schedule's id, ``ctx.args`` its arguments).
        is_async: As for [Job][cronjob.Job].
        policy: Its job policies, applied to every round of every one of its schedules.
    """

    name: str
    fn: Callable[..., Any]
    is_async: bool
    policy: Policy = DEFAULT_POLICY


class Registry:
    """A set of jobs. The module-level [register][cronjob.register] adds to the default one.

    Tests and libraries build their own (``Registry()``) and hand it to
    ``Scheduler(registry=...)``. Once a scheduler running a registry has started, the
    registry is frozen: registering then raises `RuntimeError`, because a job
    added after the start would silently never run.

    Args:
        on_failure: Told of every failed, timed-out or deadline-missed round of the
            registry's jobs that have no ``on_failure`` of their own (see
            `FailureHook`).

    Raises:
        RegistrationError: ``on_failure`` is not callable.
    """

    def __init__(self, *, on_failure: FailureHook | None = None) -> None:
        #: The hook for jobs without their own ``on_failure``; ``None``: none.
        self.on_failure = check_hook(on_failure)
        self._jobs: dict[str, Job] = {}
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        self._frozen_by: str | None = None

    def __repr__(self) -> str:
        return f"<Registry of {len(self._jobs)} job(s), {len(self._tasks)} task(s)>"

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def jobs(self) -> tuple[Job, ...]:
        """The registered jobs, in registration order."""
        with self._lock:
            return tuple(self._jobs.values())

    @property
    def tasks(self) -> tuple[Task, ...]:
        """The registered tasks, in registration order."""
        with self._lock:
            return tuple(self._tasks.values())

    def register_task(self, fn: F, name: str, **policy: Unpack[PolicyOptions]) -> F:
        """Register ``fn`` as the task ``name``: code whose schedules are rows, added at
        run time with `cronjob.schedules.add`.

        Each of its schedules runs as a leased job does (once per instant across the
        replicas, under its own lease, named by the schedule's id), with these policies.

        Args:
            fn: Called with each round's [Round][cronjob.Round]; as for
                [register][cronjob.Registry.register].
            name: The task's name, which schedules name: unique among the registry's jobs
                and tasks, checked as a job's name.
            **policy: As for [register][cronjob.Registry.register].

        Returns:
            ``fn`` unchanged.

        Raises:
            RegistrationError: no name, a name taken by a job or task or that some
                database cannot store, ``fn`` not callable with one argument, a policy
                that cannot be honoured.
            RuntimeError: a scheduler running this registry has already started.
        """
        _check_name(name)
        check_fn(fn, name)
        made = make_policy(name, leased=True, options=policy)
        check_isolatable(fn, name, made)
        task = Task(name=name, fn=fn, is_async=is_async(fn), policy=made)
        with self._lock:
            self._refuse_after_start(name, "task")
            taken = self._jobs.get(name) or self._tasks.get(name)
            if taken is not None:
                raise RegistrationError(taken_message(name, taken.fn, fn))
            self._tasks[name] = task
        return fn

    def task(self, *, name: str, **policy: Unpack[PolicyOptions]) -> Callable[[F], F]:
        """Decorate a function to [register_task][cronjob.Registry.register_task] it:
        ``@registry.task(name="tenant-report")``."""

        def decorate(fn: F) -> F:
            return self.register_task(fn, name, **policy)

        return decorate

    def _refuse_after_start(self, name: str, kind: str = "job") -> None:
        if self._frozen_by is not None:
            raise RuntimeError(
                f"cannot register {kind} {name!r}: the scheduler {self._frozen_by} has already "
                "started with this registry; register jobs and tasks at import time"
            )

    def register(
        self,
        fn: F,
        spec: str,
        name: str,
        *,
        run_at_start: bool = False,
        **policy: Unpack[PolicyOptions],
    ) -> F:
        """Register ``fn`` to run on ``spec``, once per instant across all replicas.

        Args:
            fn: Called with the round's [Round][cronjob.Round]; a plain function runs
                in a worker thread, a coroutine function on an asyncio loop. It must be
                idempotent: a round cut short runs a second time.
            spec: A six-field cron expression (seconds first) or a descriptor such as
                ``"@hourly"`` or ``"@every 5m"``, optionally prefixed ``CRON_TZ=<zone> ``.
            name: The job's identity, unique in the registry: at most 200 characters,
                no whitespace at either end, no NUL character or lone surrogate (text
                some database cannot store).

            run_at_start: Refused ([RegistrationError][cronjob.RegistrationError]) when
                true: it is for per-instance jobs; a leased job catches up its latest missed
                instant at start instead.
            **policy: The job's policies, each optional: ``timeout``, ``retries``,
                ``retry_backoff``, ``start_deadline`` (seconds or a ``timedelta``),
                ``pause_after_failures``, ``on_failure``; see [Policy][cronjob.Policy].

        Returns:
            ``fn`` unchanged.

        Raises:
            ScheduleError: ``spec`` does not parse, names a refused zone or never fires.
            RegistrationError: no name, a name already taken or that some database
                cannot store, ``fn`` not callable with one argument, ``run_at_start``,
                or a policy that cannot be honoured (an unknown option, a duration that
                is not positive, a negative count, a hook that is not callable).
            RuntimeError: a scheduler running this registry has already started.
        """
        self._add(fn, spec, name, leased=True, run_at_start=run_at_start, policy=policy)
        return fn

    def register_per_instance(
        self,
        fn: F,
        spec: str,
        name: str,
        *,
        run_at_start: bool = False,
        **policy: Unpack[PolicyOptions],
    ) -> F:
        """Register ``fn`` to run on ``spec`` on every replica, without a lease.

        For work that belongs to the process (a local cache, a local directory). Such a
        job never catches up an instant and never runs a round a second time. With
        ``run_at_start=True`` it also runs once as the replica starts (warming a cache
        before the first instant). Other arguments, return value and errors are as for
        [register][cronjob.Registry.register]; ``pause_after_failures`` is refused (nothing
        shared to pause).
        """
        self._add(fn, spec, name, leased=False, run_at_start=run_at_start, policy=policy)
        return fn

    def job(self, spec: str, *, name: str, **policy: Unpack[PolicyOptions]) -> Callable[[F], F]:
        """Decorate a function to [register][cronjob.Registry.register] it:
        ``@registry.job(spec, name="...")``.

        The decorator form of [register][cronjob.Registry.register], for code that reads
        better with the schedule above the function. The name is required, as for
        [register][cronjob.Registry.register]: it is the lease's key, so renaming a function
        must not rename its job.

        Returns:
            A decorator that registers the function and returns it unchanged; errors are
            those of [register][cronjob.Registry.register], raised when the decorated ``def`` runs.
        """

        def decorate(fn: F) -> F:
            return self.register(fn, spec, name, **policy)

        return decorate

    def job_per_instance(
        self,
        spec: str,
        *,
        name: str,
        run_at_start: bool = False,
        **policy: Unpack[PolicyOptions],
    ) -> Callable[[F], F]:
        """Decorate a function to
        [register_per_instance][cronjob.Registry.register_per_instance] it.

        ``@registry.job_per_instance("@every 1h", name="clear-tmp", run_at_start=True)``;
        see [job][cronjob.Registry.job].
        """

        def decorate(fn: F) -> F:
            return self.register_per_instance(fn, spec, name, run_at_start=run_at_start, **policy)

        return decorate

    def _add(
        self,
        fn: Callable[..., Any],
        spec: str,
        name: str,
        *,
        leased: bool,
        run_at_start: bool,
        policy: PolicyOptions,
    ) -> None:
        _check_name(name)
        check_fn(fn, name)
        made = make_policy(name, leased=leased, options=policy)
        check_isolatable(fn, name, made)
        try:
            schedule = parse(spec)
        except ScheduleError as exc:
            raise ScheduleError(f"job {name!r}: {exc}") from exc
        except TypeError as exc:
            raise ScheduleError(f"job {name!r}: spec must be a string, got {spec!r}") from exc
        job = Job(
            name=name,
            fn=fn,
            schedule=schedule,
            leased=leased,
            is_async=is_async(fn),
            run_at_start=run_at_start,
            policy=made,
        )
        with self._lock:
            self._refuse_after_start(name)
            taken = self._jobs.get(name) or self._tasks.get(name)
            if taken is not None:
                raise RegistrationError(taken_message(name, taken.fn, fn))
            self._jobs[name] = job

    def derive(
        self,
        *,
        without: Iterable[str] = (),
        replace: Mapping[str, Callable[..., Any]] | None = None,
    ) -> Registry:
        """Return a new registry with this one's jobs, for a test or another process.

        Args:
            without: Names of jobs to leave out.
            replace: Job name to the function that runs instead of the registered one
                (same name, schedule and kind; checked as at registration).

        Raises:
            RegistrationError: a name in ``without`` or ``replace`` is not registered.
        """
        replace = dict(replace or {})
        dropped = set(without)
        jobs = {job.name: job for job in self.jobs}
        unknown = sorted((dropped | set(replace)) - set(jobs))
        if unknown:
            raise RegistrationError(
                f"cannot derive a registry: no job named {', '.join(map(repr, unknown))}"
            )
        derived = Registry(on_failure=self.on_failure)
        for name, job in jobs.items():
            if name in dropped:
                continue
            fn = replace.get(name, job.fn)
            if fn is not job.fn:
                check_fn(fn, name)
                check_isolatable(fn, name, job.policy)
                job = dataclasses.replace(job, fn=fn, is_async=is_async(fn))
            derived._jobs[name] = job
        derived._tasks = dict(self._tasks)
        return derived

    def _freeze(self, by: str) -> tuple[Job, ...]:
        """Refuse further registrations and return the jobs (called at scheduler start)."""
        with self._lock:
            if self._frozen_by is None:
                self._frozen_by = by
            return tuple(self._jobs.values())


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise RegistrationError(f"a job name must be a string, got {name!r}")
    if not name.strip():
        raise RegistrationError("a job needs a name: got an empty one")
    if name != name.strip():
        # MariaDB/MySQL compare strings ignoring trailing spaces: "job " would share the
        # lease of "job". Refused for every job, so a name means the same everywhere.
        raise RegistrationError(f"job name {name!r} starts or ends with whitespace")
    if len(name) > MAX_NAME_LENGTH:
        raise RegistrationError(
            f"job name {name[:40]!r}... is {len(name)} characters long; "
            f"the limit is {MAX_NAME_LENGTH}"
        )
    problem = lease.unstorable(name)
    if problem is not None:
        # Caught here, not by the database: the statement that ensures every job's lease
        # row, and the one that claims every job sharing an instant, carry all the names
        # at once, so one unstorable name would fail them for every job.
        raise RegistrationError(f"job name {name!r} {problem}")


#: The registry that `register` and ``Scheduler(registry=None)`` use.
default_registry = Registry()


def register(
    fn: F, spec: str, name: str, *, run_at_start: bool = False, **policy: Unpack[PolicyOptions]
) -> F:
    """Register ``fn`` in the default registry; see
    [Registry.register][cronjob.Registry.register]."""
    return default_registry.register(fn, spec, name, run_at_start=run_at_start, **policy)


def register_per_instance(
    fn: F, spec: str, name: str, *, run_at_start: bool = False, **policy: Unpack[PolicyOptions]
) -> F:
    """Register a per-instance job in the default registry.

    See [Registry.register_per_instance][cronjob.Registry.register_per_instance].
    """
    return default_registry.register_per_instance(
        fn, spec, name, run_at_start=run_at_start, **policy
    )


def job(spec: str, *, name: str, **policy: Unpack[PolicyOptions]) -> Callable[[F], F]:
    """Register the decorated function in the default registry: ``@cronjob.job(spec, name=...)``.

    The decorator form of [register][cronjob.register]; see [Registry.job][cronjob.Registry.job].
    """
    return default_registry.job(spec, name=name, **policy)


def job_per_instance(
    spec: str, *, name: str, run_at_start: bool = False, **policy: Unpack[PolicyOptions]
) -> Callable[[F], F]:
    """Register the decorated function as a per-instance job in the default registry.

    The decorator form of [register_per_instance][cronjob.register_per_instance]; see
    [Registry.job][cronjob.Registry.job].
    """
    return default_registry.job_per_instance(spec, name=name, run_at_start=run_at_start, **policy)


def register_task(fn: F, name: str, **policy: Unpack[PolicyOptions]) -> F:
    """Register a task in the default registry; see
    [Registry.register_task][cronjob.Registry.register_task]."""
    return default_registry.register_task(fn, name, **policy)


def task(*, name: str, **policy: Unpack[PolicyOptions]) -> Callable[[F], F]:
    """Register the decorated function as a task in the default registry:
    ``@cronjob.task(name="tenant-report")``; see
    [Registry.register_task][cronjob.Registry.register_task]."""
    return default_registry.task(name=name, **policy)
