"""Alembic environment of the lease migrations.

Normally run by ``lease.migrate()``, which configures alembic in code and passes its
connection in ``config.attributes["connection"]``: that connection is used as is, under
the lock ``migrate`` holds. Given ``sqlalchemy.url`` instead, the environment opens its
own connection, and in offline mode (``--sql``) it renders the SQL for a DBA to run.

It never calls ``logging.config.fileConfig``: the application's logging is its own.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context
from sqlalchemy.pool import NullPool

from lease._schema import VERSION_TABLE, metadata

config = context.config


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare only the lease tables: the rest of the database is the application's."""
    if type_ == "table":
        return name in metadata.tables
    return True


def run_migrations(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        # SQLite alters a table by copying it; a later migration needs batch mode there.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()
elif (given := config.attributes.get("connection")) is not None:
    run_migrations(given)
else:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(
            "the lease migrations need a connection: run them with lease.migrate(engine)"
        )
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            run_migrations(connection)
    finally:
        engine.dispose()
