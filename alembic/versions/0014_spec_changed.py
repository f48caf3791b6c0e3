"""When each lease row's timing last changed, so missed instants are counted from it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07

Adds one nullable column, ``spec_ms`` on ``cronjob_lease``: epoch milliseconds on the
lease clock at which the schedule the row stands for last changed its timing — a
registered job's spec deployed in place of another, a data schedule's spec, one-off
instant or start/end changed. ``status`` counts missed instants only from it (and
the catch-up's metric too): the instants of the schedule as it was before are not the
current schedule's to have run.

No row is rewritten: NULL means no change on record, and the counting falls back to
the row's deployment as before. A replica of the previous release runs beside one of
this release unchanged: it never writes the column (its spec writes leave it as it
was, which can only make the count start earlier, as before this revision). Adding a
nullable column is in place on all three databases (no table rewrite).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Not in a batch: SQLite adds a nullable column in place.
    op.add_column("cronjob_lease", sa.Column("spec_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cronjob_lease") as batch:
        batch.drop_column("spec_ms")
