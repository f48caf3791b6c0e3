"""Jobs module for ``cronjob run`` in the fleet benchmark: ``$BENCH_JOBS`` jobs of the mix
``$BENCH_MIX`` (see :mod:`benchmarks._mix`), each recording its start
(:mod:`benchmarks.workers._record`), and every statement the replica sends counted by kind
with its parameters' bytes, each claim recorded (:mod:`benchmarks.workers._statements`).

With ``$BENCH_DATA`` set, it registers one task, ``fleet``, instead: the jobs are its
schedules made of data, which the runner added before the start.

Once every job is registered it writes the time to ``$BENCH_OUT.registered`` (the runner
splits start-up into registering and the scheduler's start: ``ensure`` and the first read).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import cronjob
from benchmarks import _mix
from benchmarks.workers import _record, _statements

_recorder = _statements.Recorder()
_recorder.install()
_record.EXTRA["fleet"] = _recorder.report


def _job(ctx: cronjob.Round) -> None:
    _record.started(ctx.name, ctx.instant.timestamp())


if os.environ.get("BENCH_DATA"):
    # The jobs are schedules made of data of this one task, added before the start.
    cronjob.register_task(_job, "fleet")
else:
    for _job_of_mix in _mix.mix(os.environ.get("BENCH_MIX", "realistic"), _record.JOBS):
        cronjob.register(_job, _job_of_mix.spec, _job_of_mix.name)

if _record.OUT:
    Path(_record.OUT + ".registered").write_text(f"{time.time()}\n")
