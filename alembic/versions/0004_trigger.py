"""Run-now: requests for a round now, and who asked for a manual round in the history.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Adds a table and a nullable column only, so a replica of release 0003 keeps working
beside one of this release during a rolling deploy (it never reads the requests: only
replicas of this release take them), and a database with rounds in flight upgrades without
losing any (no row is rewritten).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Frozen here, not imported from lease._schema: a migration must not change later.
    name = sa.String(200).with_variant(
        mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )
    op.add_column("cronjob_round", sa.Column("requested_by", sa.String(255), nullable=True))
    op.create_table(
        "cronjob_trigger",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("name", name, nullable=False),
        sa.Column("requested_ms", sa.BigInteger(), nullable=False),
        sa.Column("requested_by", sa.String(255), nullable=False),
        sa.Column("forced", sa.SmallInteger(), nullable=False),
        sa.Column("replica", sa.String(255), nullable=True),
        sa.Column("instant", sa.BigInteger(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.SmallInteger(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=True),
        sa.Column("token", sa.BigInteger(), nullable=True),
        sa.Column("started_ms", sa.BigInteger(), nullable=True),
        sa.Column("ended_ms", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("error", sa.String(1000), nullable=True),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_cronjob_trigger_state", "cronjob_trigger", ["state"])


def downgrade() -> None:
    op.drop_index("ix_cronjob_trigger_state", table_name="cronjob_trigger")
    op.drop_table("cronjob_trigger")
    with op.batch_alter_table("cronjob_round") as batch:
        batch.drop_column("requested_by")
