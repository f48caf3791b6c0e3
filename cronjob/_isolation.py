"""Which functions a round in a child process can run (``isolation="process"``).

The child process starts fresh (forkserver or spawn, never fork: a replica has threads)
and finds the job's function by its module and qualified name, as `pickle` does. A
lambda, a function defined inside another (a closure) or an object without a name cannot
be found that way: it is refused at registration, naming the job, not at its first round.
So is an object that says it cannot run in a child (``isolatable = False``): a hand-off
(`cronjob.contrib.Handoff`) holds its publisher's thread and the sends it gave up on,
which belong to the replica, and pickling it fails at every round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._exceptions import RegistrationError
from ._policy import Policy

__all__ = ["check_isolatable"]


def check_isolatable(fn: Callable[..., Any], name: str, policy: Policy) -> None:
    """Refuse ``fn`` for job ``name`` when its ``policy`` runs rounds in a child process
    and the child could not import ``fn`` by name.

    Raises:
        RegistrationError: ``fn`` says it cannot run in a child (its ``isolatable`` is
            ``False``: a hand-off, see `cronjob.contrib.Handoff`); ``fn`` is a lambda, a
            closure (its qualified name holds ``<locals>``), or has no ``__module__`` or
            ``__qualname__`` (a ``functools.partial``, most callable objects).
    """
    if not policy.isolated:
        return
    if getattr(fn, "isolatable", True) is False:
        raise RegistrationError(
            f"job {name!r}: isolation='process' runs each round in a child process; {fn!r} "
            "hands its instants to a task queue from this replica (its publisher, its sends "
            "in flight) and cannot run there: leave isolation to the workers that run the task"
        )
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        raise RegistrationError(
            f"job {name!r}: isolation='process' runs each round in a child process, which "
            f"imports the job's function by its module and name; {fn!r} cannot be imported "
            "so (a lambda, a function defined inside another, or an object without a "
            "name): define it at the top level of a module"
        )
