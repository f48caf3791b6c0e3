"""Registration: the jobs an application declares at import time."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from inspect import Parameter
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import lease

from ._exceptions import RegistrationError, ScheduleError
from ._policy import DEFAULT_POLICY, FailureHook, Policy, PolicyOptions, check_hook, make_policy
from ._schedule import Schedule, parse

if TYPE_CHECKING:
    from ._round import Round

__all__ = [
    "Job",
    "Registry",
    "default_registry",
    "job",
    "job_per_instance",
    "register",
    "register_per_instance",
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

    Raises:
        RegistrationError: ``run_at_start`` on a leased job.
    """

    name: str
    fn: Callable[..., Any]
    schedule: Schedule
    leased: bool
    is_async: bool
    run_at_start: bool = False
    policy: Policy = DEFAULT_POLICY

    def __post_init__(self) -> None:
        if not isinstance(self.run_at_start, bool):
            raise RegistrationError(
                f"job {self.name!r}: run_at_start must be True or False, got {self.run_at_start!r}"
            )
        if self.run_at_start and self.leased:
            # Every replica starts: a leased job run at each start would run once per
            # replica, the very thing a lease is for. What a leased job owes at start is
            # the catch-up of its latest missed instant.
            raise RegistrationError(
                f"job {self.name!r}: run_at_start is for per-instance jobs (every replica "
                "runs it as it starts); a leased job catches up its latest missed instant "
                "at start instead"
            )


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
        self._lock = threading.Lock()
        self._frozen_by: str | None = None

    def __repr__(self) -> str:
        return f"<Registry of {len(self._jobs)} job(s)>"

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def jobs(self) -> tuple[Job, ...]:
        """The registered jobs, in registration order."""
        with self._lock:
            return tuple(self._jobs.values())

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
        _check_fn(fn, name)
        made = make_policy(name, leased=leased, options=policy)
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
            is_async=_is_async(fn),
            run_at_start=run_at_start,
            policy=made,
        )
        with self._lock:
            if self._frozen_by is not None:
                raise RuntimeError(
                    f"cannot register job {name!r}: the scheduler {self._frozen_by} has "
                    "already started with this registry; register jobs at import time"
                )
            taken = self._jobs.get(name)
            if taken is not None:
                raise RegistrationError(_taken_message(name, taken.fn, fn))
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
                _check_fn(fn, name)
                job = dataclasses.replace(job, fn=fn, is_async=_is_async(fn))
            derived._jobs[name] = job
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


def _check_fn(fn: object, name: str) -> None:
    if not callable(fn):
        raise RegistrationError(f"job {name!r}: {fn!r} is not callable")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return
    try:
        signature.bind(object())
    except TypeError:
        pass
    else:
        return
    parameters = signature.parameters.values()
    positional = (Parameter.POSITIONAL_ONLY, Parameter.POSITIONAL_OR_KEYWORD)
    if not any(p.kind in (*positional, Parameter.VAR_POSITIONAL) for p in parameters):
        problem = "takes no arguments: too few"
    else:
        required = [
            p.name
            for p in parameters
            if p.default is Parameter.empty
            and p.kind not in (Parameter.VAR_POSITIONAL, Parameter.VAR_KEYWORD)
        ]
        problem = f"requires {len(required)} arguments ({', '.join(required)}): too many"
    raise RegistrationError(
        f"job {name!r}: {_describe(fn)} {problem}; a job must accept the round as its one "
        "positional argument, e.g. def job(ctx): ..."
    )


def _origin(fn: object) -> tuple[str, str]:
    """Return the module and qualified name of ``fn``, as far as they can be told."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not hasattr(fn, "__qualname__"):
        fn = type(fn)  # a callable instance: name its class
    return getattr(fn, "__module__", None) or "?", getattr(fn, "__qualname__", repr(fn))


def _describe(fn: object) -> str:
    """Name ``fn`` as ``module.qualname``."""
    return ".".join(_origin(fn))


def _taken_message(name: str, first: object, second: object) -> str:
    """Say who took ``name`` first, and spot a module imported under a second name."""
    message = f"job name {name!r} is already taken by {_describe(first)}"
    first_module, second_module = _origin(first)[0], _origin(second)[0]
    first_file = getattr(sys.modules.get(first_module), "__file__", None)
    second_file = getattr(sys.modules.get(second_module), "__file__", None)
    if first_module != second_module and first_file is not None and first_file == second_file:
        # One file run as two modules (`app.jobs` and `jobs`, when both the project and
        # the package are on sys.path) registers every job twice.
        message += (
            f": {first_file} was imported twice, as {first_module} and as {second_module}; "
            "import it under one name"
        )
    return message


def _is_async(fn: Callable[..., Any]) -> bool:
    """Tell whether calling ``fn`` returns a coroutine, without calling it.

    True for a coroutine function or method, for an object whose ``__call__`` is one,
    and for a `functools.partial` (however nested) of either. A plain function that
    returns a coroutine (``lambda ctx: work(ctx)``) cannot be told here; the round runner
    awaits what it returns.
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isroutine(fn) or inspect.isclass(fn):
        return False  # a function, method or builtin that is not async; a class constructs
    # An instance: inspect.iscoroutinefunction looks at the object, not at its __call__.
    return inspect.iscoroutinefunction(type(fn).__call__)


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
