"""Exceptions raised by :mod:`cronjob`.

The tree::

    CronjobError
    ├── ScheduleError (ValueError)        a spec that does not parse or never fires
    ├── RegistrationError (ValueError)    a job that cannot be honoured as registered
    └── Cancelled (BaseException-free)    the ending of a round: raised by ``Round.check()``
        ├── Shutdown                      the process began to drain
        └── LeaseLost                     the round's lease was taken or timed out

``Cancelled`` derives from :class:`Exception` (through ``CronjobError``) so that a job
may catch and join it, as Go joins errors; the scheduler tells a round that was cut short
from one that ran to its end by finding the round's own cancellation in what the job
raised.
"""

from __future__ import annotations

__all__ = [
    "Cancelled",
    "CronjobError",
    "LeaseLost",
    "RegistrationError",
    "ScheduleError",
    "Shutdown",
]


class CronjobError(Exception):
    """Root of every exception this package raises on purpose."""


class ScheduleError(CronjobError, ValueError):
    """Raised when a schedule spec does not parse, names a refused zone, or never fires."""


class RegistrationError(CronjobError, ValueError):
    """Raised when a job cannot be registered as asked (no name, name taken, not callable)."""


class Cancelled(CronjobError):
    """Raised when a round has been cancelled; its subclasses say why."""


class Shutdown(Cancelled):
    """Raised when a round is cancelled because its scheduler began to drain."""


class LeaseLost(Cancelled):
    """Raised when a round's lease was taken by another claim or could not be renewed in time."""
