"""The outbox as ``status`` shows it: occurrences recorded and not yet accepted by their
task system (see ``cronjob.contrib.handoff``), and when an operator should look."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import lease

from ._base import at_ms

__all__ = ["UNSENT_AFTER", "OutboxStatus", "read_outbox"]

#: ``cronjob status`` exits 1 when the oldest unsent occurrence was recorded longer ago
#: than this many seconds (``--unsent-after``): its broker has refused it through many
#: sweeps (every replica retries every 15 s, backing off to a minute).
UNSENT_AFTER: Final = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxStatus:
    """The occurrences handed to a task system and not yet accepted.

    Attributes:
        unsent: How many.
        oldest: When the oldest of them was recorded; ``None`` when there is none.
    """

    unsent: int = 0
    oldest: datetime | None = None

    def overdue(self, now: datetime, *, after: float = UNSENT_AFTER) -> bool:
        """Whether the oldest unsent occurrence was recorded more than ``after``
        seconds before ``now``."""
        return self.oldest is not None and now - self.oldest > timedelta(seconds=after)


def read_outbox(store: lease.LeaseStore) -> OutboxStatus:
    """Count the unsent occurrences in one statement."""
    with store.engine.connect() as conn:
        summary = lease.outbox_summary(conn)
    oldest = None if summary.oldest_ms is None else at_ms(summary.oldest_ms)
    return OutboxStatus(unsent=summary.unsent, oldest=oldest)
