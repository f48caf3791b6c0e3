"""The engine: everything that runs rounds, behind the [Scheduler][cronjob.Scheduler] façade.

Nothing here is public; `cronjob` re-exports [Scheduler][cronjob.Scheduler]. The parts, one
private module each (the package docstring of `cronjob` draws who owns what):

- ``_scheduler``: [Scheduler][cronjob.Scheduler], the façade: it wires the parts and holds the
  lifecycle (start, drain, stop).
- ``_options``: the façade's options, their defaults and checks (the caller's thread).
- ``_dispatcher``: the heap of instants, the rounds in flight (the dispatcher thread);
  ``_claiming``: the claims of an instant, the rest after the grace, the rounds held
  until their instant (the same thread); ``_lead``: how early a claim goes out;
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
- ``_recovery``: reaching the database, catch-up, outages; ``_sweep``: second runs;
  ``_rowcheck``: missing lease rows and the clock; ``_republish``: the outbox's sweep;
  ``_record``: this replica's record; ``_listen``: the database's notices of lease
  writes; ``_backfill``: a backfill's instants, taken with the sweep.
- ``_peers``: the live replicas and each one's share of an instant.
- ``_control``: the inbox and the control thread; ``_state``: the records the parts share;
  ``_pinned``: a claimed round's descriptor, what every path of the round reads.
- ``_database``: engines from URLs; ``_metrics``: the OpenTelemetry instruments.

The engine imports the public face's building blocks (``cronjob._clock``, ``_round``,
``_registry``, ``_schedule``, ``_exceptions``, ``_history``) and [lease][]; it never
imports `cronjob` itself, [cronjob.admin][] or [cronjob.web][].
"""

from __future__ import annotations

from ._scheduler import Scheduler as Scheduler

__all__ = ["Scheduler"]
