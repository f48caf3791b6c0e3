"""Jobs of ``bench_isolation``, at module level so a round's child process imports them."""

from __future__ import annotations

import sqlalchemy as sa

import cronjob


def noop(ctx: cronjob.Round) -> None:
    """Nothing: the round's cost is the runner's alone."""


def one_transaction(ctx: cronjob.Round) -> None:
    """One fenced transaction (the child opens its own connection for it)."""
    with ctx.transaction() as conn:
        conn.execute(sa.text("SELECT 1"))
