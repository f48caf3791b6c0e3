"""A round's send ends at the round's cancellation: with a ``timeout`` below the send's
bound, a broker that accepts the connection and never answers used to keep the round
past its timeout, and 5 s later the replica's process was ended (status 70), with every
other round on it. Now the round ends at its timeout, the send is given up on and its
row kept, and the process lives on; on every database, with Redis behind a proxy that
holds every byte back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob import admin
from cronjob.testing import FakeClock
from tests._proxy import Proxy
from tests.test_outbox_sends import until

rq = pytest.importorskip("rq")
redis = pytest.importorskip("redis")
from cronjob.contrib.rq import enqueue  # noqa: E402

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTE = "0 * * * * *"


@pytest.fixture
def clock() -> FakeClock:
    # Before the fix the round's thread sat in a real-time wait of 20 s (the send's
    # bound) that the fake clock cannot move past: fail in 10 s instead. Now it waits as
    # work for `ANSWER_GRACE` (5 s), then on the clock.
    return FakeClock(START, settle_timeout=10)


@pytest.fixture
def silent() -> Iterator[Proxy]:
    """Redis behind a proxy that accepts connections and answers nothing."""
    proxy = Proxy(("127.0.0.1", 6379))
    proxy.stall()
    yield proxy
    proxy.close()


def unsent(url: str, oid: str) -> sa.RowMapping:
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            table = lease.metadata.tables["cronjob_outbox"]
            return conn.execute(sa.select(table).where(table.c.id == oid)).mappings().one()
    finally:
        engine.dispose()


class TestSendEndsAtTheRoundsCancellation:
    def test_a_timeout_below_the_send_timeout_ends_the_round_not_the_process(
        self, db_url, replicas, clock, silent
    ):
        name, beside = f"export-{uuid.uuid4().hex[:12]}", "beside"
        connection = redis.Redis(port=silent.port)  # no timeout of its own: waits forever
        queue = rq.Queue(f"cronjob-test-{uuid.uuid4().hex[:12]}", connection=connection)
        ran: list[datetime] = []
        exits: list[str] = []
        try:
            registry = cronjob.Registry()
            # A send bound (20 s) past the answer's grace: the round's timeout ends it.
            publish = enqueue(queue, "tests.rq_tasks.traced", hold=60, send_timeout=20)
            registry.register(publish, MINUTE, name, timeout=2)
            registry.register(lambda ctx: ran.append(ctx.instant), MINUTE, beside)
            replicas(registry, "a", on_fatal=exits.append)
            clock.advance(60)  # 09:01: the send waits on the silent broker; 2 s later the timeout
            clock.advance(70)  # far past the 5 s after which a round would end the process
            assert exits == []
            oid = cronjob.occurrence_id(name, START + timedelta(minutes=1))
            row = unsent(db_url, oid)
            assert row["sent_ms"] is None  # kept: the sweep sends it
            assert str(row["error"]).startswith("Cancelled: the wait for rq's answer")
            outcomes = [r.outcome for r in admin.history(db_url, name)]
            assert outcomes[-1].value == "timed_out"  # the 09:01 round, ended at its timeout
            # The replica lives on: its other job's rounds ran, before and after.
            assert ran == [START + timedelta(minutes=m) for m in (1, 2)]
            silent.restore()  # the broker answers at last: the send given up on is marked
            until(lambda: unsent(db_url, oid)["sent_ms"] is not None)
            assert queue.job_ids == [oid]
        finally:
            connection.close()
