"""A small application's jobs: run it with ``cronjob run examples.app``.

- ``report``: every 10 s, once across all replicas, in a transaction fenced by its lease.
- ``refresh-cache``: every 5 s on every replica (per-instance: no lease).
- ``long-export``: every 15 s, takes 20 s, so it overruns its next instant (skipped and
  put on record); it stops early when the replica drains.
"""

from __future__ import annotations

import logging

from sqlalchemy import text

import cronjob

log = logging.getLogger("examples.app")

_cache: dict[str, str] = {}


def report(ctx: cronjob.Round) -> None:
    """Count the leased jobs on record, inside a transaction that holds only while our lease
    does."""
    with ctx.transaction() as conn:
        # Rows whose name starts with a space are cronjob's own chores (history pruning),
        # not jobs of this application: a job's name never starts with whitespace.
        rows = conn.execute(
            text("SELECT count(*) FROM cronjob_lease WHERE name NOT LIKE ' %'")
        ).scalar_one()
    log.info("report for %s: %d job(s) on record", ctx.instant.isoformat(), rows)


def refresh_cache(ctx: cronjob.Round) -> None:
    """Refresh this process's own cache: every replica runs this."""
    _cache["refreshed"] = ctx.instant.isoformat()
    log.info("cache of %s refreshed", ctx.replica)


def long_export(ctx: cronjob.Round) -> None:
    """Work for 20 s in steps, stopping (cut short, re-run elsewhere) if cancelled."""
    for step in range(4):
        if ctx.wait(5):
            log.info("export interrupted after %d of 4 steps", step)
            ctx.check()
    log.info("export of %s done", ctx.instant.isoformat())


cronjob.register(report, "*/10 * * * * *", "report")
cronjob.register_per_instance(refresh_cache, "*/5 * * * * *", "refresh-cache")
cronjob.register(long_export, "*/15 * * * * *", "long-export")
