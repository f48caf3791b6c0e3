"""Handing an instant to a task queue: what every target (Celery, RQ, Dramatiq) shares.

A *publisher* knows one task system and how to put one message on it. `handoff` turns a
publisher into a job function: the round that claims an instant records an *occurrence*
in the outbox (in its fenced transaction), has the publisher send it with the
occurrence id as the message's own id, and marks it sent once the broker accepted it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

__all__ = ["Occurrence", "Publisher"]


@dataclass(frozen=True)
class Occurrence:
    """One instant of one job, as handed to a task system.

    Attributes:
        id: `cronjob.occurrence_id` of (name, instant): the message's own id.
        name: The job's (or data schedule's) name.
        instant: The scheduled instant, an aware UTC datetime.
        headers: The round's W3C trace context (``traceparent``, and ``tracestate``
            when there is one), to be put in the message's headers; empty when no
            trace context is known (a republish by the sweep carries the recorded one).
    """

    id: str
    name: str
    instant: datetime
    headers: Mapping[str, str]


class Publisher(Protocol):
    """What a target must do; the outbox does the rest."""

    @property
    def target(self) -> str:
        """``"celery"``, ``"rq"`` or ``"dramatiq"``."""
        ...

    def describe(self) -> dict[str, Any]:
        """What this publisher sends, as JSON-able data (task name, queue, …), for the
        outbox row, logs and ``status``. Never secrets (no broker URL password)."""
        ...

    def publish(self, occurrence: Occurrence) -> None:
        """Put one message for ``occurrence`` on the broker, with ``occurrence.id`` as
        its id, the instant (ISO 8601 UTC) in it, and ``occurrence.headers`` in its
        headers. Return only once the broker has accepted it (publisher confirms on
        RabbitMQ); raise on any failure. It may be called again with the same
        occurrence (after a failure, a crash, or on another replica)."""
        ...
