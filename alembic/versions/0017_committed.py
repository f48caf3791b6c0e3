"""When a schedule made of data's timing was committed, so catch-up owes it from then.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

Adds one nullable column, ``committed_ms`` on ``cronjob_lease``: epoch milliseconds on
the lease clock (or the writer's ``now=``) at which the schedules API committed a
schedule's timing — its add, its add after a removal, a change of its spec, instant or
window. A schedule committed while no replica ran is owed its instants from then, by its
catch-up policy: added at 09:30, replicas back at 11:30, the 11:00 instant runs (or 10:00
then 11:00 with ``catch_up="all"``).

No row is rewritten: NULL means no commit on record, and the catch-up owes nothing
before the row's first deployment, as before this revision. A replica of the previous
release runs beside one of this release unchanged: it never reads the column, and its
writes leave it as it was. A schedule whose timing that release changed keeps the
commit of the timing before, behind the change's ``spec_ms``: a commit older than the
row's latest change is not used (see ``cronjob.engine._committed``). Adding a nullable
column is in place on all three databases (no table rewrite).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Not in a batch: SQLite adds a nullable column in place.
    op.add_column("cronjob_lease", sa.Column("committed_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cronjob_lease") as batch:
        batch.drop_column("committed_ms")
