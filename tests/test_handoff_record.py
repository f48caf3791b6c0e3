"""A hand-off round's record: one transaction, fenced by one check of the round's lease
that locks its row until the commit (shared with the records of the other rounds writing
theirs meanwhile: tests/test_group_record.py).

On every database, on a fake clock, with a publisher of the test's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.contrib import Handoff, handoff
from tests.test_handoff_rounds import EVERY_5S, START, Publisher, outbox

FIVE = START + timedelta(seconds=5)


@pytest.fixture
def name() -> str:
    return f"export-{uuid.uuid4().hex[:12]}"


class Stealing(Handoff):
    """A hand-off whose lease's token changes just before its record is written, as
    another claim's would."""

    url = ""

    def __call__(self, ctx: cronjob.Round) -> None:
        table = lease.metadata.tables["cronjob_lease"]
        engine = lease.create_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    table.update().where(table.c.name == ctx.name).values(token=table.c.token + 1)
                )
        finally:
            engine.dispose()
        super().__call__(ctx)


@pytest.fixture
def holds_checks(db_url: str) -> Iterator[list[str]]:
    """The lease checks of records (``SELECT name, token FROM cronjob_lease WHERE ...
    expires_ms ...``) every engine runs."""
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        flat = " ".join(statement.split()).lower()
        if (
            flat.startswith("select cronjob_lease.name, cronjob_lease.token from cronjob_lease")
            and "expires_ms >" in flat
        ):
            seen.append(flat)

    sa.event.listen(sa.Engine, "before_cursor_execute", note)
    yield seen
    sa.event.remove(sa.Engine, "before_cursor_execute", note)


def test_a_round_s_record_checks_its_lease_in_one_statement(
    db_url, replicas, clock, name, holds_checks
):
    publisher = Publisher(clock)
    registry = cronjob.Registry()
    registry.register(handoff(publisher), EVERY_5S, name)
    replicas(registry, "a")
    clock.advance(4)
    holds_checks.clear()
    clock.advance(2)  # 09:00:05
    assert [o.instant for o in publisher.sent] == [FIVE]
    assert outbox(db_url)[FIVE]["sent_ms"] is not None
    assert len(holds_checks) == 1, holds_checks


def test_a_lease_taken_before_the_record_is_written_records_nothing(db_url, replicas, clock, name):
    publisher = Publisher(clock)
    job = Stealing(publisher)
    job.url = db_url
    registry = cronjob.Registry()
    registry.register(job, EVERY_5S, name)
    replicas(registry, "a")
    clock.advance(6)  # 09:00:05: its lease taken as it starts
    assert publisher.sent == []
    assert FIVE not in outbox(db_url)  # nothing recorded, nothing sent
