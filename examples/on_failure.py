"""Being told when a job fails: a failure hook, and a job that pauses itself.

Run it with ``cronjob run examples.on_failure`` and watch the "page" printed every
30 s; after three failed rounds in a row ``import-prices`` pauses itself on every
replica (``cronjob status`` shows it paused by ``cronjob``, with the last error) until
someone runs ``cronjob resume import-prices``.

A hook is called once per round that failed, timed out or missed its start deadline,
with the round's record (`cronjob.admin.RoundRecord`: job, instant, attempt,
replica, outcome, error, trace id), on a thread of its own: it may block on the network
without holding up any round. What it raises is logged, never fatal. Keep it short:
the scheduler waits for the hooks queued at most 5 s when it stops.

To send the failures to Sentry instead (``pip install sentry-sdk``; nothing here
depends on it)::

    import sentry_sdk

    def to_sentry(record: admin.RoundRecord) -> None:
        with sentry_sdk.new_scope() as scope:
            scope.set_tag("cronjob.job", record.job)
            scope.set_tag("cronjob.outcome", str(record.outcome))
            scope.set_context("round", {
                "instant": record.instant.isoformat(),
                "attempt": record.attempt,
                "replica": record.replica,
                "trace_id": record.trace_id,
            })
            sentry_sdk.capture_message(
                f"cron job {record.job} {record.outcome}: {record.error}", level="error"
            )

    registry = cronjob.Registry(on_failure=to_sentry)   # every job of the registry
"""

from __future__ import annotations

import itertools
import threading

import cronjob
from cronjob import admin

_calls = itertools.count(1)


def page_on_call(record: admin.RoundRecord) -> None:
    """Page whoever is on call (here: a print; in production a pager's API or a chat)."""
    print(
        f"PAGE: cron job {record.job!r} {record.outcome} at {record.instant:%H:%M:%S} UTC "
        f"(attempt {record.attempt}, on {record.replica}): {record.error}",
        flush=True,
    )


@cronjob.job(
    "*/30 * * * * *", name="import-prices", on_failure=page_on_call, pause_after_failures=3
)
def import_prices(ctx: cronjob.Round) -> None:
    """Fails every time: the upstream is "down"."""
    raise ConnectionError(f"prices.example.com refused the connection (call {next(_calls)})")


def main(database: str) -> None:
    """The same with a registry of its own, whose hook serves every job without one:
    ``Scheduler(database, registry=...)`` as an application embeds it."""
    registry = cronjob.Registry(on_failure=page_on_call)
    registry.register(import_prices, "*/30 * * * * *", "import-prices", pause_after_failures=3)
    with cronjob.Scheduler(database, registry=registry) as scheduler:
        print(f"{scheduler.replica_id} runs import-prices; Ctrl-C stops it", flush=True)
        threading.Event().wait()
