"""Schedules made of data: a task's schedules as rows, and their change counter.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

Adds two tables and touches no existing row, so a database with rounds in flight
upgrades without losing any, and a replica of release 0007 keeps working beside one of
this release during a rolling deploy: it never reads these tables, and the lease rows of
schedules carry names it does not register, which it never claims.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Frozen here, not imported from lease._schema: a migration must not change later.
    name = sa.String(200).with_variant(
        mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )
    op.create_table(
        "cronjob_schedule",
        sa.Column("id", name, primary_key=True),
        sa.Column("task", name, nullable=False),
        sa.Column("spec", sa.Text(), nullable=True),
        sa.Column("at_s", sa.BigInteger(), nullable=True),
        sa.Column(
            "args",
            sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column("start_s", sa.BigInteger(), nullable=True),
        sa.Column("end_s", sa.BigInteger(), nullable=True),
        sa.Column("rev", sa.BigInteger(), nullable=False),
        sa.Column("removed", sa.SmallInteger(), nullable=False),
        sa.Column("format", sa.SmallInteger(), nullable=False, server_default="1"),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_cronjob_schedule_rev", "cronjob_schedule", ["rev"])
    op.create_index("ix_cronjob_schedule_task", "cronjob_schedule", ["task"])
    rev = op.create_table(
        "cronjob_schedule_rev",
        sa.Column("id", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("rev", sa.BigInteger(), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.bulk_insert(rev, [{"id": 1, "rev": 0}])


def downgrade() -> None:
    op.drop_table("cronjob_schedule_rev")
    op.drop_index("ix_cronjob_schedule_task", table_name="cronjob_schedule")
    op.drop_index("ix_cronjob_schedule_rev", table_name="cronjob_schedule")
    op.drop_table("cronjob_schedule")
