"""When the round before a claim took its lease, so the claim knows what it kept.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

Adds one nullable column, ``prev_start_ms`` on ``cronjob_lease``: a first run's claim
copies the row's ``last_start_ms`` (when the round before it took the lease) into it
before it writes its own, as it copies the previous instant, state and attempt. With the
row's ``last_end_ms`` it tells a claim how long the round before it held the lease: a
hand-off round that ran past an instant kept that instant from its claims, and the next
claim's round publishes it (``cronjob.engine._owed.owe_ran_over``).

No row is rewritten: NULL means not known, and a claim then owes nothing for the round
before it, as before this revision. A replica of the previous release runs beside one of
this release unchanged: it never reads the column, and its claims leave it as it was (a
value from an earlier claim, older than the round it would describe: the claim after it
then counts that round's lease from its instant). Adding a nullable column is in place on
all three databases (no table rewrite).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Not in a batch: SQLite adds a nullable column in place.
    op.add_column("cronjob_lease", sa.Column("prev_start_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cronjob_lease") as batch:
        batch.drop_column("prev_start_ms")
