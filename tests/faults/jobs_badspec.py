"""A job module whose registration cannot be honoured: a five-field cron spec."""

from __future__ import annotations

import cronjob


def _job(ctx: cronjob.Round) -> None:
    pass


cronjob.register(_job, "*/5 * * * *", "five-fields")
