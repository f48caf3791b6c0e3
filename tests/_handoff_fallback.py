"""TEST-ONLY FALLBACK, until the outbox branch lands ``cronjob.contrib._handoff.handoff``.

`handoff` here is the least a job function that hands an instant to a publisher must
do: build the occurrence (id, name, instant, the round's trace context) and publish it,
with no outbox, no record and no retry. `install` puts it in place only when the real
one is missing, so once the outbox is merged these tests run against the real one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import propagate

import cronjob
from cronjob.contrib import _handoff
from cronjob.contrib._handoff import Occurrence, Publisher


def handoff(publisher: Publisher) -> Callable[[cronjob.Round], None]:
    def job(ctx: cronjob.Round) -> None:
        headers: dict[str, str] = {}
        propagate.inject(headers)  # the round's span is current here
        publisher.publish(
            Occurrence(id=ctx.occurrence_id, name=ctx.name, instant=ctx.instant, headers=headers)
        )

    job.publisher = publisher  # type: ignore[attr-defined]
    return job


def install() -> None:
    """Give ``cronjob.contrib._handoff`` this `handoff` if it has none of its own."""
    if not hasattr(_handoff, "handoff"):
        _handoff.handoff = handoff  # type: ignore[attr-defined]


def installed() -> Any:
    return _handoff.handoff  # type: ignore[attr-defined]
