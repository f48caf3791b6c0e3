"""On a fake clock, replicas send the claims and the ends of their rounds, no more.

Every replica of a test lives in its process, so the sweeper learns every lease write
from the process itself (``LeaseStore.watch``) and reads the table only when a round may
be owed a second run: a lease given back, or a lease held without its end that may have
expired. These tests count the statements, and check that the rules still hold.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import event

import cronjob
import lease
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Statements:
    """The lease statements sent on the engines given to :meth:`watch`, by kind."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._lock = threading.Lock()

    def watch(self, engine: sa.Engine) -> sa.Engine:
        event.listen(engine, "before_cursor_execute", self._sent)
        return engine

    def _sent(self, _conn, _cursor, statement: str, *_args: object) -> None:
        if "cronjob_lease" not in statement:
            return
        kind = statement.split(None, 1)[0].upper()
        if kind == "WITH" and re.search(r"(?i)\bUPDATE\s+cronjob_lease\b", statement):
            kind = "UPDATE"  # PostgreSQL: a renewal or an end, its rows locked in a CTE first
        if kind == "SELECT" and "token" not in statement:
            # Not a claim's, a renewal's or an end's read-back (MariaDB has no UPDATE ...
            # RETURNING): a sweep's survey, a check of the rows, a start-up read.
            kind = "READ"
        with self._lock:
            self.sent.append(kind)

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return self.sent[mark:]


@pytest.fixture
def engines(db_url: str) -> Iterator[list[sa.Engine]]:
    made = [lease.create_engine(db_url) for _ in range(3)]
    yield made
    for engine in made:
        engine.dispose()


def test_an_idle_fake_day_sends_only_claims_and_ends(engines):
    ran: list[tuple[datetime, str]] = []
    registry = cronjob.Registry()
    registry.register(lambda ctx: ran.append((ctx.instant, ctx.replica)), "0 */15 * * * *", "q")
    registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
    statements, clock = Statements(), FakeClock(START)
    with ExitStack() as stack:
        for r, engine in enumerate(engines):
            stack.enter_context(
                cronjob.Scheduler(
                    statements.watch(engine), registry=registry, clock=clock, replica_id=f"r{r}"
                )
            )
        clock.advance(0)  # started: rows made, first sweep and check done
        mark = len(statements.sent)
        clock.advance(6 * 3600)
        sent = statements.since(mark)
    assert sorted(instant for instant, _ in ran) == [
        START + timedelta(minutes=15 * i) for i in range(1, 25)
    ]
    assert sent.count("READ") == 0, "a sweep or a check read the table"
    # Each instant: one claim per replica (for both jobs on the hour), and the ends: one
    # per instant, two on the hour when the two rounds end in separate batches; and at
    # most once an hour per replica that ended a round, its try for the turn to prune
    # the history (cronjob._history). On MariaDB a claim that won rounds writes their
    # next instants (``due_s``) in a second UPDATE: one per round's claim at most.
    due_writes = 24 + 6 if engines[0].dialect.name == "mysql" else 0
    assert 24 * 3 + 24 <= sent.count("UPDATE") <= 24 * 3 + 24 + 6 + 3 * 7 + due_writes
