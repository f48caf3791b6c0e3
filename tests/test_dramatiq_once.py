"""`cronjob.contrib.dramatiq.once`: an actor's body runs once per message id, on a real
``dramatiq`` worker (Redis) and each lease database.

The worker's side is tests/dramatiq_worker.py (actor ``cronjob_test_once``). The core,
`cronjob.contrib._once.run_once`, comes with the outbox: until it is merged, the tests
that run a worker fail with its import error.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

import cronjob
from cronjob.contrib._handoff import Occurrence
from cronjob.contrib.dramatiq import DramatiqPublisher, once
from tests import _dramatiq
from tests._dramatiq import publisher_broker, reachable, worker

INSTANT = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
NAME = "nightly-export"
ONCE = "cronjob_test_once"
OCCURRENCE = Occurrence(
    id=cronjob.occurrence_id(NAME, INSTANT), name=NAME, instant=INSTANT, headers={}
)


class TestDecorator:
    def test_it_keeps_the_functions_name_so_the_actor_name_is_unchanged(self):
        def export() -> None: ...

        assert once(export).__name__ == "export"
        assert once(database="sqlite://")(export).__name__ == "export"

    def test_it_refuses_an_async_function_when_it_decorates(self):
        async def export() -> None: ...

        with pytest.raises(TypeError, match=r"^once: .*export is async; once runs sync actors"):
            once(export)

    @pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "60", None])
    def test_it_refuses_a_stale_time_that_is_not_positive_seconds_when_it_decorates(self, bad):
        with pytest.raises(ValueError, match=rf"^once: stale_after must be .* got {bad!r}$"):
            once(stale_after=bad)

    def test_a_call_without_a_current_message_names_the_middleware_to_add(self):
        @once
        def export() -> None: ...

        with pytest.raises(
            RuntimeError,
            match=r"^once: .*export has no current Dramatiq message; add "
            r"dramatiq\.middleware\.CurrentMessage\(\) to the broker's middleware$",
        ):
            export()


@pytest.fixture
def queue() -> Iterator[str]:
    reachable("redis")
    name = _dramatiq.new_queue()
    yield name
    _dramatiq.remove_queue("redis", name)


@pytest.fixture
def publisher(queue: str) -> Iterator[DramatiqPublisher]:
    broker = publisher_broker("redis")
    yield DramatiqPublisher(broker, ONCE, queue_name=queue, kwargs={"fail_first": False})
    broker.close()


class TestOnTheWorker:
    def test_a_message_delivered_twice_runs_its_body_once(
        self, db_url: str, migrated_engine: sa.Engine, queue, publisher, tmp_path
    ):
        env = {"DRAMATIQ_TEST_DATABASE": db_url}
        with worker("redis", queue, tmp_path, env) as running:
            publisher.publish(OCCURRENCE)
            running.wait_processed(1)
            publisher.publish(OCCURRENCE)
            processed = running.wait_processed(2)
            seen = running.seen()
        assert [p["error"] for p in processed] == [None, None]
        assert [p["result"] for p in processed] == ["done", None]
        assert [s["message_id"] for s in seen] == [OCCURRENCE.id]

    def test_a_body_that_raised_runs_again_on_the_retry_and_then_never(
        self, db_url: str, migrated_engine: sa.Engine, queue, tmp_path
    ):
        broker = publisher_broker("redis")
        publisher = DramatiqPublisher(broker, ONCE, queue_name=queue, kwargs={"fail_first": True})
        env = {
            "DRAMATIQ_TEST_DATABASE": db_url,
            "DRAMATIQ_TEST_FAIL_FIRST": str(tmp_path / "failed-once"),
        }
        try:
            with worker("redis", queue, tmp_path, env) as running:
                publisher.publish(OCCURRENCE)
                first = running.wait_processed(2)  # the failure, then Dramatiq's retry
                publisher.publish(OCCURRENCE)
                processed = running.wait_processed(3)
                seen = running.seen()
        finally:
            broker.close()
        assert [p["error"] for p in first] == ["RuntimeError('the first run fails')", None]
        assert [p["result"] for p in first] == [None, "done"]
        assert processed[2]["result"] is None
        assert [s["message_id"] for s in seen] == [OCCURRENCE.id] * 2
