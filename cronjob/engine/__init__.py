"""The engine: everything that runs rounds, behind the [Scheduler][cronjob.Scheduler] façade.

Nothing here is public; `cronjob` re-exports [Scheduler][cronjob.Scheduler]. The parts, one
private module each (the package docstring of `cronjob` draws who owns what):

- ``_scheduler``: [Scheduler][cronjob.Scheduler], the façade: it holds the lifecycle
  (start, drain, stop); ``_wiring``: it builds the parts and hands each the narrow
  interfaces it needs, the ports of ``_ports`` (no part imports the part that calls it);
  ``_wings``: the one interface through which the core calls the capabilities beside it
  (``_data``, ``_backfill``, ``_republish``).
- ``_options``: the façade's options, their defaults and checks (the caller's thread).
- ``_dispatcher``: the heap of instants, the drain (the dispatcher thread);
  ``_inflight``: the rounds in flight, started and ended (the same thread);
  ``_claiming``: the claims of an instant, the rest after the grace, the rounds held
  until their instant (the same thread); ``_giveback``: leases won that will not run
  here given back; ``_lead``: how early a claim goes out;
  ``_summary``: its per-instant log line.
- ``_prepare``: a round built, its ``Round`` and ``Run`` (the dispatcher thread);
  ``_runner``: running rounds (a worker thread or the loop); ``_ends``: a round's end
  classified and recorded (the round's thread, the finisher's); ``_workers`` (the round
  threads), ``_loop`` (our own asyncio loop), ``_finisher`` (ends, batched),
  ``_fencing`` (the fenced transactions), ``_tracing`` (a round's span);
  ``_isolated`` and ``_child``: a round in a child process (``isolation="process"``).
- ``_keeper``: renewal, lease loss, the forced exit.
- ``_policies``: the job policies' timers (timeouts, retries' backoffs); ``_failures``:
  the self-pause after failures and the hooks' thread (failure and success hooks, the
  heartbeat pings of ``_heartbeat``).
- ``_overlap``: what follows a round's end (``overlap=``, ``catch_up="all"``) and the
  rounds ``cancel_other`` supersedes (the dispatcher thread).
- ``_recovery``: reaching the database, catch-up, outages, the wings' calls; ``_sweep``:
  second runs (``_reruns``), the requests (``_requests``: run now, resume's catch-up);
  ``_rowcheck``: missing lease rows and the clock; ``_republish``: the outbox's sweep;
  ``_record``: this replica's record; ``_listen``: the database's notices of lease
  writes; ``_data``: the schedules made of data (a wing); ``_backfill``: a backfill's
  instants, taken with the sweep (a wing).
- ``_peers``: the live replicas and each one's share of an instant.
- ``_control``: the inbox and the control thread; ``_state``: the records the parts share;
  ``_pinned``: a claimed round's descriptor, what every path of the round reads.
- ``_database``: engines from URLs; ``_metrics``: the OpenTelemetry instruments.

The engine imports the public face's building blocks (``cronjob._clock``, ``_round``,
``_registry``, ``_schedule``, ``_exceptions``, ``_history``) and [lease][]; it never
imports `cronjob` itself, [cronjob.admin][] or [cronjob.web][].

What the rest of `cronjob` uses of the engine is re-exported here, and only from here
(``tests/test_layout.py`` holds it): the façade and its database helpers (the face,
``cronjob.admin``, ``cronjob.testing``), and what a hand-off publisher shares with the
sweep that sends its rows again (``cronjob.contrib``: `Resent`, `Run`, `OWED_LIMIT`,
`JobMetrics`). Nothing here is public API.
"""

from __future__ import annotations

from ._database import is_async_engine, resolve_database
from ._metrics import JobMetrics
from ._options import DEFAULT_MAX_WORKERS
from ._owed import OWED_LIMIT
from ._republish import Resent
from ._scheduler import Scheduler
from ._state import Run

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "OWED_LIMIT",
    "JobMetrics",
    "Resent",
    "Run",
    "Scheduler",
    "is_async_engine",
    "resolve_database",
]
