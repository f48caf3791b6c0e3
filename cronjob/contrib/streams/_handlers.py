"""The worker's handlers: `handler` registers one under a job's or a task's name.

A handler is chosen by the schedule's name (or, for a data schedule, its task's), never
by anything the entry says: the name is the target. Each carries its contract, which the
first claim of an occurrence pins (see `cronjob.contrib.streams.Worker`): its timeout,
capped at `MAX_TIMEOUT`, and its retry budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, TypeVar

from ..._exceptions import RegistrationError

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "Handler",
    "Handlers",
    "Occurrence",
    "default_handlers",
    "handler",
]

#: Seconds a handler's run may take by default, and at most (a longer one is capped).
DEFAULT_TIMEOUT: Final = 300.0
MAX_TIMEOUT: Final = 3600.0
#: Runs after a failed one, by default, before the occurrence goes to the dead stream.
DEFAULT_RETRIES: Final = 2

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True, kw_only=True)
class Occurrence:
    """One occurrence, as a handler gets it.

    Attributes:
        schedule: The job's or data schedule's name.
        instant: The scheduled instant, aware UTC, a whole second.
        occurrence_id: Its id ([occurrence_id][cronjob.occurrence_id] of the app, the
            schedule and the instant).
        args: The data schedule's arguments (``{}`` for a registered job).
        app: The application's name ("" for none).
        attempt: 1 for the first run, then 2, 3, ... for the retries.
    """

    schedule: str
    instant: datetime
    occurrence_id: str
    args: Mapping[str, Any] = field(default_factory=dict)
    app: str = ""
    attempt: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Handler:
    """A registered handler and its contract.

    Attributes:
        name: The job's or task's name it runs.
        fn: Called with the [Occurrence][cronjob.contrib.streams.Occurrence].
        timeout: Seconds a run may hold its occurrence (capped at `MAX_TIMEOUT`); past
            it, another worker may take the occurrence over as dead.
        retries: Runs after a failed one before the dead stream.
    """

    name: str
    fn: Callable[[Occurrence], Any]
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise RegistrationError(
                f"handler: the name must be a non-empty string, got {self.name!r}"
            )
        if not callable(self.fn):
            raise RegistrationError(f"handler {self.name!r}: expected a function, got {self.fn!r}")
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise RegistrationError(
                f"handler {self.name!r}: timeout must be a number of seconds > 0, got {timeout!r}"
            )
        retries = self.retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise RegistrationError(
                f"handler {self.name!r}: retries must be a whole number >= 0, got {retries!r}"
            )
        object.__setattr__(self, "timeout", min(float(timeout), MAX_TIMEOUT))


class Handlers:
    """Handlers by name; tests build their own, `default_handlers` is the module's."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def __len__(self) -> int:
        return len(self._handlers)

    def get(self, name: str) -> Handler | None:
        """The handler registered under ``name``; ``None`` if none."""
        return self._handlers.get(name)

    def register(
        self,
        fn: F,
        name: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
    ) -> F:
        """Register ``fn`` as the handler of ``name``; returns ``fn`` unchanged.

        Raises:
            RegistrationError: ``name`` has a handler already, or an option is not valid.
        """
        made = Handler(name=name, fn=fn, timeout=timeout, retries=retries)
        if name in self._handlers:
            raise RegistrationError(f"handler {name!r}: registered twice")
        self._handlers[name] = made
        return fn

    def handler(
        self, name: str, *, timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES
    ) -> Callable[[F], F]:
        """Decorate a function to `register` it under ``name``."""

        def decorate(fn: F) -> F:
            return self.register(fn, name, timeout=timeout, retries=retries)

        return decorate


#: The handlers `handler` registers, which the worker runs by default.
default_handlers = Handlers()


def handler(
    name: str, *, timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES
) -> Callable[[F], F]:
    """Register the decorated function as the handler of ``name`` (a job's or a task's).

    ``@streams.handler("nightly")`` over ``def nightly(occ: streams.Occurrence)``. The
    worker runs it for each occurrence of the job ``name``, or of a data schedule whose
    task is ``name``.

    Args:
        name: The job's or task's name.
        timeout: Seconds a run may take (capped at `MAX_TIMEOUT`).
        retries: Runs after a failed one before the occurrence goes to the dead stream.

    Raises:
        RegistrationError: ``name`` has a handler already, or an option is not valid.
    """
    return default_handlers.handler(name, timeout=timeout, retries=retries)
