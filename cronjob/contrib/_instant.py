"""The scheduled instant as every hand-off writes it: RFC 3339, UTC, ``Z``; a whole
second, but for a manual round, whose instant is the moment it was asked for.

One form for every target (Celery's ``cronjob_instant`` header, Dramatiq's
``cronjob_instant`` option, RQ's ``meta["cronjob"]["instant"]``, a Redis stream's
``scheduled_at``), so a worker reads any of them the same way. Releases before this one
wrote ``+00:00`` for Celery and Dramatiq: `parse_instant` reads both, for the messages
still queued from them.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["format_instant", "parse_instant"]


def format_instant(instant: datetime) -> str:
    """``instant`` as a hand-off writes it: ``2026-03-08T02:00:00Z``.

    A scheduled instant is a whole second. A manual round's instant is the moment it was
    asked for, to the millisecond: its fraction is kept (``2026-03-08T02:00:00.518000Z``,
    still RFC 3339), so its message is sent rather than refused.

    Raises:
        ValueError: ``instant`` is naive.
    """
    if instant.tzinfo is None:
        raise ValueError(f"instant {instant.isoformat()} is naive; give it a zone")
    utc = instant.astimezone(UTC)
    if utc.microsecond:
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_instant(text: str) -> datetime:
    """The aware UTC instant a hand-off's message carries: ``2026-03-08T02:00:00Z``, or
    the ``2026-03-08T02:00:00+00:00`` of earlier releases (any offset is taken).

    Raises:
        ValueError: ``text`` is not such an instant, or has no offset.
    """
    try:
        parsed = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError(f"not an instant: {text!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"instant {text!r} has no offset")
    return parsed.astimezone(UTC)
