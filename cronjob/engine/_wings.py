"""The wings: capabilities beside the core, called through one interface.

The core (the dispatcher, recovery, the sweep) claims, runs and ends rounds of the jobs in
its heap. What a replica may do besides — follow the schedules made of data
(``_data``), run a backfill's instants (``_backfill``), send the outbox again
(``_republish``) — is a wing: a part the façade builds only when it applies, hands what
it needs (the ports of ``_ports``), and lists to the core, which calls every wing at the
same points of its life and of each wake, and knows no wing by name. A new capability is
a new wing, not a branch in each part of the core.

`Wing` is the interface; a wing subclasses it and overrides the hooks it needs (the
others do nothing). All hooks are called on the dispatcher thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import lease

    from ._state import JobState

__all__ = ["Wing"]


class Wing(Protocol):
    """The hooks the core calls on each wing, in the order of a replica's life.

    Recovery calls `reached`, `begin`, `poll`, `sweep`, `names_changed`, `next_wake` and
    `close`; the sweep calls `swept` and reads `waiting`; the dispatcher calls
    `request_ended`.
    """

    #: The last sweep left work queued here: on an in-process clock the sweeps go on
    #: instead of waiting for a write.
    waiting: bool = False

    def reached(self, then: Callable[[], None]) -> bool:
        """The database was reached: load what start-up's catch-up must cover, then call
        ``then``. Returns ``True`` when it loads (``then`` comes later), else ``False``
        (``then`` is never called)."""
        return False

    def begin(self) -> None:
        """The database is ready and start-up's catch-up was sent: start working."""
        return

    def poll(self, mono: float) -> None:
        """Each wake, while the database is ready and no drain began (also while start-up's
        catch-up is decided): act if it is time (monotonic ``mono``)."""
        return

    def sweep(self, mono: float) -> None:
        """Each wake that may sweep (the database ready, no drain, no catch-up pending):
        act if it is time, after the sweep for rounds cut short."""
        return

    def swept(self, requests: list[lease.TriggerRow]) -> None:
        """A sweep read the open ``requests`` (after the core took its own): take this
        wing's."""
        return

    def names_changed(self, added: list[JobState], dropped: list[str]) -> None:
        """Leased jobs came (``added``) or went (``dropped``, by name)."""
        return

    def request_ended(self, request: lease.TriggerRow) -> None:
        """The round a request asked for ended on this replica."""
        return

    def next_wake(self, *, draining: bool) -> float | None:
        """When this wing has something to do next (monotonic), or ``None``."""
        return None

    def close(self) -> None:
        """The scheduler stopped: stop the wing's threads and watches."""
        return
