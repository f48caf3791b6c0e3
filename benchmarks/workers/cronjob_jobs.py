"""Jobs module for ``cronjob run``: ``$BENCH_JOBS`` jobs on ``$BENCH_SPEC``, each recording
its start (see :mod:`benchmarks.workers._record`)."""

from __future__ import annotations

import cronjob
from benchmarks.workers import _record


def _job(ctx: cronjob.Round) -> None:
    _record.started(ctx.name, ctx.instant.timestamp())
    _record.work()


for _name in _record.job_names():
    cronjob.register(_job, _record.SPEC, _name)
