"""How a round's child process reaches the database (``isolation="process"``): as the
scheduler's engine does.

A child cannot be handed the parent's engine (its pool and its hooks do not cross a
process), so it makes its own, and it must connect as the parent does, or its fenced
``ctx.transaction()`` would reach another schema, with another role, another isolation
level, or not at all. `ChildDatabase.of` reads, once per scheduler, what the engine
gives its driver, by opening one connection of its own through a copy of the engine's
pool (``Pool.recreate``) while a ``do_connect`` hook (SQLAlchemy's public event, the last
one on the engine) records the driver's arguments:

- the URL (password included) and the **driver's connect arguments** as the engine
  passes them: ``connect_args=`` given to ``create_engine``, what the URL's query says,
  and what the engine's other ``do_connect`` hooks changed (the ``pooler`` parameter
  [lease.create_engine][] takes out, say);
- the **isolation level** of the engine's connections (servers only: on SQLite the
  lease engine's ``BEGIN IMMEDIATE`` recipe governs);
- the engine's **execution options**.

The child builds its engine with [lease.create_engine][] on those (`ChildDatabase.engine`):
the lease settings (SQLite's busy timeout and ``BEGIN IMMEDIATE``, the servers' keepalives)
under what the parent's engine says. What cannot travel to a child is refused there, at
its first ``ctx.transaction()``, with the reason (a round that makes none runs as ever):
an argument that cannot be pickled (an ``ssl.SSLContext``, a class defined in a
function), and an engine that makes its connections itself (``creator=``, or a
``do_connect`` hook that returns one). Other hooks on the parent's engine (a ``connect``
listener that runs ``SET ...``) are code, and are not carried: say it in
``connect_args`` (libpq's ``options``, PyMySQL's ``init_command``) instead.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import event

import lease

if TYPE_CHECKING:
    from sqlalchemy import Engine

__all__ = ["ChildDatabase", "ChildDatabases"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildDatabase:
    """What a child needs to connect as the scheduler's engine does (pickled to it).

    Attributes:
        url: The engine's URL, password included.
        connect_args: The driver's keyword arguments, as the engine passes them.
        isolation_level: The isolation level of the engine's connections; ``None`` on
            SQLite (the lease recipe's).
        execution_options: The engine's execution options.
        refused: Why the child cannot connect as the parent does (its transaction then
            raises it), or ``None``.
    """

    url: str
    connect_args: Mapping[str, Any] = field(default_factory=dict)
    isolation_level: str | None = None
    execution_options: Mapping[str, Any] = field(default_factory=dict)
    refused: str | None = None

    @classmethod
    def of(cls, engine: Engine) -> ChildDatabase:
        """Read how ``engine`` connects (one connection of its own, closed at once).

        Raises:
            Exception: what the driver raised when the connection failed.
        """
        url = engine.url.render_as_string(hide_password=False)
        seen: list[dict[str, Any]] = []

        def record(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
            seen.append(dict(cparams))

        sqlite = engine.dialect.name == "sqlite"
        level: str | None = None
        event.listen(engine, "do_connect", record)
        try:
            pool = engine.pool.recreate()
            try:
                connection = pool.connect()
                try:
                    if not sqlite:
                        level = engine.dialect.get_isolation_level(
                            connection.dbapi_connection  # type: ignore[arg-type]
                        )
                finally:
                    connection.close()
            finally:
                pool.dispose()
        finally:
            event.remove(engine, "do_connect", record)
        options = dict(engine.get_execution_options())
        if not seen:
            return cls(
                url=url,
                refused=(
                    "the scheduler's engine makes its connections itself (a creator= or a "
                    "do_connect hook that returns one), which a child process cannot do"
                ),
            )
        # What the dialect adds of its own (psycopg's adapters map, say) it adds in the
        # child too: only what the engine was given travels.
        own = engine.dialect.create_connect_args(engine.url)[1]
        arguments = {k: v for k, v in seen[-1].items() if k not in own or not _same(own[k], v)}
        stuck = sorted(k for k, v in arguments.items() if not _picklable(v))
        stuck += sorted(f"execution option {k}" for k, v in options.items() if not _picklable(v))
        if stuck:
            return cls(
                url=url,
                refused=(
                    f"the scheduler's engine connects with {', '.join(stuck)}, which cannot "
                    "be pickled to a child process"
                ),
            )
        return cls(
            url=url, connect_args=arguments, isolation_level=level, execution_options=options
        )

    def engine(self) -> Engine:
        """The child's engine, connecting as the parent's does.

        Raises:
            lease.DatabaseError: `refused` says why it cannot, or the URL fails.
        """
        if self.refused is not None:
            raise lease.DatabaseError(
                f"ctx.transaction() in a child process (isolation='process'): {self.refused}"
            )
        options: dict[str, Any] = {"connect_args": dict(self.connect_args)}
        if self.isolation_level is not None:
            options["isolation_level"] = self.isolation_level
        made = lease.create_engine(self.url, **options)
        if self.execution_options:
            made.update_execution_options(**self.execution_options)
        return made


class ChildDatabases:
    """`ChildDatabase.of` the scheduler's engine, read at the first isolated round and
    kept (a failed read is tried again at the next round). Any thread."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._read: ChildDatabase | None = None

    def get(self) -> ChildDatabase:
        """How a child connects; if the engine could not be read now, a `ChildDatabase`
        whose ``refused`` says why."""
        with self._lock:
            if self._read is None:
                try:
                    self._read = ChildDatabase.of(self._engine)
                except Exception as exc:  # the driver's own: not translated at the pool
                    url = self._engine.url.render_as_string(hide_password=False)
                    reason = f"could not read how the scheduler's engine connects: {exc}"
                    return ChildDatabase(url=url, refused=reason)
            return self._read


def _same(a: object, b: object) -> bool:
    with contextlib.suppress(Exception):
        return a is b or bool(a == b)
    return False


def _picklable(value: object) -> bool:
    with contextlib.suppress(Exception):
        pickle.loads(pickle.dumps(value))
        return True
    return False
