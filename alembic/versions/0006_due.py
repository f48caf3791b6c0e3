"""The next instant a lease row may need a claim at: the rest of an instant found by it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08

Adds one nullable column, ``due_s`` on ``cronjob_lease`` (epoch seconds of the next instant
at which the row may need a claim: written by each claim, and lowered by registration),
and an index on it. The rest of an instant — what the replicas whose share it was left
unclaimed — is then found by one query over the index (``due_s <= instant``) instead of a
claim naming every job of the other replicas' shares (issue #31).

No row is rewritten: a database with rounds in flight upgrades without losing any, and a
replica of release 0005 (which never names the column) keeps claiming beside one of this
release during a rolling deploy. A row left NULL — written before this revision, or by a
replica of release 0005 since — is never found by the query; the next replica of this
release that registers its job (``LeaseStore.ensure``) fills it. Until then the old
replicas' own rest claims, by name, cover it (see docs/decisions.md, "#31: the due
column").
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Not in a batch: SQLite adds a nullable column in place.
    op.add_column("cronjob_lease", sa.Column("due_s", sa.BigInteger(), nullable=True))
    op.create_index("ix_cronjob_lease_due_s", "cronjob_lease", ["due_s"])


def downgrade() -> None:
    op.drop_index("ix_cronjob_lease_due_s", table_name="cronjob_lease")
    with op.batch_alter_table("cronjob_lease") as batch:
        batch.drop_column("due_s")
