"""The worker side of the Dramatiq tests: ``dramatiq tests.dramatiq_worker --queues Q``.

Read from the environment (tests/test_dramatiq.py sets it):

- ``DRAMATIQ_TEST_BROKER``: ``rabbitmq`` or ``redis``; ``DRAMATIQ_TEST_URL``: its URL;
- ``DRAMATIQ_TEST_QUEUE``: the queue of this test's actors;
- ``DRAMATIQ_TEST_LOG``: each message the actor ``cronjob_test_record`` (or the ``once``
  actor ``cronjob_test_once``) gets appends a JSON line here: its message id, actor,
  args, kwargs and options, and (for ``once``) whether its body ran;
  then a line ``{"processed": id, "result": ..., "failed": ..., "error": ...}`` once it is
  done with it;
- ``DRAMATIQ_TEST_SPANS``: the worker's spans, one JSON object a line;
- ``DRAMATIQ_TEST_DATABASE``: the lease database of the ``once`` actors;
- ``DRAMATIQ_TEST_STALE_AFTER``: the stale time of ``cronjob_test_once_killed``
  (tests/faults), a ``once`` actor whose first run sleeps until the test kills it;
- ``DRAMATIQ_TEST_FAIL_FIRST``: a file; the ``once`` actor's body, given ``fail_first=True``,
  raises on its first run (when the file does not exist yet, which it then creates).

The broker has the `CurrentMessage` middleware, and the documented example's OpenTelemetry
middleware (examples/dramatiq_tracing.py): it extracts the trace context from the
message's ``trace_ctx`` option and records a consumer span around the actor, here with
the SDK, to the spans file.
"""

from __future__ import annotations

import json
import os
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import cronjob
from cronjob.contrib.dramatiq import once
from examples.dramatiq_tracing import Tracing as DocumentedTracing
from tests import _killed_body as killed

QUEUE = os.environ["DRAMATIQ_TEST_QUEUE"]
LOG = os.environ["DRAMATIQ_TEST_LOG"]

_spans = open(os.environ["DRAMATIQ_TEST_SPANS"], "a", encoding="utf-8")  # noqa: SIM115
provider = TracerProvider()
provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(out=_spans, formatter=lambda span: span.to_json(indent=None) + "\n")
    )
)
tracer = provider.get_tracer("tests.dramatiq_worker")


class Tracing(DocumentedTracing):
    """The documented example's middleware (examples/dramatiq_tracing.py), so a test runs
    it, and a line in the log once each message is done with."""

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.Message,
        *,
        result: object = None,
        exception: BaseException | None = None,
    ) -> None:
        super().after_process_message(broker, message, result=result, exception=exception)
        _log(
            {
                "processed": message.message_id,
                "result": result,
                "failed": exception is not None,
                "error": None if exception is None else repr(exception),
            }
        )

    after_skip_message = after_process_message


def _broker() -> dramatiq.Broker:
    url = os.environ["DRAMATIQ_TEST_URL"]
    if os.environ["DRAMATIQ_TEST_BROKER"] == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url)
    from dramatiq.brokers.redis import RedisBroker

    return RedisBroker(url=url)


def _published(ctx: cronjob.Round) -> None:
    """What the replicas run (they hand the instant over); the worker reads its name."""


# The jobs the replicas register, as the worker's own code would import them: ``once``
# runs a message only while something names its schedule (else it is obsolete).
cronjob.register(_published, "0 0 * * * *", "nightly-export")
cronjob.register(_published, "* * * * * *", killed.ONCE_KILLED)  # tests/faults

broker = _broker()
broker.add_middleware(CurrentMessage())
broker.add_middleware(Tracing(tracer))
dramatiq.set_broker(broker)


def _log(line: dict[str, Any]) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def _seen(**extra: Any) -> dict[str, Any]:
    message = CurrentMessage.get_current_message()
    assert message is not None
    span = trace.get_current_span().get_span_context()
    return {
        "message_id": message.message_id,
        "actor": message.actor_name,
        "args": list(message.args),
        "kwargs": message.kwargs,
        "options": {k: v for k, v in message.options.items() if k != "redis_message_id"},
        "trace_id": f"{span.trace_id:032x}",
        **extra,
    }


@dramatiq.actor(actor_name="cronjob_test_record", queue_name=QUEUE, max_retries=0)
def record(*args: Any, **kwargs: Any) -> None:
    _log(_seen())


# A retry after 10-100 ms, so a test of a body that raised waits for its second run.
@dramatiq.actor(
    actor_name="cronjob_test_once", queue_name=QUEUE, max_retries=1, min_backoff=10, max_backoff=100
)
@once(database=os.environ.get("DRAMATIQ_TEST_DATABASE"))
def record_once(*args: Any, fail_first: bool = False, **kwargs: Any) -> str:
    _log(_seen(ran=True))
    marker = os.environ.get("DRAMATIQ_TEST_FAIL_FIRST", "")
    if fail_first and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("the first run fails")
    return "done"


@once(
    database=os.environ.get("DRAMATIQ_TEST_DATABASE"),
    stale_after=float(os.environ.get("DRAMATIQ_TEST_STALE_AFTER") or 3600),
)
def _killed_body(message_id: str, marker: str) -> str:
    return killed.body(_log, message_id, marker)


# A delivery that finds the body running elsewhere is retried after about 1 s.
@dramatiq.actor(
    actor_name="cronjob_test_once_killed",
    queue_name=QUEUE,
    max_retries=120,
    min_backoff=1000,
    max_backoff=1000,
)
def once_killed(marker: str) -> None:
    message = CurrentMessage.get_current_message()
    assert message is not None
    killed.deliver(_log, message.message_id, lambda: _killed_body(message.message_id, marker))
