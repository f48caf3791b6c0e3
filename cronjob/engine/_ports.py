"""The ports: what a part of the engine may ask of the parts above it.

A part never imports the part that calls it (the dispatcher, the scheduler): the façade
hands it, as it wires the parts (see ``_wiring``), the few methods it needs, typed by
one of these protocols or as a plain callable. The dispatcher satisfies `Timetable` and
`Starter`, the claims `Claimer`, recovery `Outage`, the data schedules `Lookup`; each
protocol names what its callers use, nothing more, so a part's constructor says what it
may do to the rest.

Nothing here runs: these are types (the calls they stand for cost one attribute lookup,
as a call on the object itself would).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from ._state import JobState, Reason

if TYPE_CHECKING:
    import lease

__all__ = ["Claimer", "Lookup", "Outage", "Starter", "Timetable"]


class Timetable(Protocol):
    """The dispatcher's heap of next instants, as the parts that take a job off it
    (to claim or start it) or put it back see it. Dispatcher thread only."""

    @property
    def draining(self) -> bool:
        """A drain began: no new round starts."""
        ...

    def schedule_after(
        self, state: JobState, after: datetime, *, when: datetime | None = None
    ) -> None:
        """Put ``state``'s job back in the heap at its first instant after ``after``."""
        ...

    def take(self, state: JobState) -> None:
        """Mark ``state``'s job busy (claiming or running): its heap entry is void."""
        ...


class Starter(Protocol):
    """Starts rounds won (the dispatcher's rounds in flight). Dispatcher thread only."""

    def start_round(
        self,
        state: JobState,
        instant: datetime,
        *,
        attempt: int,
        token: int | None,
        claimed_at: float,
        reason: Reason,
    ) -> None:
        """Start the round of ``state``'s job for ``instant`` (``token``: its lease's)."""
        ...

    def start_rounds(
        self,
        rounds: list[tuple[JobState, int | None]],
        instant: datetime,
        *,
        attempt: int,
        claimed_at: float,
        reason: Reason,
    ) -> None:
        """Start the round of each ``(state, token)`` of ``rounds`` for ``instant``."""
        ...

    def start_manual(
        self, state: JobState, request: lease.TriggerRow, *, token: int | None, claimed_at: float
    ) -> None:
        """Start the manual (or backfill) round ``request`` asked for."""
        ...


class Claimer(Protocol):
    """Claims instants for jobs taken off the heap (the dispatcher's claims)."""

    def claim(
        self,
        instant: datetime,
        states: list[JobState],
        *,
        reason: Reason = Reason.SCHEDULE,
    ) -> None:
        """Claim ``instant`` for ``states`` in one statement, then start what was won."""
        ...

    def hold(self, instant: datetime, start: Callable[[], None], drop: Callable[[], None]) -> None:
        """Run ``start`` when ``instant`` comes, or ``drop`` if a drain begins first."""
        ...


class Outage(Protocol):
    """Told how the database answered a claim (recovery's)."""

    def database_lost(self) -> None:
        """A claim found the database unreachable: its instant is owed."""
        ...

    def database_answered(self) -> None:
        """A claim succeeded: an outage pending is over."""
        ...


class Lookup(Protocol):
    """What the failure policies read of the schedules made of data (any thread)."""

    @property
    def beating(self) -> int:
        """How many schedules have a heartbeat their task has not."""
        ...

    def task_of(self, name: str) -> str | None:
        """The task of the schedule ``name``, or ``None`` for a registered job."""
        ...

    def heartbeat_of(self, name: str) -> str | None:
        """The heartbeat URL of the schedule ``name``, or ``None``."""
        ...
