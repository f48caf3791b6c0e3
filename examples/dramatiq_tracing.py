"""A Dramatiq middleware that puts each message's span under the cronjob round that sent it.

cronjob's `send` puts the round's W3C trace context in the message's ``trace_ctx`` option
(`cronjob.contrib.dramatiq.TRACE_OPTION`). `Tracing` extracts it before the actor runs
and starts a consumer span there, current while the actor runs, so the actor's own spans
(and its database calls, if instrumented) join the round's trace.

```python
broker.add_middleware(Tracing())
```
"""

from __future__ import annotations

from typing import Any

import dramatiq
from opentelemetry import context, propagate, trace

from cronjob.contrib.dramatiq import TRACE_OPTION


class Tracing(dramatiq.Middleware):
    """A consumer span per message, child of the context in its ``trace_ctx`` option."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        self.tracer = tracer or trace.get_tracer(__name__)
        self._open: dict[str, tuple[trace.Span, object]] = {}

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        parent = propagate.extract(message.options.get(TRACE_OPTION) or {})
        span = self.tracer.start_span(
            f"dramatiq {message.actor_name}", context=parent, kind=trace.SpanKind.CONSUMER
        )
        span.set_attribute("messaging.message.id", message.message_id)
        token = context.attach(trace.set_span_in_context(span, parent))
        self._open[message.message_id] = (span, token)

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.Message,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        span, token = self._open.pop(message.message_id, (None, None))
        if span is not None:
            context.detach(token)  # type: ignore[arg-type]
            span.end()

    after_skip_message = after_process_message
