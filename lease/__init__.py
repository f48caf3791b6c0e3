"""Leases in the application's own SQL database, on the database's clock.

A lease is a named row that one holder at a time claims for an *instant*, renews while it
works, and gives back or finishes; a fencing token, new on every claim, makes a former
holder's late writes do nothing. The package knows names, instants, holders, tokens and
outcomes — nothing about what the holder runs.

```python
engine = lease.create_engine("postgresql+psycopg://app@db/app")
lease.migrate(engine)
store = lease.LeaseStore(engine)
store.ensure(["nightly-report"])
for claim in store.claim(["nightly-report"], instant, holder="replica-1"):
    ...
    store.finish(claim.name, claim.token, ended=end)
```
"""

# The layout: one private module per concern, re-exported here.
#   _exceptions  the LeaseError tree and the one place SQLAlchemy errors are translated
#   _schema      the MetaData: the lease, round-history and replica tables
#   _records     ends, history rows and replica records: their values and statements
#   _text        which names and holders every database can store
#   _store       LeaseStore: the façade, the lease rules, the rows; its parts: _claims
#                (claims, second runs, renewals), _ends (finish, give back, keep from a
#                rerun), _history (history, replicas, prune, survey), _pause, _notes
#                (skipped and acknowledged instants), _restore
#                (a row gone under its round written back), _core
#                (plumbing, the fence check), _fence (the fence check of many holders,
#                locking), _rows (values), _dialect
#   _schedules   schedules made of data: their rows and change counter
#   _schedule_leases  their lease rows, and when each one's timing was committed
#   _admission   the descriptors a stream worker pinned at admission; a name's definition
#   _outbox      publications handed to another system (retried, marked sent) and bodies
#                run once per id; _outbox_record puts them on record, one or many at once
#   _trigger     Triggers: requests for a round now (run-now) and catch-ups on resume
#   _backfill    Backfills: past instants run again under the lease, one at a time
#   _tally       Tally: the history's and the outbox's instants of the last day, for the
#                missed count
#   _engine      engines suited to leases (SQLite's single connection), their async
#                counterparts and driver swaps, URL redaction
#   _migrate     alembic migrations to head, under a lock
# The migrations themselves live in the repository's top-level alembic/ directory and
# ship in the wheel as lease/_migrations.

from __future__ import annotations

from ._admission import Admission as Admission
from ._admission import Definition as Definition
from ._admission import admit as admit
from ._admission import count_failure as count_failure
from ._admission import definition as definition
from ._admission import once_state as once_state
from ._admission import read_admission as read_admission
from ._backfill import BackfillCancellation as BackfillCancellation
from ._backfill import Backfills as Backfills
from ._engine import async_url as async_url
from ._engine import behind_transaction_pooler as behind_transaction_pooler
from ._engine import create_async_engine as create_async_engine
from ._engine import create_engine as create_engine
from ._engine import is_async_url as is_async_url
from ._engine import redact as redact
from ._engine import sync_url as sync_url
from ._exceptions import DatabaseError as DatabaseError
from ._exceptions import DatabaseRefused as DatabaseRefused
from ._exceptions import DatabaseUnavailable as DatabaseUnavailable
from ._exceptions import LeaseError as LeaseError
from ._exceptions import MigrationFailed as MigrationFailed
from ._exceptions import MigrationRequired as MigrationRequired
from ._exceptions import UnsupportedDatabase as UnsupportedDatabase
from ._migrate import current_revision as current_revision
from ._migrate import head_revision as head_revision
from ._migrate import migrate as migrate
from ._notes import ACK_NOTE as ACK_NOTE
from ._notes import SKIP_NOTE as SKIP_NOTE
from ._once import ONCE_DONE as ONCE_DONE
from ._once import ONCE_RUNNING as ONCE_RUNNING
from ._once import begin_once as begin_once
from ._once import finish_once as finish_once
from ._once import release_once as release_once
from ._outbox import OutboxRow as OutboxRow
from ._outbox import OutboxSummary as OutboxSummary
from ._outbox import claim_publication as claim_publication
from ._outbox import defer_publications as defer_publications
from ._outbox import due_publications as due_publications
from ._outbox import held_publications as held_publications
from ._outbox import mark_published as mark_published
from ._outbox import mark_published_many as mark_published_many
from ._outbox import next_publication_ms as next_publication_ms
from ._outbox import orphaned_publications as orphaned_publications
from ._outbox import outbox_summary as outbox_summary
from ._outbox import prune_outbox as prune_outbox
from ._outbox import resolve_obsolete as resolve_obsolete
from ._outbox_record import Publication as Publication
from ._outbox_record import record_publication as record_publication
from ._outbox_record import record_publications as record_publications
from ._pause import paused_names as paused_names
from ._pause import set_paused_on as set_paused_on
from ._records import COUNTED_FAILURES as COUNTED_FAILURES
from ._records import DEFAULT_HISTORY_DAYS as DEFAULT_HISTORY_DAYS
from ._records import DEFAULT_HISTORY_PER_NAME as DEFAULT_HISTORY_PER_NAME
from ._records import Ending as Ending
from ._records import ReplicaRow as ReplicaRow
from ._records import RoundRow as RoundRow
from ._restore import CutRound as CutRound
from ._revived import forgo_former_rounds as forgo_former_rounds
from ._schedule_leases import leased_names as leased_names
from ._schedule_leases import redeploy_schedule_leases as redeploy_schedule_leases
from ._schedule_leases import schedule_lease_rows as schedule_lease_rows
from ._schedules import POLICIES_FORMAT as POLICIES_FORMAT
from ._schedules import SCHEDULE_FORMAT as SCHEDULE_FORMAT
from ._schedules import ScheduleRow as ScheduleRow
from ._schedules import bump_schedule_rev as bump_schedule_rev
from ._schedules import insert_schedules as insert_schedules
from ._schedules import prune_schedules as prune_schedules
from ._schedules import read_schedule_rev as read_schedule_rev
from ._schedules import read_schedules as read_schedules
from ._schedules import remove_schedule as remove_schedule
from ._schedules import replace_schedules as replace_schedules
from ._schedules import schedule_changes as schedule_changes
from ._schedules import schedule_values as schedule_values
from ._schedules import taken_schedule_ids as taken_schedule_ids
from ._schedules import tell_on_commit as tell_on_commit
from ._schedules import tell_schedules_changed as tell_schedules_changed
from ._schedules import update_schedule as update_schedule
from ._schema import REASON_LENGTH as REASON_LENGTH
from ._schema import TABLE_NAME as TABLE_NAME
from ._schema import VERSION_TABLE as VERSION_TABLE
from ._schema import metadata as metadata
from ._store import CLAIM_AHEAD_LIMIT as CLAIM_AHEAD_LIMIT
from ._store import DEFAULT_STATEMENT_TIMEOUT as DEFAULT_STATEMENT_TIMEOUT
from ._store import DEFAULT_TTL as DEFAULT_TTL
from ._store import UNCLAIMED_LIMIT as UNCLAIMED_LIMIT
from ._store import UNCLAIMED_WITHIN as UNCLAIMED_WITHIN
from ._store import Claim as Claim
from ._store import ClaimBatch as ClaimBatch
from ._store import CutShort as CutShort
from ._store import LeaseRow as LeaseRow
from ._store import LeaseState as LeaseState
from ._store import LeaseStore as LeaseStore
from ._store import LeaseWrite as LeaseWrite
from ._store import Survey as Survey
from ._store import WriteKind as WriteKind
from ._store import check_dialect as check_dialect
from ._tally import NOT_SCHEDULED as NOT_SCHEDULED
from ._tally import RoundSpan as RoundSpan
from ._tally import Tally as Tally
from ._text import HOLDER_LENGTH as HOLDER_LENGTH
from ._text import check_holder as check_holder
from ._text import unstorable as unstorable
from ._timing import retime_schedule_leases as retime_schedule_leases
from ._trigger import REQUEST_TTL as REQUEST_TTL
from ._trigger import TRIGGER_CHANNEL as TRIGGER_CHANNEL
from ._trigger import TriggerRow as TriggerRow
from ._trigger import Triggers as Triggers
from ._trigger import TriggerState as TriggerState

__all__ = [
    "ACK_NOTE",
    "Admission",
    "BackfillCancellation",
    "Backfills",
    "CLAIM_AHEAD_LIMIT",
    "COUNTED_FAILURES",
    "Claim",
    "ClaimBatch",
    "CutRound",
    "CutShort",
    "DEFAULT_HISTORY_DAYS",
    "DEFAULT_HISTORY_PER_NAME",
    "DEFAULT_STATEMENT_TIMEOUT",
    "DEFAULT_TTL",
    "DatabaseError",
    "DatabaseRefused",
    "DatabaseUnavailable",
    "Definition",
    "Ending",
    "HOLDER_LENGTH",
    "LeaseError",
    "LeaseRow",
    "LeaseState",
    "LeaseStore",
    "LeaseWrite",
    "MigrationFailed",
    "MigrationRequired",
    "NOT_SCHEDULED",
    "ONCE_DONE",
    "ONCE_RUNNING",
    "OutboxRow",
    "OutboxSummary",
    "POLICIES_FORMAT",
    "Publication",
    "REASON_LENGTH",
    "REQUEST_TTL",
    "ReplicaRow",
    "RoundRow",
    "RoundSpan",
    "SCHEDULE_FORMAT",
    "SKIP_NOTE",
    "ScheduleRow",
    "Survey",
    "TABLE_NAME",
    "TRIGGER_CHANNEL",
    "Tally",
    "TriggerRow",
    "TriggerState",
    "Triggers",
    "UNCLAIMED_LIMIT",
    "UNCLAIMED_WITHIN",
    "UnsupportedDatabase",
    "VERSION_TABLE",
    "WriteKind",
    "admit",
    "async_url",
    "begin_once",
    "behind_transaction_pooler",
    "bump_schedule_rev",
    "check_dialect",
    "check_holder",
    "claim_publication",
    "count_failure",
    "create_async_engine",
    "create_engine",
    "current_revision",
    "defer_publications",
    "definition",
    "due_publications",
    "finish_once",
    "forgo_former_rounds",
    "head_revision",
    "held_publications",
    "insert_schedules",
    "is_async_url",
    "leased_names",
    "mark_published",
    "mark_published_many",
    "metadata",
    "migrate",
    "next_publication_ms",
    "once_state",
    "orphaned_publications",
    "outbox_summary",
    "paused_names",
    "prune_outbox",
    "prune_schedules",
    "read_admission",
    "read_schedule_rev",
    "read_schedules",
    "record_publication",
    "record_publications",
    "redact",
    "redeploy_schedule_leases",
    "release_once",
    "remove_schedule",
    "replace_schedules",
    "resolve_obsolete",
    "retime_schedule_leases",
    "schedule_changes",
    "schedule_lease_rows",
    "schedule_values",
    "set_paused_on",
    "sync_url",
    "taken_schedule_ids",
    "tell_on_commit",
    "tell_schedules_changed",
    "unstorable",
    "update_schedule",
]

# Public objects say where to find them: lease.LeaseStore, not lease._store.LeaseStore.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("lease._"):
        _obj.__module__ = __name__
del _name, _obj
