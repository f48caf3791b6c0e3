"""Missed instants acknowledged by an operator, so they stop raising the alarm.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-14

Adds four nullable columns to ``cronjob_lease``: ``acked_s`` (epoch seconds: every
instant up to it that no round ran stops counting as missed), ``acked_ms`` (when, epoch
milliseconds on the lease clock), ``acked_by`` (who) and ``ack_reason`` (why), written by
``cronjob missed NAME --ack`` (`cronjob.admin.acknowledge`); the history gets a note
(``why`` ``'ack'``) of each.

No row is rewritten: NULL means nothing acknowledged, as before this revision. A replica
of the previous release runs beside one of this release unchanged: replicas never write
these columns. Adding nullable columns is in place on all three databases.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: As ``lease._text.HOLDER_LENGTH`` and ``lease._schema.REASON_LENGTH`` at this revision.
_HOLDER_LENGTH = 255
_REASON_LENGTH = 200


def upgrade() -> None:
    # Not in a batch: SQLite adds a nullable column in place.
    for column in (
        sa.Column("acked_s", sa.BigInteger(), nullable=True),
        sa.Column("acked_ms", sa.BigInteger(), nullable=True),
        sa.Column("acked_by", sa.String(_HOLDER_LENGTH), nullable=True),
        sa.Column("ack_reason", sa.String(_REASON_LENGTH), nullable=True),
    ):
        op.add_column("cronjob_lease", column)


def downgrade() -> None:
    with op.batch_alter_table("cronjob_lease") as batch:
        for column in ("ack_reason", "acked_by", "acked_s", "acked_ms"):
            batch.drop_column(column)
