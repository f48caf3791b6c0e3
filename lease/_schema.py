"""The lease tables: the package's one `MetaData` and its tables.

- ``cronjob_lease``: one row per lease name: the latest claim, and (since revision
  0002) how the latest rounds under it ended — the record an operator reads.
- ``cronjob_round``: one row per round that ended, written in batches with the ends,
  pruned by age and by a cap per name (revision 0002).
- ``cronjob_replica``: one row per holder (replica) that said it is alive, refreshed
  with its sweep (revision 0002).
- revision 0003 adds the pause (``paused_ms``, ``paused_by``, ``pause_reason``) to
  ``cronjob_lease``.
- ``cronjob_trigger`` (revision 0004): one row per request for a round now (run-now), or
  for the catch-up of an instant skipped while paused; and ``requested_by`` on
  ``cronjob_round``, who asked for a manual round.
- revision 0005 adds ``deployed_ms`` to ``cronjob_lease``: when the row was first written
  (the job's first deployment), so catch-up owes a job that never ran the instants after it.
- revision 0006 adds ``due_s`` to ``cronjob_lease``, with an index: the next instant at
  which the row may need a claim, so the rest of an instant is found without names.
- ``cronjob_schedule`` (revision 0008): one row per schedule made of data (a task's
  schedule added at run time), removed ones kept as tombstones; ``cronjob_schedule_rev``:
  one row, the change counter every change of a schedule raises in its transaction.
- ``cronjob_outbox`` (revision 0010): one row per publication handed to another system
  (a task queue), recorded before it is sent, marked once accepted; ``cronjob_once``: one
  row per id whose body a worker ran or runs (see ``lease._outbox``).
- revision 0012 adds an index on ``(holder, instant)`` to ``cronjob_lease``: each
  replica's latest claim, read with one probe a replica.
- revision 0013 adds ``task`` and ``obsolete_ms`` to ``cronjob_outbox``: an unsent
  occurrence of a removed schedule is sent by its task's publisher, or resolved
  obsolete when no live replica registers that task.
- revision 0014 adds ``spec_ms`` to ``cronjob_lease``: when the row's timing last
  changed, the start of the instants a missed count looks at.
- revision 0015 adds ``cronjob_admission``: the descriptor a stream worker pinned at an
  occurrence's first claim (``cronjob.contrib.streams``).
- revision 0016 adds the acknowledgement of missed instants to ``cronjob_lease``
  (``acked_s``, ``acked_ms``, ``acked_by``, ``ack_reason``): the instants up to
  ``acked_s`` that no round ran stop counting as missed.
- revision 0017 adds ``committed_ms`` to ``cronjob_lease``: when a schedule made of
  data's timing was committed (its add, its re-add, a change of its spec, instant or
  window), so catch-up owes it the instants after that even if no replica ran then.
- revision 0018 adds ``prev_start_ms`` to ``cronjob_lease``: when the round before a
  first run's claim took the lease, copied by that claim, so it knows how long that
  round held it.

``alembic/env.py`` targets `metadata`, and a test checks that the migrations
produce exactly this definition on every supported database.
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from ._text import HOLDER_LENGTH

__all__ = [
    "ADMISSION_TABLE",
    "ERROR_LENGTH",
    "NAME_LENGTH",
    "NEVER",
    "ONCE_TABLE",
    "OUTBOX_TABLE",
    "REASON_LENGTH",
    "REPLICA_TABLE",
    "ROUND_TABLE",
    "SCHEDULE_REV_TABLE",
    "SCHEDULE_TABLE",
    "TABLE_NAME",
    "TRIGGER_TABLE",
    "VERSION_TABLE",
    "admission_table",
    "lease_table",
    "metadata",
    "once_table",
    "outbox_table",
    "replica_table",
    "round_table",
    "schedule_rev_table",
    "schedule_table",
    "trigger_table",
]

#: The name of the lease table.
TABLE_NAME = "cronjob_lease"
#: The alembic version table of these migrations; the application's own
#: ``alembic_version`` is never touched.
VERSION_TABLE = "cronjob_alembic_version"
#: The table of rounds that ended (the history).
ROUND_TABLE = "cronjob_round"
#: The table of replicas (holders) on record.
REPLICA_TABLE = "cronjob_replica"
#: The table of requests for rounds now (run-now) and catch-ups on resume.
TRIGGER_TABLE = "cronjob_trigger"
#: The table of schedules made of data (revision 0008).
SCHEDULE_TABLE = "cronjob_schedule"
#: The one-row table of the schedules' change counter (revision 0008).
SCHEDULE_REV_TABLE = "cronjob_schedule_rev"
#: The table of publications handed to another system (revision 0010).
OUTBOX_TABLE = "cronjob_outbox"
#: The table of bodies run once per id (revision 0010).
ONCE_TABLE = "cronjob_once"
#: The table of occurrences admitted by a stream worker, each with its pinned descriptor
#: (revision 0015).
ADMISSION_TABLE = "cronjob_admission"
#: The longest error summary kept, in characters (longer ones are cut, marked so).
ERROR_LENGTH = 1000
#: The longest name a lease can have, in characters.
NAME_LENGTH = 200
#: The longest reason a pause can carry, in characters (a longer one is refused).
REASON_LENGTH = 200
#: The ``instant`` of a row whose lease was never claimed.
NEVER = -1

metadata = sa.MetaData()

# MySQL/MariaDB compare strings case-insensitively under their default collations, so
# "Report" and "report" would share one row; names are identifiers and compare by their
# bytes, as on PostgreSQL and SQLite.
_Name = sa.String(NAME_LENGTH).with_variant(
    mysql.VARCHAR(NAME_LENGTH, charset="utf8mb4", collation="utf8mb4_bin"),
    "mysql",
    "mariadb",
)

#: The survey's condition (rounds that may run a second time), and the partial index's.
UNFINISHED_CONDITION: Final = "attempt = 1 AND state IN ('running', 'cut') AND paused_ms IS NULL"

lease_table = sa.Table(
    TABLE_NAME,
    metadata,
    # One row per lease name.
    sa.Column("name", _Name, primary_key=True),
    # Epoch seconds (UTC) of the latest claimed instant; NEVER until the first claim.
    sa.Column("instant", sa.BigInteger(), nullable=False),
    # 1 for a first run of the instant, 2 for its second run.
    sa.Column("attempt", sa.SmallInteger(), nullable=False),
    # 'new', 'running', 'done' or 'cut' (see lease.LeaseState). A plain string rather
    # than a native enum or a CHECK, so a hand-edited row can be read, logged and
    # skipped instead of breaking every reader.
    sa.Column("state", sa.String(16), nullable=False),
    # The fencing token: a fresh random 63-bit value on every claim.
    sa.Column("token", sa.BigInteger(), nullable=False),
    # The replica holding (or that last held) the lease.
    sa.Column("holder", sa.String(HOLDER_LENGTH), nullable=True),
    # Lease expiry in epoch milliseconds on the lease clock; NULL when not held.
    sa.Column("expires_ms", sa.BigInteger(), nullable=True),
    # Epoch seconds: a round that ran to its end records its end here; every instant
    # up to it that the round overran stays skipped.
    sa.Column("skipped_through", sa.BigInteger(), nullable=True),
    # What the row held before its instant's first claim (its second runs leave them),
    # so a claimer can tell it superseded an unfinished round.
    sa.Column("prev_instant", sa.BigInteger(), nullable=True),
    sa.Column("prev_state", sa.String(16), nullable=True),
    sa.Column("prev_attempt", sa.SmallInteger(), nullable=True),
    # Revision 0002, all nullable (a replica of release 0001 never writes them):
    # What the holders registered under the name (a cron spec, for cronjob), written at
    # start by LeaseStore.ensure; the latest start wins.
    sa.Column("spec", sa.Text(), nullable=True),
    # Epoch milliseconds on the lease clock: the latest claim, the latest end on record,
    # the latest end that succeeded.
    sa.Column("last_start_ms", sa.BigInteger(), nullable=True),
    sa.Column("last_end_ms", sa.BigInteger(), nullable=True),
    sa.Column("last_success_ms", sa.BigInteger(), nullable=True),
    # How the latest round on record ended (see lease.Ending), and its error summary.
    sa.Column("last_outcome", sa.String(16), nullable=True),
    sa.Column("last_error", sa.String(ERROR_LENGTH), nullable=True),
    # Rounds in a row that failed or were given up; 0 after a success.
    sa.Column("failures", sa.Integer(), nullable=True),
    # Revision 0003, all nullable: paused since (epoch ms on the lease clock), by whom,
    # why. A claim refuses a row whose ``paused_ms`` is set; NULL means not paused.
    sa.Column("paused_ms", sa.BigInteger(), nullable=True),
    sa.Column("paused_by", sa.String(HOLDER_LENGTH), nullable=True),
    sa.Column("pause_reason", sa.String(REASON_LENGTH), nullable=True),
    # Revision 0005, nullable: epoch milliseconds on the lease clock at which a replica
    # first wrote the row — the job's first deployment; the catch-up owes a job that never
    # ran the instants after it. NULL on a row written before 0005 or by a replica of an
    # older release since, until a replica of a newer one registers the job (the
    # deployment then known for sure) and fills it with that moment.
    sa.Column("deployed_ms", sa.BigInteger(), nullable=True),
    # Revision 0006, nullable: epoch seconds of the next instant at which the row may need
    # a claim — never later than it (a claim writes the job's next instant after the one
    # it claimed; registration lowers it to the job's next instant). The rest of an
    # instant is looked up by it (LeaseStore.unclaimed). NULL on a row written before 0006
    # or by an older release's replica since, until a replica of a newer one registers it.
    sa.Column("due_s", sa.BigInteger(), nullable=True),
    sa.Index("ix_cronjob_lease_due_s", "due_s"),
    # Revision 0014, nullable: epoch milliseconds on the lease clock at which the row's
    # timing last changed (a registered job's spec deployed in place of another, a data
    # schedule's spec, instant or window); missed instants are counted from it. NULL: no
    # change on record (or one an older release's replica made).
    sa.Column("spec_ms", sa.BigInteger(), nullable=True),
    # Revision 0016, all nullable: missed instants acknowledged by an operator — every
    # instant up to ``acked_s`` (epoch seconds) that no round ran stops counting as
    # missed; when (epoch ms on the lease clock), by whom, why. NULL: none acknowledged.
    sa.Column("acked_s", sa.BigInteger(), nullable=True),
    sa.Column("acked_ms", sa.BigInteger(), nullable=True),
    sa.Column("acked_by", sa.String(HOLDER_LENGTH), nullable=True),
    sa.Column("ack_reason", sa.String(REASON_LENGTH), nullable=True),
    # Revision 0017, nullable: epoch milliseconds on the lease clock (or the writer's
    # ``now=``) at which a schedule made of data's timing was committed — added, added
    # again, its spec, instant or window changed — written by the schedules API in the
    # writer's transaction; the catch-up owes the schedule the instants after it, even
    # those that passed while no replica ran. NULL: a registered job's row, or one an
    # older release wrote (owed nothing from before its first deployment, as before).
    sa.Column("committed_ms", sa.BigInteger(), nullable=True),
    # Revision 0018, nullable: a first run's claim copies ``last_start_ms`` (when the
    # round before it took the lease) here before writing its own; with ``last_end_ms``
    # it tells how long that round held the lease. NULL: not known (an older release).
    sa.Column("prev_start_ms", sa.BigInteger(), nullable=True),
    # Revision 0009: the reads that ran over the whole table per replica reach only the
    # rows they are about. The first rounds not run to their end (the sweep's survey):
    # on PostgreSQL and SQLite an index of those rows alone, so a round's end takes its
    # row out of it; its condition is the survey's whole, which a round's end (state
    # and token by name) does not imply, so that statement keeps to the primary key.
    # MariaDB has no partial index and indexes every row's state.
    sa.Index(
        "ix_cronjob_lease_unfinished",
        "state",
        postgresql_where=sa.text(UNFINISHED_CONDITION),
        sqlite_where=sa.text(UNFINISHED_CONDITION),
    ),
    # The holders of recent claims (the peers' read since their last one).
    sa.Index("ix_cronjob_lease_instant", "instant"),
    # Revision 0012: each holder's latest claim, one probe a replica (the peers' reads
    # after their first).
    sa.Index("ix_cronjob_lease_holder_instant", "holder", "instant"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# SQLite gives a row id to an INTEGER PRIMARY KEY only, not to a BIGINT one.
_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

round_table = sa.Table(
    ROUND_TABLE,
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("name", _Name, nullable=False),
    # Epoch seconds (UTC) of the round's instant, and its attempt (1 or 2).
    sa.Column("instant", sa.BigInteger(), nullable=False),
    sa.Column("attempt", sa.SmallInteger(), nullable=False),
    sa.Column("holder", sa.String(HOLDER_LENGTH), nullable=False),
    # Why the round ran ('schedule', 'catch-up', 're-run', 'start', ...): the holder's word.
    sa.Column("why", sa.String(16), nullable=False),
    # Epoch milliseconds on the holder's clock: when the round began and ended.
    sa.Column("started_ms", sa.BigInteger(), nullable=False),
    sa.Column("ended_ms", sa.BigInteger(), nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("error", sa.String(ERROR_LENGTH), nullable=True),
    sa.Column("trace_id", sa.String(32), nullable=True),
    # Revision 0004: who asked for a manual round (``why`` 'manual'); NULL otherwise.
    sa.Column("requested_by", sa.String(HOLDER_LENGTH), nullable=True),
    # The latest rounds of a name (newest id first), and pruning by age.
    sa.Index("ix_cronjob_round_name_id", "name", "id"),
    sa.Index("ix_cronjob_round_ended_ms", "ended_ms"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

replica_table = sa.Table(
    REPLICA_TABLE,
    metadata,
    sa.Column("holder", sa.String(HOLDER_LENGTH), primary_key=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer(), nullable=False),
    sa.Column("version", sa.String(64), nullable=False),
    # Epoch milliseconds on the lease clock: when it started, when it was last seen.
    sa.Column("started_ms", sa.BigInteger(), nullable=False),
    sa.Column("seen_ms", sa.BigInteger(), nullable=False),
    # JSON: the names it registered, each with its spec and whether it is leased. A
    # MEDIUMTEXT on MariaDB/MySQL, whose TEXT holds 64 KiB: ~1,300 jobs (revision 0007).
    sa.Column(
        "jobs",
        sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb"),
        nullable=False,
    ),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

trigger_table = sa.Table(
    TRIGGER_TABLE,
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("name", _Name, nullable=False),
    # Epoch milliseconds on the lease clock: when the request was made.
    sa.Column("requested_ms", sa.BigInteger(), nullable=False),
    sa.Column("requested_by", sa.String(HOLDER_LENGTH), nullable=False),
    # 1: run even while the job is paused.
    sa.Column("forced", sa.SmallInteger(), nullable=False),
    # For a per-instance job: the replica (holder) asked to run it; NULL for a leased job.
    sa.Column("replica", sa.String(HOLDER_LENGTH), nullable=True),
    # Epoch seconds: a scheduled instant to catch up (resume --catch-up), claimed as any
    # instant; NULL for a manual round.
    sa.Column("instant", sa.BigInteger(), nullable=True),
    # 'pending', 'running', 'cut', 'done', 'refused' or 'expired' (lease.TriggerState).
    sa.Column("state", sa.String(16), nullable=False),
    # 0 until taken; 1 for the first run, 2 for the second run of a round cut short.
    sa.Column("attempt", sa.SmallInteger(), nullable=False),
    # The replica running (or that ran) it, and its round's fencing token.
    sa.Column("holder", sa.String(HOLDER_LENGTH), nullable=True),
    sa.Column("token", sa.BigInteger(), nullable=True),
    # Epoch milliseconds on the lease clock.
    sa.Column("started_ms", sa.BigInteger(), nullable=True),
    sa.Column("ended_ms", sa.BigInteger(), nullable=True),
    # How it ended (as the history's outcomes, or why it was refused), and the error.
    sa.Column("outcome", sa.String(16), nullable=True),
    sa.Column("error", sa.String(ERROR_LENGTH), nullable=True),
    sa.Index("ix_cronjob_trigger_state", "state"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

schedule_table = sa.Table(
    SCHEDULE_TABLE,
    metadata,
    # The schedule's id: the name of its lease row and of its rounds in the history.
    sa.Column("id", _Name, primary_key=True),
    # The task (registered at import time) whose function runs it.
    sa.Column("task", _Name, nullable=False),
    # Its spec (as a job's), or NULL for a one-off schedule (``at_s``).
    sa.Column("spec", sa.Text(), nullable=True),
    # Epoch seconds of a one-off schedule's one instant; NULL for a spec.
    sa.Column("at_s", sa.BigInteger(), nullable=True),
    # JSON: the arguments its rounds see (at most 64 KiB; a MEDIUMTEXT on MariaDB/MySQL,
    # whose TEXT holds 65,535 bytes).
    sa.Column(
        "args",
        sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb"),
        nullable=False,
    ),
    # Epoch seconds: no instant before ``start_s`` or after ``end_s``; NULL: unbounded.
    sa.Column("start_s", sa.BigInteger(), nullable=True),
    sa.Column("end_s", sa.BigInteger(), nullable=True),
    # The change counter's value when the row last changed: replicas read the rows
    # changed since the value they last saw.
    sa.Column("rev", sa.BigInteger(), nullable=False),
    # 1: removed (a tombstone, so replicas learn of the removal from the changes).
    sa.Column("removed", sa.SmallInteger(), nullable=False),
    # What a replica must understand to run it (`lease.SCHEDULE_FORMAT`): a release
    # that writes a row with more (a policy of its own) raises it, and a replica of an
    # older release leaves such a row alone instead of running it without.
    sa.Column("format", sa.SmallInteger(), nullable=False, server_default="1"),
    # JSON: the policies the schedule sets for itself (revision 0011), checked by
    # `cronjob.schedules`; NULL: its task's, all of them.
    sa.Column("policies", sa.Text(), nullable=True),
    # Epoch milliseconds on the database's clock.
    sa.Column("created_ms", sa.BigInteger(), nullable=False),
    sa.Column("updated_ms", sa.BigInteger(), nullable=False),
    sa.Index("ix_cronjob_schedule_rev", "rev"),
    sa.Index("ix_cronjob_schedule_task", "task"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

schedule_rev_table = sa.Table(
    SCHEDULE_REV_TABLE,
    metadata,
    # Always 1: the table has one row.
    sa.Column("id", sa.SmallInteger(), primary_key=True, autoincrement=False),
    # Raised by one in the transaction of every change: its row lock orders the changes'
    # commits, so the rows changed at a value are all committed once it is read.
    sa.Column("rev", sa.BigInteger(), nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

#: The length of an id of the outbox and the once-table (a UUID's text is 36).
_ID_LENGTH = 64

outbox_table = sa.Table(
    OUTBOX_TABLE,
    metadata,
    # The publication's id: the message's own id (an occurrence id).
    sa.Column("id", sa.String(_ID_LENGTH), primary_key=True),
    # The lease name and the instant (epoch milliseconds) it belongs to.
    sa.Column("name", _Name, nullable=False),
    sa.Column("instant_ms", sa.BigInteger(), nullable=False),
    # What it is sent to ('rq', 'celery', ...): the holder's word.
    sa.Column("target", sa.String(16), nullable=False),
    # JSON: what the holder needs to send it again (its trace headers, a description).
    sa.Column("payload", sa.Text(), nullable=False),
    # Epoch milliseconds on the recorder's clock: recorded; nobody else tries it before
    # next_try_ms (a retry claims it by moving this); accepted (NULL: unsent).
    sa.Column("created_ms", sa.BigInteger(), nullable=False),
    sa.Column("next_try_ms", sa.BigInteger(), nullable=False),
    sa.Column("sent_ms", sa.BigInteger(), nullable=True),
    # Failed attempts to send it, and the latest failure.
    sa.Column("tries", sa.Integer(), nullable=False),
    sa.Column("error", sa.String(ERROR_LENGTH), nullable=True),
    # Revision 0013: the task of the schedule it belongs to (NULL: a registered job's, or
    # recorded by an earlier release), whose publisher sends it once the schedule is
    # gone; and when it was resolved obsolete (schedule gone, task registered by no live
    # replica): never sent nor counted unsent after (sent_ms stays NULL).
    sa.Column("task", _Name, nullable=True),
    sa.Column("obsolete_ms", sa.BigInteger(), nullable=True),
    # The unsent rows that are due, in one range; the sent ones to prune.
    sa.Index("ix_cronjob_outbox_sent_next", "sent_ms", "next_try_ms"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

once_table = sa.Table(
    ONCE_TABLE,
    metadata,
    # The id the body runs once for (an occurrence id).
    sa.Column("id", sa.String(_ID_LENGTH), primary_key=True),
    # The task whose body it is, and the worker that runs (or ran) it.
    sa.Column("task", sa.String(NAME_LENGTH), nullable=False),
    sa.Column("holder", sa.String(HOLDER_LENGTH), nullable=True),
    # 'running' or 'done'; a failed body's row is deleted (a redelivery runs it again).
    sa.Column("state", sa.String(16), nullable=False),
    # A fresh random 63-bit value at each start: a taken-over run's end changes nothing.
    sa.Column("token", sa.BigInteger(), nullable=False),
    # Epoch milliseconds on the worker's clock.
    sa.Column("started_ms", sa.BigInteger(), nullable=False),
    sa.Column("ended_ms", sa.BigInteger(), nullable=True),
    sa.Index("ix_cronjob_once_state_ended", "state", "ended_ms"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

admission_table = sa.Table(
    ADMISSION_TABLE,
    metadata,
    # Revision 0015. The occurrence id a stream worker admitted (its first claim).
    sa.Column("id", sa.String(_ID_LENGTH), primary_key=True),
    # The schedule (a job's or a data schedule's name) and the handler admitted for it:
    # the name the handler is registered under, which every later delivery adopts.
    sa.Column("schedule", _Name, nullable=False),
    sa.Column("handler", _Name, nullable=False),
    # The pinned contract: the capped timeout (milliseconds) and the retry budget.
    sa.Column("timeout_ms", sa.BigInteger(), nullable=False),
    sa.Column("retries", sa.Integer(), nullable=False),
    # Runs that failed so far; past ``retries`` the occurrence goes to the dead stream.
    sa.Column("failures", sa.Integer(), nullable=False),
    # Epoch milliseconds on the admitting worker's clock.
    sa.Column("admitted_ms", sa.BigInteger(), nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)
