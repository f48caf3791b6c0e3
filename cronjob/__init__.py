"""Run the jobs an application registers at import time on cron schedules, once per
scheduled instant across every replica, coordinated through a lease table in the
application's own SQL database.

Layout: the public face at the top, one private module per concern, and two wings
(docs/architecture.md draws the map; tests/test_layout.py holds it to account):

- ``_grammar``: the spec's grammar (cron fields, descriptors, ``@every``, ``CRON_TZ=``),
  read into value sets; ``_schedule``: [parse][cronjob.parse] and
  [Schedule][cronjob.Schedule], which walk them to instants (the DST rule), over
  ``_calendar``'s integer calendar arithmetic.
- ``_registry``: [register][cronjob.register],
  [register_per_instance][cronjob.register_per_instance], their decorator forms
  [job][cronjob.job] and [job_per_instance][cronjob.job_per_instance],
  [Registry][cronjob.Registry]; ``_policy``: [Policy][cronjob.Policy], a job's timeout,
  retries, start deadline, self-pause and failure hook, validated at registration.
- ``_registry`` also holds the tasks ([task][cronjob.task]), whose schedules are data:
  [cronjob.schedules][] adds them in the application's transaction; ``_bounds``: their
  start/end windows and one-off instants.
- ``_round``: [Round][cronjob.Round], what a job receives, and how its outcome is classified;
  ``_records``: a round's record in the history, as the admin API and the hooks give it.
- ``_clock`` / ``_fakeclock``: time, real and fake (see [cronjob.testing][]);
  ``_exceptions``; ``_history``: [History][cronjob.History], the history's retention and pruning;
  ``_lifespan``: [lifespan][cronjob.lifespan] for ASGI apps.
- `cronjob.engine`: what runs rounds — [Scheduler][cronjob.Scheduler] (the façade that wires the
  parts and holds the lifecycle), the dispatcher, keeper, runner, workers, finisher,
  sweep, recovery, peers, the job policies' timers and hooks (its docstring lists them).
- [cronjob.admin][] (public): the operator's side — what the scheduler did, read from
  the database, and what an operator writes (pause, resume, trigger); the ``cronjob``
  command; the status page (public as [cronjob.web][]).
- ``contrib``: Django and Flask, each behind an extra; ``pytest_plugin``: the fixtures
  (entry point ``pytest11``). Importing ``cronjob`` imports neither.

Threads, and who may touch what::

    any thread ──post(message)──▶ inbox ──▶ DISPATCHER thread ◀── owns: job states, heap
                                              │  │      ▲          of instants, rounds in
                                   statements │  │      │          flight, lease deadlines,
                                              ▼  │      │          sweep/retry timers
                                   CONTROL thread│      │ done(result) via the inbox
                                   (claim, renew,│      │
                                    sweep, ...) ─┼──────┘
                                                 │ start round
                                                 ▼
                               ROUND workers (sync) / asyncio loop (async)
                               run the job; give back a lease cut short ──▶ end posted
                               FINISHER thread: ends of rounds, batched ──▶ to the inbox

One thread, the dispatcher, owns the scheduling state: only it and the parts it calls
(claims, keeper, recovery, the runner's ``prepare``/``submit``/``cancel``) read or change it.
Every other thread talks to it by posting a message to the inbox. The dispatcher never
waits on the database, so a slow statement cannot delay a lease deadline. A round's
worker reads its own round and sets its ``ended`` flag; the façade sets the life flags
(``stopped``, ``crashed``) that every part reads.

Importing this package does no I/O and starts nothing.
"""

from __future__ import annotations

from . import schedules as schedules
from ._clock import Clock as Clock
from ._clock import SystemClock as SystemClock
from ._exceptions import Cancelled as Cancelled
from ._exceptions import CronjobError as CronjobError
from ._exceptions import LeaseLost as LeaseLost
from ._exceptions import RegistrationError as RegistrationError
from ._exceptions import Retry as Retry
from ._exceptions import ScheduleError as ScheduleError
from ._exceptions import Shutdown as Shutdown
from ._exceptions import Superseded as Superseded
from ._exceptions import TimedOut as TimedOut
from ._history import History as History
from ._lifespan import lifespan as lifespan
from ._occurrence import occurrence_id as occurrence_id
from ._policy import Policy as Policy
from ._registry import Job as Job
from ._registry import Registry as Registry
from ._registry import Task as Task
from ._registry import default_registry as default_registry
from ._registry import job as job
from ._registry import job_per_instance as job_per_instance
from ._registry import register as register
from ._registry import register_per_instance as register_per_instance
from ._registry import register_task as register_task
from ._registry import task as task
from ._round import Outcome as Outcome
from ._round import Round as Round
from ._round import Trigger as Trigger
from ._schedule import Schedule as Schedule
from ._schedule import parse as parse
from ._version import __version__ as __version__
from .engine import Scheduler as Scheduler

__all__ = [
    "Cancelled",
    "Clock",
    "CronjobError",
    "History",
    "Job",
    "LeaseLost",
    "Outcome",
    "Policy",
    "RegistrationError",
    "Retry",
    "Round",
    "Schedule",
    "ScheduleError",
    "Scheduler",
    "Shutdown",
    "Superseded",
    "SystemClock",
    "Task",
    "TimedOut",
    "Trigger",
    "default_registry",
    "job",
    "job_per_instance",
    "lifespan",
    "occurrence_id",
    "parse",
    "register",
    "register_per_instance",
    "register_task",
    "schedules",
    "task",
]

# Public objects name the public module, so reprs and docs never show `_x`.
for _name in __all__:
    _obj = globals()[_name]
    if _name == "schedules":
        continue
    if getattr(_obj, "__module__", "").startswith(("cronjob._", "cronjob.engine.")):
        _obj.__module__ = __name__
del _name, _obj
