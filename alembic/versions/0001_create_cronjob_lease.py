"""Create the lease table, cronjob_lease.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

A migration is history: it spells its tables out instead of importing lease._schema,
which describes only the latest revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cronjob_lease",
        sa.Column(
            "name",
            sa.String(200).with_variant(
                mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"),
                "mysql",
                "mariadb",
            ),
            primary_key=True,
        ),
        sa.Column("instant", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.SmallInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=True),
        sa.Column("expires_ms", sa.BigInteger(), nullable=True),
        sa.Column("skipped_through", sa.BigInteger(), nullable=True),
        sa.Column("prev_instant", sa.BigInteger(), nullable=True),
        sa.Column("prev_state", sa.String(16), nullable=True),
        sa.Column("prev_attempt", sa.SmallInteger(), nullable=True),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("cronjob_lease")
