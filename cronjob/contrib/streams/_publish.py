"""The publishing side: each instant added to a Redis Stream once, through the outbox.

`publish` returns a ``cronjob.contrib.Handoff`` (the outbox, its retries and its
sweep, as for Celery, RQ and Dramatiq) whose publisher runs `PUBLISH_IF_NEW`: one Lua
script that, in one step, finds the dedup key ``cronjob:occurrence:<occurrence_id>`` or
else adds the entry (``XADD ... MAXLEN ~``) and sets the key for `DEDUP_TTL` seconds.
A send that finds the key (a retry after an ambiguous answer, a republish after a
replica was killed between the send and the mark) is a clean duplicate: resolved as
sent, with no second entry. The key is never deleted on completion: it is history.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final

import redis
from opentelemetry.metrics import MeterProvider

from ..._exceptions import RegistrationError
from .._handoff import Handoff, Occurrence
from .._instant import format_instant
from .._validation import SCHEDULED, SOURCE
from ._metrics import StreamMeters

__all__ = [
    "DEDUP_PREFIX",
    "DEDUP_TTL",
    "MAXLEN",
    "PUBLISH_IF_NEW",
    "StreamPublisher",
    "connect",
    "entry_fields",
    "publish",
]

log = logging.getLogger("cronjob")

#: The dedup key of an occurrence is this prefix and its id.
DEDUP_PREFIX: Final = "cronjob:occurrence:"
#: Seconds a dedup key lives: a week, longer than any republish or catch-up.
DEDUP_TTL: Final = 7 * 24 * 3600
#: The stream's approximate length cap by default (``XADD ... MAXLEN ~``).
MAXLEN: Final = 100_000
#: Seconds a Redis call waits before it fails, for a client made from a URL.
SOCKET_TIMEOUT: Final = 10.0

#: KEYS: the dedup key, the stream. ARGV: the key's TTL, MAXLEN, then field, value...
#: Returns the new entry's id, or false when the key was found (a duplicate). The key is
#: set after the XADD: an XADD that fails (the key names no stream) leaves no key.
PUBLISH_IF_NEW: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[1], id, 'EX', ARGV[1])
return id
"""


def connect(client_or_url: redis.Redis | str) -> redis.Redis:
    """A Redis client: ``client_or_url`` as given, or one made from its URL (with a
    `SOCKET_TIMEOUT`).

    Raises:
        RegistrationError: it is neither a ``redis.Redis`` nor a ``redis://`` URL.
    """
    if isinstance(client_or_url, redis.Redis):
        return client_or_url
    if isinstance(client_or_url, str) and client_or_url.startswith(
        ("redis://", "rediss://", "unix://")
    ):
        return redis.Redis.from_url(
            client_or_url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )
    raise RegistrationError(
        f"streams: expected a redis.Redis or a redis:// URL, got {client_or_url!r}"
    )


def entry_fields(occurrence: Occurrence, args: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The fields of ``occurrence``'s entry: ``source``, ``app``, ``schedule``,
    ``occurrence_id``, ``scheduled_at`` (RFC 3339 UTC, whole second, ``Z``; a manual
    round's keeps its fraction, see `cronjob.contrib.format_instant`), ``args``
    (JSON: ``args`` and the occurrence's own, which win), ``traceparent`` when the
    round has one, and ``trigger`` when the round was not a scheduled one (``manual``,
    ``backfill``).

    Raises:
        ValueError: the instant is naive.
    """
    merged = {**(args or {}), **json.loads(occurrence.args)}
    fields = {
        "source": SOURCE,
        "app": occurrence.app,
        "schedule": occurrence.name,
        "occurrence_id": occurrence.id,
        "scheduled_at": format_instant(occurrence.instant),
        "args": json.dumps(merged, separators=(",", ":"), sort_keys=True),
    }
    traceparent = occurrence.headers.get("traceparent")
    if traceparent:
        fields["traceparent"] = traceparent
    if occurrence.trigger != SCHEDULED:
        fields["trigger"] = occurrence.trigger
    return fields


class StreamPublisher:
    """Adds one entry per occurrence to ``stream``, if new (see `publish`)."""

    target = "stream"

    def __init__(
        self,
        client: redis.Redis | str,
        *,
        stream: str,
        maxlen: int = MAXLEN,
        args: Mapping[str, Any] | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        if not isinstance(stream, str) or not stream:
            raise RegistrationError(f"streams: stream must be a non-empty string, got {stream!r}")
        if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1:
            raise RegistrationError(f"streams: maxlen must be a whole number >= 1, got {maxlen!r}")
        try:
            self.args = dict(json.loads(json.dumps(dict(args or {}))))
        except (TypeError, ValueError):
            raise RegistrationError(f"streams: args must be JSON-able, got {args!r}") from None
        self.client = connect(client)
        self.stream = stream
        self.maxlen = maxlen
        self.meters = StreamMeters(stream, meter_provider)
        self._script = self.client.register_script(PUBLISH_IF_NEW)

    def describe(self) -> dict[str, Any]:
        """The stream and its cap (no connection details)."""
        return {"stream": self.stream, "maxlen": self.maxlen}

    def publish_if_new(self, occurrence: Occurrence) -> str | None:
        """Add ``occurrence``'s entry unless its dedup key exists; the new entry's id, or
        ``None`` for a clean duplicate. Counts ``published``/``duplicate`` (and
        ``republished`` for an occurrence sent again from its outbox row).

        Raises:
            redis.RedisError: Redis could not be reached, or refused the script.
        """
        fields = entry_fields(occurrence, self.args)
        argv: list[str | int] = [DEDUP_TTL, self.maxlen]
        for key, value in fields.items():
            argv += [key, value]
        found = self._script(keys=[DEDUP_PREFIX + occurrence.id, self.stream], args=argv)
        if occurrence.again:
            self.meters.add("republished")
        if found is None:
            self.meters.add("duplicate")
            log.info("occurrence %s: on stream %r already; not added", occurrence.id, self.stream)
            return None
        self.meters.add("published")
        return found.decode() if isinstance(found, bytes) else str(found)

    def publish(self, occurrence: Occurrence) -> None:
        """Publish ``occurrence`` if new; a duplicate is resolved as sent.

        Raises:
            redis.RedisError: Redis could not be reached, or refused the script.
        """
        self.publish_if_new(occurrence)


def publish(
    redis_client_or_url: redis.Redis | str,
    *,
    stream: str,
    maxlen: int = MAXLEN,
    args: Mapping[str, Any] | None = None,
    retry_within: float | None = None,
    hold: float | None = None,
    send_timeout: float | None = None,
    meter_provider: MeterProvider | None = None,
) -> Handoff:
    """A job function that adds one entry per instant to a Redis Stream, if new.

    Register it as any job (``cronjob.register(streams.publish(url, stream="jobs"),
    "0 0 3 * * *", "nightly")``) or as a task's function. The round records the
    occurrence in the outbox and publishes it through `PUBLISH_IF_NEW`; the outbox's
    retries and sweep apply unchanged (see ``cronjob.contrib.handoff``).

    Args:
        redis_client_or_url: A ``redis.Redis`` or a ``redis://`` URL.
        stream: The stream's key.
        maxlen: The stream's approximate length cap (``XADD ... MAXLEN ~``).
        args: Arguments every entry carries in ``args`` (a data schedule's own win).
        retry_within: As for ``cronjob.contrib.handoff``; ``None``: derived from the period.
        hold: As for ``cronjob.contrib.handoff``; ``None``: derived.
        send_timeout: As for ``cronjob.contrib.handoff``; ``None``: derived.
        meter_provider: Where the counters go; ``None``: OpenTelemetry's global provider.

    Raises:
        RegistrationError: the client, stream, cap or args are not valid, or an option
            of the hand-off is out of range.
    """
    publisher = StreamPublisher(
        redis_client_or_url, stream=stream, maxlen=maxlen, args=args, meter_provider=meter_provider
    )
    return Handoff(publisher, retry_within=retry_within, hold=hold, send_timeout=send_timeout)
