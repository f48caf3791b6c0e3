"""The stream's coordination counters, on the meter ``cronjob`` (OpenTelemetry API only).

Each counts occurrences, with the stream's name as ``cronjob.stream``:

- ``cronjob.stream.published``: entries added by the publisher;
- ``cronjob.stream.duplicate``: publishes that found the dedup key (a clean no-op);
- ``cronjob.stream.republished``: publishes of an occurrence sent again from its outbox
  row (a second run, the sweep), whether they added an entry or found the key;
- ``cronjob.stream.obsolete``: entries acknowledged as terminal, their schedule gone;
- ``cronjob.stream.invalid``: entries whose structure, id or instant did not check out;
- ``cronjob.stream.dead_lettered``: entries copied to the dead stream (invalid, or a
  handler out of retries);
- ``cronjob.stream.admitted``: occurrences this worker admitted (pinned a descriptor);
- ``cronjob.stream.reclaimed``: entries taken over by XAUTOCLAIM.
"""

from __future__ import annotations

from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from ..._version import __version__

__all__ = ["COUNTERS", "StreamMeters"]

#: The counters, each ``cronjob.stream.<name>``.
COUNTERS = (
    "published",
    "duplicate",
    "republished",
    "obsolete",
    "invalid",
    "dead_lettered",
    "admitted",
    "reclaimed",
)


class StreamMeters:
    """The counters of one stream, on ``meter_provider`` (``None``: the global one)."""

    def __init__(self, stream: str, meter_provider: MeterProvider | None = None) -> None:
        meter = metrics.get_meter("cronjob", __version__, meter_provider)
        self._attributes = {"cronjob.stream": stream}
        self._counters = {
            name: meter.create_counter(
                f"cronjob.stream.{name}", "{occurrence}", f"Stream occurrences: {name}."
            )
            for name in COUNTERS
        }

    def add(self, name: str, amount: int = 1) -> None:
        """Count ``amount`` occurrences on counter ``name`` (one of `COUNTERS`)."""
        self._counters[name].add(amount, self._attributes)
