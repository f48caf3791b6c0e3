"""Pausing a job: who paused it, when and why, on its lease row.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Only adds nullable columns, so a replica of release 0002 keeps working beside one of this
release during a rolling deploy (it never reads them: it keeps running a paused job until
it is replaced, see docs/decisions.md), and a database with rounds in flight upgrades
without losing any (no row is rewritten).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Column by column, not in a batch: SQLite adds a nullable column in place.
    for column in (
        sa.Column("paused_ms", sa.BigInteger(), nullable=True),
        sa.Column("paused_by", sa.String(255), nullable=True),
        sa.Column("pause_reason", sa.String(200), nullable=True),
    ):
        op.add_column("cronjob_lease", column)


def downgrade() -> None:
    with op.batch_alter_table("cronjob_lease") as batch:
        for name in ("pause_reason", "paused_by", "paused_ms"):
            batch.drop_column(name)
