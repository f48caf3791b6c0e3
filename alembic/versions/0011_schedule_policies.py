"""Schedule policies: a schedule made of data may carry policies of its own.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

Adds one nullable column, ``cronjob_schedule.policies`` (the JSON of a schedule's own
``overlap``, ``catch_up``, ``catch_up_window``, ``jitter`` and ``heartbeat``; NULL: its
task's), and touches no existing row: every schedule on record keeps its task's
policies, and a database with rounds in flight upgrades without losing any.

A replica of release 0010 keeps working beside one of this release during a rolling
deploy: it never reads the new column (it selects the columns it knows), and a row that
carries policies is written in format 2 (``cronjob_schedule.format``), which release 0010
leaves alone (it runs format 1 at most, see ``lease.SCHEDULE_FORMAT``) instead of running
it without its policies. A schedule without policies of its own stays format 1: both
releases run it, once per instant, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: an instant change of the catalogue on PostgreSQL, MariaDB
    # (INSTANT) and SQLite alike, whatever the number of schedules.
    op.add_column("cronjob_schedule", sa.Column("policies", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cronjob_schedule") as batch:
        batch.drop_column("policies")
