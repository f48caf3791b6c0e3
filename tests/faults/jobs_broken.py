"""A job module that fails to import: its registration runs, then the module raises."""

from __future__ import annotations

import cronjob


def _job(ctx: cronjob.Round) -> None:
    pass


cronjob.register(_job, "*/5 * * * * *", "never-runs")
raise RuntimeError("jobs_broken: this module fails on purpose at import")
