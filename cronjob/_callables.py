"""The callables registered as jobs and tasks: checked to take the round, told async or
not, and named in errors."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from inspect import Parameter
from typing import Any

from ._exceptions import RegistrationError

__all__ = ["check_fn", "describe", "is_async", "taken_message"]


def check_fn(fn: object, name: str) -> None:
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
        f"job {name!r}: {describe(fn)} {problem}; a job must accept the round as its one "
        "positional argument, e.g. def job(ctx): ..."
    )


def _origin(fn: object) -> tuple[str, str]:
    """Return the module and qualified name of ``fn``, as far as they can be told."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not hasattr(fn, "__qualname__"):
        fn = type(fn)  # a callable instance: name its class
    return getattr(fn, "__module__", None) or "?", getattr(fn, "__qualname__", repr(fn))


def describe(fn: object) -> str:
    """Name ``fn`` as ``module.qualname``."""
    return ".".join(_origin(fn))


def taken_message(name: str, first: object, second: object) -> str:
    """Say who took ``name`` first, and spot a module imported under a second name."""
    message = f"job name {name!r} is already taken by {describe(first)}"
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


def is_async(fn: Callable[..., Any]) -> bool:
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
