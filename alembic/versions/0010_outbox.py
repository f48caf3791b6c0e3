"""The outbox and the once-table: instants handed to a task queue.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

Adds two tables and touches no existing row, so a database with rounds in flight
upgrades without losing any, and a replica of release 0009 keeps working beside one of
this release during a rolling deploy: it never reads these tables (it registers no job
that hands its instants to a task queue).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Frozen here, not imported from lease._schema: a migration must not change later.
    name = sa.String(200).with_variant(
        mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )
    op.create_table(
        "cronjob_outbox",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", name, nullable=False),
        sa.Column("instant_ms", sa.BigInteger(), nullable=False),
        sa.Column("target", sa.String(16), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("next_try_ms", sa.BigInteger(), nullable=False),
        sa.Column("sent_ms", sa.BigInteger(), nullable=True),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("error", sa.String(1000), nullable=True),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_cronjob_outbox_sent_next", "cronjob_outbox", ["sent_ms", "next_try_ms"])
    op.create_table(
        "cronjob_once",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("holder", sa.String(255), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("started_ms", sa.BigInteger(), nullable=False),
        sa.Column("ended_ms", sa.BigInteger(), nullable=True),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_cronjob_once_state_ended", "cronjob_once", ["state", "ended_ms"])


def downgrade() -> None:
    op.drop_index("ix_cronjob_once_state_ended", table_name="cronjob_once")
    op.drop_table("cronjob_once")
    op.drop_index("ix_cronjob_outbox_sent_next", table_name="cronjob_outbox")
    op.drop_table("cronjob_outbox")
