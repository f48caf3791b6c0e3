"""A stream worker pins what it admitted: the table of admitted occurrences.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-14

- ``cronjob_admission``: one row per occurrence a stream worker
  (``cronjob.contrib.streams``) admitted, written by its first claim (an insert-if-new:
  the first claim wins) with the descriptor every later delivery adopts: the handler's
  name, the capped timeout, the retry budget, and the failures counted against it.

A new table only: a replica of release 0014 runs beside this one unchanged (it never
reads it), and the upgrade takes no lock on the tables in use.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Frozen here, not imported from lease._schema: a migration must not change later.
    name = sa.String(200).with_variant(
        mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )
    op.create_table(
        "cronjob_admission",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("schedule", name, nullable=False),
        sa.Column("handler", name, nullable=False),
        sa.Column("timeout_ms", sa.BigInteger(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("admitted_ms", sa.BigInteger(), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("cronjob_admission")
