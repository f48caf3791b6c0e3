"""``cronjob.contrib.celery.once``: a task's body runs once per task id on a real worker.

NOTE: ``once`` runs through ``cronjob.contrib._once.run_once``, which the outbox branch
provides; until it is merged the worker tests fail at their first line (they are not
skipped on purpose: the merge makes them run)."""

from __future__ import annotations

import importlib
import inspect
from datetime import UTC, datetime

import pytest
from celery import Celery

import cronjob
import lease
from cronjob.contrib._handoff import Occurrence
from cronjob.contrib.celery import CeleryPublisher, once
from tests._celery import BROKERS, client_app, delete_queue, new_queue, require_broker
from tests._celery import start_worker as _start_worker

INSTANT = datetime(2026, 3, 8, 6, 0, tzinfo=UTC)


@pytest.fixture(params=BROKERS)
def broker_url(request: pytest.FixtureRequest) -> str:
    url: str = request.param
    require_broker(url)
    return url


@pytest.fixture
def worker(broker_url, db_url, tmp_path, monkeypatch):
    importlib.import_module("cronjob.contrib._once")  # the outbox branch's (see above)
    engine = lease.create_engine(db_url)
    try:
        lease.migrate(engine)
    finally:
        engine.dispose()
    monkeypatch.setenv("CELERY_TEST_DB", db_url)
    queue = new_queue()
    try:
        yield from _start_worker(broker_url, queue, tmp_path)
    finally:
        delete_queue(broker_url, queue)


def occurrence(instant: datetime = INSTANT) -> Occurrence:
    return Occurrence(
        id=cronjob.occurrence_id("nightly", instant), name="nightly", instant=instant, headers={}
    )


def send_twice(broker_url: str, task: str, queue: str, *args) -> str:
    """Publish the same occurrence twice: what a redelivery looks like to the worker."""
    sent = occurrence()
    publisher = CeleryPublisher(client_app(broker_url), task, args=args, options={"queue": queue})
    publisher.publish(sent)
    publisher.publish(sent)
    publisher.close()
    return sent.id


def queue_of(worker) -> str:
    return worker.process.args[worker.process.args.index("-Q") + 1]


class TestOnAWorker:
    def test_the_body_runs_once_for_two_deliveries_of_one_id(self, broker_url, worker):
        sent = send_twice(broker_url, "cronjob_test.once_record", queue_of(worker), 1)
        [ran] = worker.wait_for(1)
        assert ran == {"id": sent, "args": [1]}
        # The second delivery is consumed without running the body: a third message
        # with another id proves the worker has gone past it.
        publisher = CeleryPublisher(
            client_app(broker_url), "cronjob_test.once_record", options={"queue": queue_of(worker)}
        )
        later = INSTANT.replace(hour=7)
        publisher.publish(
            Occurrence(
                id=cronjob.occurrence_id("nightly", later),
                name="nightly",
                instant=later,
                headers={},
            )
        )
        publisher.close()
        assert [r["id"] for r in worker.wait_for(2)] == [
            sent,
            cronjob.occurrence_id("nightly", later),
        ]

    def test_a_body_that_raised_runs_again_on_the_redelivery(self, broker_url, worker, tmp_path):
        marker = str(tmp_path / "marker")
        send_twice(broker_url, "cronjob_test.once_flaky", queue_of(worker), marker)
        assert worker.wait_for(1) == [{"marker": marker}]
        attempts = (worker.log.parent / (worker.log.name + ".attempts")).read_text().splitlines()
        assert len(attempts) == 2


class TestOutsideAWorker:
    def test_a_direct_call_runs_the_body(self):
        app = Celery("once-direct", broker="memory://", set_as_current=False)

        @app.task(name="direct")
        @once
        def direct(x: int) -> int:
            return x * 2

        assert direct(21) == 42

    @pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "60", None])
    def test_it_refuses_a_stale_time_that_is_not_positive_seconds_when_it_decorates(self, bad):
        with pytest.raises(ValueError, match=rf"^once: stale_after must be .* got {bad!r}$"):
            once(stale_after=bad)

    def test_it_keeps_the_tasks_signature(self):
        @once(database="sqlite://")
        def body(a: int, *, b: str = "x") -> str:
            return b * a

        assert list(inspect.signature(body).parameters) == ["a", "b"]
        assert body.__name__ == "body"
