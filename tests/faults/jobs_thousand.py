"""1,000 leased jobs in one module, every 5 seconds; each round logs its start and end."""

from __future__ import annotations

import cronjob
from tests.faults.jobs_spec import emit

COUNT = 1000


def _job(ctx: cronjob.Round) -> None:
    emit("start", ctx)
    emit("end", ctx, outcome="done")


for _i in range(COUNT):
    cronjob.register(_job, "*/5 * * * * *", f"bulk-{_i:04d}")
