"""An instant's occurrence id: the one name every replica gives the round of a job at an
instant, so that what the round hands on (a message to a worker fleet) carries the same
id however often it is sent."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Final

__all__ = ["OCCURRENCE_NAMESPACE", "occurrence_id"]

#: The UUID5 namespace of occurrence ids. Fixed for good: changing it would give every
#: instant a new id, and a worker's deduplication would run an instant twice.
OCCURRENCE_NAMESPACE: Final = uuid.UUID("a35ed7d8-cdc6-4241-b16b-24fbb283ec04")


def occurrence_id(name: str, instant: datetime) -> str:
    """The occurrence id of the round of job (or schedule) ``name`` at ``instant``.

    A UUID5, in its text form, of ``"<name>@<instant>"`` in `OCCURRENCE_NAMESPACE`, the
    instant written in UTC as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``. It depends on nothing
    else, so every replica, and a round's first run, its second run and its catch-up,
    give the same value; another system can compute it the same way.

    Raises:
        TypeError: ``name`` is not a string or ``instant`` not a datetime.
        ValueError: ``instant`` is naive.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {name!r}")
    if not isinstance(instant, datetime):
        raise TypeError(f"instant must be a datetime, got {instant!r}")
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"instant {instant.isoformat()} is naive; give it a zone")
    stamp = instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return str(uuid.uuid5(OCCURRENCE_NAMESPACE, f"{name}@{stamp}"))
