"""The operator's side of cronjob: what an operator reads, changes and runs.

Everything a person (or a script) uses to look at and steer the replicas: what the
scheduler did ([status][cronjob.admin.status], a job's recent rounds in
[history][cronjob.admin.history]), the pause ([pause][cronjob.admin.pause],
[resume][cronjob.admin.resume]), a round now ([trigger][cronjob.admin.trigger],
[wait][cronjob.admin.wait]), past instants run again ([backfill][cronjob.admin.backfill]),
a retired job's record deleted ([forget][cronjob.admin.forget]), missed instants
acknowledged ([acknowledge][cronjob.admin.acknowledge]). Each takes a schedule
made of data (see [cronjob.schedules][]) by its id as it takes a job by its name. The
`cronjob` command is built on these functions, and the status page ([cronjob.web][]) reads
what they read.

The admin API needs no application module and starts no scheduler: it reads and writes
the tables the replicas share. Importing this package does no I/O.
"""

# The layout. This package (public) is the admin API: _status reads what the scheduler
# did (status), _rounds a job's recent rounds (history); _control writes the pause (pause,
# resume); _trigger requests a round now (trigger, wait); _forget deletes a retired job's
# record (forget); _missed counts the missed instants of the last day and _ack
# acknowledges them (acknowledge); _job is a job as status reads it back; _scheduled
# reads the schedules made of data that they all take by id; _base holds what they share
# (the database, the schema check, the errors). _cli: the cronjob command (console script
# cronjob.admin._cli:main, python -m cronjob); _run: cronjob run; _read_cli: status and
# history; _schedules_cli: schedules; _control_cli: pause, resume, trigger, forget;
# _ack_cli: missed; _format: the cells the tables and the page share. _web: the status
# page as a WSGI or ASGI app (public as cronjob.web); _page renders its HTML. The engine
# that runs rounds is cronjob.engine.

from __future__ import annotations

from lease import REQUEST_TTL as REQUEST_TTL

from .._records import FAILED_OUTCOMES as FAILED_OUTCOMES
from .._records import Outcome as Outcome
from .._records import RoundRecord as RoundRecord
from .._records import Why as Why
from ._ack import acknowledge as acknowledge
from ._backfill import BACKFILL_LIMIT as BACKFILL_LIMIT
from ._backfill import Backfill as Backfill
from ._backfill import BackfillCancelled as BackfillCancelled
from ._backfill import BackfillTooLarge as BackfillTooLarge
from ._backfill import backfill as backfill
from ._backfill import cancel_backfill as cancel_backfill
from ._base import REPLICA_LIVE_SECONDS as REPLICA_LIVE_SECONDS
from ._base import SchemaNewer as SchemaNewer
from ._base import SchemaOutdated as SchemaOutdated
from ._base import StatusError as StatusError
from ._base import TablesMissing as TablesMissing
from ._base import UnknownJob as UnknownJob
from ._control import REASON_LENGTH as REASON_LENGTH
from ._control import PauseChange as PauseChange
from ._control import pause as pause
from ._control import pause_all as pause_all
from ._control import resume as resume
from ._control import resume_all as resume_all
from ._forget import ForgetRefused as ForgetRefused
from ._forget import Forgotten as Forgotten
from ._forget import forget as forget
from ._job import Acknowledgement as Acknowledgement
from ._job import Activity as Activity
from ._job import JobStatus as JobStatus
from ._outbox import UNSENT_AFTER as UNSENT_AFTER
from ._outbox import OutboxStatus as OutboxStatus
from ._rounds import HISTORY_LIMIT as HISTORY_LIMIT
from ._rounds import history as history
from ._status import STALE_SLACK_SECONDS as STALE_SLACK_SECONDS
from ._status import ReplicaStatus as ReplicaStatus
from ._status import Status as Status
from ._status import status as status
from ._trigger import Refusal as Refusal
from ._trigger import RequestState as RequestState
from ._trigger import RequestStatus as RequestStatus
from ._trigger import TriggerRefused as TriggerRefused
from ._trigger import TriggerRequest as TriggerRequest
from ._trigger import request_status as request_status
from ._trigger import requests as requests
from ._trigger import trigger as trigger
from ._trigger import wait as wait

__all__ = [
    "FAILED_OUTCOMES",
    "Acknowledgement",
    "Activity",
    "Backfill",
    "BackfillCancelled",
    "BackfillTooLarge",
    "ForgetRefused",
    "Forgotten",
    "JobStatus",
    "OutboxStatus",
    "Outcome",
    "PauseChange",
    "Refusal",
    "ReplicaStatus",
    "RequestState",
    "RequestStatus",
    "RoundRecord",
    "SchemaNewer",
    "SchemaOutdated",
    "Status",
    "StatusError",
    "TablesMissing",
    "TriggerRefused",
    "TriggerRequest",
    "UNSENT_AFTER",
    "UnknownJob",
    "Why",
    "acknowledge",
    "backfill",
    "cancel_backfill",
    "forget",
    "history",
    "pause",
    "pause_all",
    "requests",
    "resume",
    "resume_all",
    "status",
    "trigger",
    "wait",
]

# Public objects name the public module (cronjob.admin.PauseChange, not admin._control).
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(("cronjob.admin._", "cronjob._")):
        _obj.__module__ = __name__
del _name, _obj
