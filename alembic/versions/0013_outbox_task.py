"""The outbox knows each occurrence's task, and which ones were resolved obsolete.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-10

- ``cronjob_outbox.task`` (nullable): the task of the schedule made of data an occurrence
  belongs to. Once the schedule is removed, no replica has a job of its name any more;
  the task's publisher (any replica that registers the task) still sends it. The unsent
  rows on record are filled from their schedule's row (kept as a tombstone when removed);
  a registered job's row leaves it NULL.
- ``cronjob_outbox.obsolete_ms`` (nullable): when an unsent occurrence was resolved
  obsolete (its schedule is gone and no live replica registers its task, or for a
  registered job its name): never sent after, and not counted unsent.

Two nullable columns and one update of the unsent rows (a handful): a replica of release
0012 runs beside this one unchanged. Its statements name only its own columns; the rows
it records leave ``task`` NULL (sent, while their schedule exists, as before, by the
replicas that have it); it still counts an obsolete row unsent in its ``status``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Frozen here, not imported from lease._schema: a migration must not change later.
    name = sa.String(200).with_variant(
        mysql.VARCHAR(200, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )
    op.add_column("cronjob_outbox", sa.Column("task", name, nullable=True))
    op.add_column("cronjob_outbox", sa.Column("obsolete_ms", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE cronjob_outbox SET task = (SELECT s.task FROM cronjob_schedule s "
        "WHERE s.id = cronjob_outbox.name) WHERE sent_ms IS NULL"
    )


def downgrade() -> None:
    op.drop_column("cronjob_outbox", "obsolete_ms")
    op.drop_column("cronjob_outbox", "task")
