"""Run ``cronjob`` from another checkout (``$BENCH_BASE``, e.g. a ``git archive`` of the
commit before a change) for ``bench_beat_latency``'s "before" rows: set
``BENCH_CRONJOB_SCRIPT=benchmarks/_base_cronjob.py``. The app module (``-A``) is still
this checkout's: ``cronjob beat`` imports it from the working directory."""

from __future__ import annotations

import os
import sys

base = os.environ["BENCH_BASE"]
sys.path[:0] = [base]
import cronjob  # noqa: E402

assert cronjob.__file__.startswith(base), cronjob.__file__
from cronjob.admin._cli import main  # noqa: E402

sys.argv = ["cronjob", *sys.argv[1:]]
raise SystemExit(main())
