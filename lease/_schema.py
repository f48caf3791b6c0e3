"""The lease table: the package's one :class:`~sqlalchemy.MetaData` and its table.

``alembic/env.py`` targets :data:`metadata`, and a test checks that the migrations
produce exactly this definition on every supported database.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from ._text import HOLDER_LENGTH

__all__ = [
    "NAME_LENGTH",
    "NEVER",
    "TABLE_NAME",
    "VERSION_TABLE",
    "lease_table",
    "metadata",
]

#: The name of the lease table.
TABLE_NAME = "cronjob_lease"
#: The alembic version table of these migrations; the application's own
#: ``alembic_version`` is never touched.
VERSION_TABLE = "cronjob_alembic_version"
#: The longest name a lease can have, in characters.
NAME_LENGTH = 200
#: The ``instant`` of a row whose lease was never claimed.
NEVER = -1

metadata = sa.MetaData()

# MySQL/MariaDB compare strings case-insensitively under their default collations, so
# "Report" and "report" would share one row; names are identifiers and compare by their
# bytes, as on PostgreSQL and SQLite.
_Name = sa.String(NAME_LENGTH).with_variant(
    mysql.VARCHAR(NAME_LENGTH, charset="utf8mb4", collation="utf8mb4_bin"),
    "mysql",
    "mariadb",
)

lease_table = sa.Table(
    TABLE_NAME,
    metadata,
    # One row per lease name.
    sa.Column("name", _Name, primary_key=True),
    # Epoch seconds (UTC) of the latest claimed instant; NEVER until the first claim.
    sa.Column("instant", sa.BigInteger(), nullable=False),
    # 1 for a first run of the instant, 2 for its second run.
    sa.Column("attempt", sa.SmallInteger(), nullable=False),
    # 'new', 'running', 'done' or 'cut' (see lease.LeaseState). A plain string rather
    # than a native enum or a CHECK, so a hand-edited row can be read, logged and
    # skipped instead of breaking every reader.
    sa.Column("state", sa.String(16), nullable=False),
    # The fencing token: a fresh random 63-bit value on every claim.
    sa.Column("token", sa.BigInteger(), nullable=False),
    # The replica holding (or that last held) the lease.
    sa.Column("holder", sa.String(HOLDER_LENGTH), nullable=True),
    # Lease expiry in epoch milliseconds on the lease clock; NULL when not held.
    sa.Column("expires_ms", sa.BigInteger(), nullable=True),
    # Epoch seconds: a round that ran to its end records its end here; every instant
    # up to it that the round overran stays skipped.
    sa.Column("skipped_through", sa.BigInteger(), nullable=True),
    # What the row held before the latest claim, so a claimer can tell it superseded
    # an unfinished round.
    sa.Column("prev_instant", sa.BigInteger(), nullable=True),
    sa.Column("prev_state", sa.String(16), nullable=True),
    sa.Column("prev_attempt", sa.SmallInteger(), nullable=True),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)
