"""A replica's list of jobs holds 100,000 jobs on MariaDB/MySQL too.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

``cronjob_replica.jobs`` (JSON: each job a replica registered, with its spec) was a
``TEXT``, which MariaDB and MySQL cap at 65,535 bytes: about 1,300 jobs. A replica with
more could not write its row (error 1406, "Data too long"), so its sweep — the one that
re-runs rounds cut short and keeps the replica on record — failed at every pass (issue
#31, seen at 10,000 jobs). It becomes a ``MEDIUMTEXT`` there (16 MiB: well over 100,000
jobs). PostgreSQL's and SQLite's ``TEXT`` have no such cap: nothing changes on them.

The table holds one small row per live replica: MariaDB rebuilds it in a moment, and a
replica of release 0006 (whose statements never name the column's type) keeps working
beside one of this release.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _on_mysql() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if _on_mysql():
        op.alter_column(
            "cronjob_replica",
            "jobs",
            type_=mysql.MEDIUMTEXT(),
            existing_type=sa.Text(),
            existing_nullable=False,
        )


def downgrade() -> None:
    if _on_mysql():
        op.alter_column(
            "cronjob_replica",
            "jobs",
            type_=sa.Text(),
            existing_type=mysql.MEDIUMTEXT(),
            existing_nullable=False,
        )
