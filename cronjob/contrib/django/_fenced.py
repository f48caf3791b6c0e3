"""``fenced(ctx)``: a Django ORM transaction that commits only while the round holds
its lease."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..._round import Round
from ._database import database_alias

if TYPE_CHECKING:
    from sqlalchemy import Dialect, Select

__all__ = ["fenced"]


@contextlib.contextmanager
def fenced(ctx: Round, *, using: str | None = None) -> Iterator[None]:
    """Run the block in ``transaction.atomic()``, fenced by ``ctx``'s lease.

    Like ``ctx.transaction()`` for the Django ORM: inside the transaction, on Django's
    own connection, it checks that the round still holds its lease (the same statement,
    the row's fencing token) when the block starts and again just before it commits,
    and raises [cronjob.LeaseLost][] otherwise, rolling the block's writes back.
    A per-instance round, or one built by ``cronjob.testing.make_round``, gets a plain
    ``atomic()``. As Django does around a request, connections of the job's thread that
    are past ``CONN_MAX_AGE`` (with the default 0, all of them) are closed before the
    block and after it.

    Args:
        ctx: The round the job received.
        using: The ``DATABASES`` alias; by default ``CRONJOB_DATABASE`` (``"default"``).
            The lease table must live in that database.

    Raises:
        cronjob.LeaseLost: the lease is gone (the block's work is rolled back).
        RuntimeError: called inside an ``atomic()`` block: the fence would guard a
            savepoint, and the outer transaction would commit unchecked.
    """
    from django.db import close_old_connections, connections, transaction

    alias = using if using is not None else database_alias()
    connection = connections[alias]
    if connection.in_atomic_block:
        raise RuntimeError(
            f"job {ctx.name!r}: fenced() must open the transaction itself, not a savepoint "
            "inside an atomic() block (the outer commit would not be checked)"
        )
    # Each block is to the job's worker thread what a request is to a web worker:
    # connections past CONN_MAX_AGE (by default, every one) are closed before and after.
    close_old_connections()
    try:
        with transaction.atomic(using=alias):
            _check(ctx, connection, final=False)
            yield
            _check(ctx, connection, final=True)
    finally:
        close_old_connections()


def _check(ctx: Round, connection: Any, *, final: bool) -> None:
    fence = ctx._fence
    if fence is None:  # no lease behind this round
        return
    dialect = _dialect(connection.vendor)

    def fetch(statement: Select[int]) -> bool:
        compiled = statement.compile(dialect=dialect)
        params = [compiled.params[key] for key in compiled.positiontup or ()]
        with connection.cursor() as cursor:
            cursor.execute(str(compiled), params)
            return cursor.fetchone() is not None

    fence(ctx, dialect, fetch, final)


def _dialect(vendor: str) -> Dialect:
    """A SQLAlchemy dialect for Django's ``vendor``, with Django's ``%s`` placeholders."""
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    modules = {"postgresql": postgresql, "mysql": mysql, "sqlite": sqlite}
    if vendor not in modules:
        raise RuntimeError(f"cronjob cannot check leases on a {vendor!r} database")
    dialect: Dialect = modules[vendor].dialect(paramstyle="format")
    return dialect
