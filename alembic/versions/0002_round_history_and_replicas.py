"""Job state on the lease row; the round history and the replica tables.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Only adds: nullable columns and new tables, so a replica of release 0001 keeps working
beside one of this release during a rolling deploy (it never reads or writes them), and
a database with rounds in flight upgrades without losing any (no row is rewritten).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = sa.String(200).with_variant(
    mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)


def upgrade() -> None:
    # Column by column, not in a batch: SQLite adds a nullable column in place, where a
    # batch would copy the table (and hold its lock) for nothing.
    for column in (
        sa.Column("spec", sa.Text(), nullable=True),
        sa.Column("last_start_ms", sa.BigInteger(), nullable=True),
        sa.Column("last_end_ms", sa.BigInteger(), nullable=True),
        sa.Column("last_success_ms", sa.BigInteger(), nullable=True),
        sa.Column("last_outcome", sa.String(16), nullable=True),
        sa.Column("last_error", sa.String(1000), nullable=True),
        sa.Column("failures", sa.Integer(), nullable=True),
    ):
        op.add_column("cronjob_lease", column)
    op.create_table(
        "cronjob_round",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("name", _NAME, nullable=False),
        sa.Column("instant", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.SmallInteger(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("why", sa.String(16), nullable=False),
        sa.Column("started_ms", sa.BigInteger(), nullable=False),
        sa.Column("ended_ms", sa.BigInteger(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error", sa.String(1000), nullable=True),
        sa.Column("trace_id", sa.String(32), nullable=True),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_cronjob_round_name_id", "cronjob_round", ["name", "id"])
    op.create_index("ix_cronjob_round_ended_ms", "cronjob_round", ["ended_ms"])
    op.create_table(
        "cronjob_replica",
        sa.Column("holder", sa.String(255), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("started_ms", sa.BigInteger(), nullable=False),
        sa.Column("seen_ms", sa.BigInteger(), nullable=False),
        sa.Column("jobs", sa.Text(), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("cronjob_replica")
    op.drop_index("ix_cronjob_round_ended_ms", table_name="cronjob_round")
    op.drop_index("ix_cronjob_round_name_id", table_name="cronjob_round")
    op.drop_table("cronjob_round")
    with op.batch_alter_table("cronjob_lease") as batch:
        for name in (
            "failures",
            "last_error",
            "last_outcome",
            "last_success_ms",
            "last_end_ms",
            "last_start_ms",
            "spec",
        ):
            batch.drop_column(name)
