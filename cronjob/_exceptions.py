"""Exceptions raised by `cronjob`.

The tree::

    CronjobError
    ├── ScheduleError (ValueError)        a spec that does not parse or never fires
    ├── RegistrationError (ValueError)    a job that cannot be honoured as registered
    ├── Retry                             raised by a job to ask for another attempt
    └── Cancelled (BaseException-free)    the ending of a round: raised by ``Round.check()``
        ├── Shutdown                      the process began to drain
        ├── LeaseLost                     the round's lease was taken or timed out
        ├── TimedOut                      the round ran past its job's ``timeout``
        └── Superseded                    a newer instant came (``overlap="cancel_other"``)

``Cancelled`` derives from `Exception` (through ``CronjobError``) so that a job
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
    "Retry",
    "Shutdown",
    "Superseded",
    "TimedOut",
]


class CronjobError(Exception):
    """Root of every exception this package raises on purpose."""


class ScheduleError(CronjobError, ValueError):
    """Raised when a schedule spec does not parse, names a refused zone, or never fires."""


class RegistrationError(CronjobError, ValueError):
    """Raised when a job cannot be registered as asked (no name, name taken, not callable)."""


class Retry(CronjobError):
    """Raised by a job to ask for another attempt of its round (``ctx.retry_in``).

    The round counts as failed for this attempt and runs again for the same instant,
    under the same lease, if its job's ``retries`` allow another attempt and the retry
    can start before the job's next instant is due; otherwise the round ends failed.

    Args:
        delay: Seconds to wait before the next attempt; ``None``: the job's backoff.
    """

    def __init__(self, delay: float | None = None) -> None:
        if delay is not None and not (delay >= 0):  # NaN too
            raise ValueError(f"a retry's delay must be >= 0 seconds, got {delay!r}")
        super().__init__("retry requested" if delay is None else f"retry requested in {delay:g} s")
        #: Seconds to wait before the next attempt; ``None``: the job's backoff.
        self.delay = delay

    def __reduce__(self) -> tuple[type[Retry], tuple[float | None]]:
        """Pickle by the delay (a round in a child process sends its `Retry` back)."""
        return (type(self), (self.delay,))


class Cancelled(CronjobError):
    """Raised when a round has been cancelled; its subclasses say why."""


class Shutdown(Cancelled):
    """Raised when a round is cancelled because its scheduler began to drain."""


class LeaseLost(Cancelled):
    """Raised when a round's lease was taken by another claim or could not be renewed in time."""


class TimedOut(Cancelled):
    """Raised when a round is cancelled because it ran past its job's ``timeout``.

    A round that ends this way is recorded ``timed_out``: it ran long, it was not cut
    short, so it never runs a second time for its instant.
    """


class Superseded(Cancelled):
    """Raised when a round is cancelled because its job's next instant came while it ran,
    under ``overlap="cancel_other"``.

    A round that ends this way is recorded ``superseded``: it is never run a second time
    (the newer instant replaces it) and it is not counted as a failure. The newer instant
    starts once this round has ended, never beside it.
    """
