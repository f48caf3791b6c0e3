"""A job's first deployment on its lease row: the instants after it are the job's to run.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Adds one nullable column, ``deployed_ms`` on ``cronjob_lease``: epoch milliseconds on the
lease clock at which a replica first wrote the row (the job's first deployment). Start-up
and outage catch-up owe a job that never ran the latest instant after it.

No row is rewritten: a database with rounds in flight upgrades without losing any, and a
replica of release 0004 (which inserts rows without the column, and never reads it) keeps
working beside one of this release during a rolling deploy. A row left NULL — written
before this revision, or by a replica of release 0004 since — is filled by the next replica
of this release that registers its job (``LeaseStore.ensure``), with that moment: the
earliest the deployment is known for sure. Until then it is owed nothing before it has run,
the rule of release 0004 (see docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Not in a batch: SQLite adds a nullable column in place.
    op.add_column("cronjob_lease", sa.Column("deployed_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cronjob_lease") as batch:
        batch.drop_column("deployed_ms")
