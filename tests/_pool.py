"""Databases at head for ``db_url``, made once and taken back between the tests of one
pytest process.

A test that takes ``db_url`` gets a database whose lease tables are at head, empty, with
the seed row and the identities at 1: what `lease.migrate` leaves in a new database (a
test marked ``blank_database`` gets an empty database instead, without the tables, as
``postgres_url`` and the others give). Creating the tables costs about 0.15 s of CPU on
PostgreSQL and 0.1 s on MariaDB, server and client, for each of the suite's thousands of
tests on them; taking a database back costs a third as much.

After the test, a server database is taken back only if it holds exactly the tables, the
columns and the indexes that the first one held, at head. It is first moved to a new
name (a PostgreSQL schema renamed; MariaDB's tables renamed into a new database), so a
process the test left behind (a killed replica's last statement) can no longer reach it:
its connections name the old one. Then its tables are locked (PostgreSQL), which waits
out any statement still writing, and emptied, the seed row written again and the
identities set back to 1. Anything else (a table of the test's
own, a column dropped, an older revision, a lock not had within seconds) drops it, as a
blank database is dropped. (MariaDB's rename itself waits out the transactions on its
tables.) SQLite copies a file at head, made once per process.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import lease

__all__ = ["AtHead", "drop_schema", "scratch_name"]

#: The lease tables that hold rows a test may write (the version row stays).
_EMPTIED = [t.name for t in lease.metadata.sorted_tables]
#: The identity columns, which a new database starts at 1.
_IDENTITY = [
    (t.name, t.autoincrement_column.name)
    for t in lease.metadata.sorted_tables
    if t.autoincrement_column is not None
]
_VERSION = "cronjob_alembic_version"
_SEED = "INSERT INTO cronjob_schedule_rev (id, rev) VALUES (1, 0)"


def scratch_name() -> str:
    """A new name for a test's schema or database."""
    return f"lease_test_{uuid.uuid4().hex[:16]}"


def drop_schema(url: str, schema: str) -> None:
    """Drop a test's schema on the PostgreSQL server at ``url``; a deadlock with a process
    of the test still finishing its last statement there (a killed child's replica, seen
    once in CI) is tried again."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        for attempt in range(3):
            try:
                with engine.begin() as conn:
                    conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
                return
            except sa.exc.OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 2:
                    raise
                time.sleep(0.5)
    finally:
        engine.dispose()


class AtHead:
    """The databases at head of one pytest process (see the module's docstring).

    Args:
        postgres: The PostgreSQL server's URL (its database holds the schemas).
        mysql: The MariaDB server's URL (its databases are made beside the one named).
    """

    def __init__(self, *, postgres: str, mysql: str) -> None:
        self._urls = {"postgres": postgres, "mysql": mysql}
        self._free: dict[str, list[str]] = {"postgres": [], "mysql": []}
        self._shape: dict[str, list[tuple[str, ...]]] = {}
        self._sqlite: Path | None = None
        self._admin: dict[str, sa.Engine] = {}

    @contextlib.contextmanager
    def database(self, kind: str, where: Path) -> Iterator[str]:
        """A URL of a database of ``kind`` (``sqlite``, ``postgres``, ``mysql``) at head,
        empty, for one test; ``where`` holds a SQLite file."""
        if kind == "sqlite":
            yield self._sqlite_copy(where)
            return
        name = self._free[kind].pop() if self._free[kind] else self._new(kind)
        try:
            yield self._url(kind, name)
        finally:
            self._take_back(kind, name)

    def close(self) -> None:
        """Drop the databases kept for a next test."""
        for kind, names in self._free.items():
            for name in names:
                self._drop(kind, name)
            names.clear()
        for engine in self._admin.values():
            engine.dispose()
        if self._sqlite is not None:
            shutil.rmtree(self._sqlite.parent, ignore_errors=True)

    def _sqlite_copy(self, where: Path) -> str:
        if self._sqlite is None:
            made = Path(tempfile.mkdtemp(prefix="cronjob-at-head-")) / "lease.sqlite"
            engine = lease.create_engine(f"sqlite:///{made}")
            try:
                lease.migrate(engine)
            finally:
                engine.dispose()
            self._sqlite = made
        path = where / "lease.sqlite"
        shutil.copyfile(self._sqlite, path)
        return f"sqlite:///{path}"

    def _url(self, kind: str, name: str) -> str:
        url = sa.make_url(self._urls[kind])
        if kind == "postgres":
            url = url.update_query_dict({"options": f"-csearch_path={name}"})
        else:
            url = url.set(database=name)
        return url.render_as_string(hide_password=False)

    def _engine(self, kind: str) -> sa.Engine:
        if kind not in self._admin:
            self._admin[kind] = sa.create_engine(self._urls[kind], poolclass=NullPool)
        return self._admin[kind]

    def _new(self, kind: str) -> str:
        name = scratch_name()
        create = "SCHEMA" if kind == "postgres" else "DATABASE"
        with self._engine(kind).begin() as conn:
            conn.execute(sa.text(f"CREATE {create} {name}"))
        engine = lease.create_engine(self._url(kind, name))
        try:
            lease.migrate(engine)
        finally:
            engine.dispose()
        if kind not in self._shape:
            self._shape[kind] = self._read_shape(kind, name)
        return name

    def _read_shape(self, kind: str, name: str) -> list[tuple[str, ...]]:
        """The tables, columns and indexes of ``name``, with its own name written out."""
        with self._engine(kind).connect() as conn:
            columns = conn.execute(
                sa.text(
                    "SELECT table_name, column_name, data_type, is_nullable,"
                    " COALESCE(column_default, '') FROM information_schema.columns"
                    " WHERE table_schema = :name ORDER BY 1, 2"
                ),
                {"name": name},
            )
            shape = [tuple(str(v) for v in row) for row in columns]
            if kind == "postgres":
                indexes = conn.execute(
                    sa.text(
                        "SELECT tablename, indexname, indexdef FROM pg_indexes"
                        " WHERE schemaname = :name ORDER BY 1, 2"
                    ),
                    {"name": name},
                )
                other = conn.execute(
                    sa.text(
                        "SELECT relname, relkind::text, '' FROM pg_class"
                        " WHERE relnamespace = CAST(:name AS regnamespace)"
                        " AND relkind NOT IN ('r', 'i', 'S', 't') ORDER BY 1"
                    ),
                    {"name": name},
                )
            else:
                indexes = conn.execute(
                    sa.text(
                        "SELECT table_name, index_name, GROUP_CONCAT(column_name ORDER BY"
                        " seq_in_index) FROM information_schema.statistics"
                        " WHERE table_schema = :name GROUP BY 1, 2 ORDER BY 1, 2"
                    ),
                    {"name": name},
                )
                other = conn.execute(
                    sa.text(
                        "SELECT table_name, table_type, '' FROM information_schema.tables"
                        " WHERE table_schema = :name AND table_type <> 'BASE TABLE'"
                    ),
                    {"name": name},
                )
            shape += [tuple(str(v) for v in row) for row in (*indexes, *other)]
            version = conn.execute(sa.text(f"SELECT version_num FROM {name}.{_VERSION}"))
            shape.append(("version", *(str(v) for (v,) in version)))
        # A schema's own name appears in defaults (a sequence's) and index definitions.
        return [tuple(re.sub(re.escape(name), "<db>", v) for v in row) for row in shape]

    def _take_back(self, kind: str, name: str) -> None:
        try:
            if self._read_shape(kind, name) != self._shape[kind]:
                raise LookupError("changed")
            moved = self._move(kind, name)
        except (LookupError, sa.exc.SQLAlchemyError):
            self._drop(kind, name)
            return
        try:
            self._empty(kind, moved)
        except sa.exc.SQLAlchemyError:
            self._drop(kind, moved)
            return
        self._free[kind].append(moved)

    def _move(self, kind: str, name: str) -> str:
        moved = scratch_name()
        with self._engine(kind).begin() as conn:
            if kind == "postgres":
                conn.execute(sa.text(f"ALTER SCHEMA {name} RENAME TO {moved}"))
                return moved
            conn.execute(sa.text(f"CREATE DATABASE {moved} CHARACTER SET utf8mb4"))
            tables = [*_EMPTIED, _VERSION]
            pairs = ", ".join(f"{name}.{t} TO {moved}.{t}" for t in tables)
            try:
                conn.execute(sa.text("SET SESSION lock_wait_timeout = 5"))
                conn.execute(sa.text(f"RENAME TABLE {pairs}"))
            except sa.exc.SQLAlchemyError:
                conn.execute(sa.text(f"DROP DATABASE {moved}"))
                raise
            conn.execute(sa.text(f"DROP DATABASE {name}"))
        return moved

    def _empty(self, kind: str, name: str) -> None:
        with self._engine(kind).begin() as conn:
            if kind == "postgres":
                conn.execute(sa.text("SET LOCAL lock_timeout = '5s'"))
                listed = ", ".join(f"{name}.{t}" for t in _EMPTIED)
                conn.execute(sa.text(f"LOCK TABLE {listed} IN ACCESS EXCLUSIVE MODE"))
            for table in _EMPTIED:
                conn.execute(sa.text(f"DELETE FROM {name}.{table}"))
            for table, column in _IDENTITY:
                if kind == "postgres":
                    conn.execute(
                        sa.text(
                            f"SELECT setval(pg_get_serial_sequence('{name}.{table}',"
                            f" '{column}'), 1, false)"
                        )
                    )
                else:
                    conn.execute(sa.text(f"ALTER TABLE {name}.{table} AUTO_INCREMENT = 1"))
            conn.execute(sa.text(_SEED.replace("INTO ", f"INTO {name}.")))

    def _drop(self, kind: str, name: str) -> None:
        if kind == "postgres":
            drop_schema(self._urls[kind], name)
            return
        with self._engine(kind).begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
