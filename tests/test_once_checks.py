"""The ``once`` wrappers of Celery, RQ and Dramatiq check what they run, on each database:
the id must be the one of the message's app, schedule and instant; the instant must be
a firing of the schedule's current spec, unless the round was manual (the trigger each
target carries); an occurrence never started whose schedule nothing names is
acknowledged as obsolete, not run. A job that a replica on a fake clock registers, or a
schedule row, names a schedule; a message without cronjob's fields runs by its id."""

from __future__ import annotations

import types
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.contrib import InvalidOccurrence
from cronjob.contrib._handoff import Occurrence
from cronjob.contrib._instant import format_instant
from cronjob.contrib._validation import claim_of
from cronjob.testing import FakeClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOUR = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = lease.create_engine(db_url)
    lease.migrate(engine)
    yield engine
    engine.dispose()


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def _nothing(ctx: cronjob.Round) -> None:
    """A job the replicas run."""


def hourly_registry(name: str) -> cronjob.Registry:
    registry = cronjob.Registry()
    registry.register(_nothing, "0 0 * * * *", name)
    return registry


def replica_of(replicas, engine: sa.Engine, name: str) -> None:
    """Start a replica (on the fake clock) that registers ``name`` hourly; return once its
    record, which its first sweep writes, names it."""
    import time

    replicas(hourly_registry(name), "a")
    deadline = time.monotonic() + 30
    while lease.definition(engine, name) is None:
        assert time.monotonic() < deadline, "the replica never recorded its jobs"
        time.sleep(0.05)


# What each target's message carries, and how its wrapper finds it on a worker.


def rq_call(monkeypatch, fields: dict[str, Any], occurrence_id: str, body: Callable[[], Any]):
    from cronjob.contrib import rq as target

    meta = {"cronjob": {k: v for k, v in fields.items() if v is not None}}
    job = types.SimpleNamespace(id=occurrence_id, meta=meta)
    monkeypatch.setattr(target, "get_current_job", lambda: job)
    return target.once(database=fields["database"])(lambda: body())()


def dramatiq_call(monkeypatch, fields: dict[str, Any], occurrence_id: str, body: Callable[[], Any]):
    from dramatiq.middleware import CurrentMessage

    from cronjob.contrib.dramatiq import once

    names = {"app": "cronjob_app", "name": "cronjob_name", "instant": "cronjob_instant"}
    names["trigger"] = "cronjob_trigger"
    options = {names[k]: v for k, v in fields.items() if k in names and v is not None}
    message = types.SimpleNamespace(message_id=occurrence_id, actor_name="actor", options=options)
    monkeypatch.setattr(CurrentMessage, "get_current_message", staticmethod(lambda: message))

    def fn() -> Any:
        return body()

    return once(database=fields["database"])(fn)()


def celery_call(monkeypatch, fields: dict[str, Any], occurrence_id: str, body: Callable[[], Any]):
    import celery

    from cronjob.contrib.celery import once

    request = types.SimpleNamespace(id=occurrence_id)
    for key in ("app", "name", "instant", "trigger"):
        if fields.get(key) is not None:
            setattr(request, f"cronjob_{key}", fields[key])
    monkeypatch.setattr(celery, "current_task", types.SimpleNamespace(name="t", request=request))
    return once(database=fields["database"])(lambda: body())()


TARGETS = [
    pytest.param(rq_call, id="rq"),
    pytest.param(dramatiq_call, id="dramatiq"),
    pytest.param(celery_call, id="celery"),
]


@pytest.fixture(params=TARGETS)
def deliver(request, monkeypatch, db_url, engine):
    """``deliver(name, instant, id=None, trigger=None, app="")``: run a body through the
    target's ``once`` as a worker would; returns (what it returned, how often it ran)."""
    call = request.param

    def run(
        name: str,
        instant: datetime,
        *,
        id: str | None = None,
        trigger: str | None = None,
        app: str = "",
    ) -> tuple[Any, int]:
        ran: list[int] = []
        fields = {
            "database": db_url,
            "app": app or None,
            "name": name,
            "instant": format_instant(instant),
            "trigger": trigger,
        }
        id = id or cronjob.occurrence_id(name, instant, app=app)

        def body() -> str:
            ran.append(1)
            return "done"

        return call(monkeypatch, fields, id, body), len(ran)

    return run


class TestChecks:
    def test_a_job_a_fake_clock_replica_registers_is_run(self, deliver, replicas, engine):
        """The replica's record is "seen" in March: no liveness bound makes it obsolete."""
        name = unique("report")
        replica_of(replicas, engine, name)
        assert deliver(name, HOUR) == ("done", 1)
        assert deliver(name, HOUR) == (None, 0)  # a second delivery: once

    def test_a_schedule_row_names_it(self, deliver, engine):
        sid = unique("tenant")
        registry = cronjob.Registry()
        registry.register_task(_nothing, "task")
        cronjob.schedules.add(engine, sid, task="task", spec="0 0 * * * *", registry=registry)
        assert deliver(sid, HOUR) == ("done", 1)

    def test_an_occurrence_nothing_names_is_obsolete_and_not_run(self, deliver, engine):
        name = unique("removed")
        assert deliver(name, HOUR) == (None, 0)
        assert lease.once_state(engine, cronjob.occurrence_id(name, HOUR)) is None

    def test_an_id_that_is_not_the_occurrences_is_refused(self, deliver, replicas, engine):
        name = unique("report")
        replica_of(replicas, engine, name)
        with pytest.raises(InvalidOccurrence, match=r"^occurrence_id 'forged' is not the id"):
            deliver(name, HOUR, id="forged")
        with pytest.raises(InvalidOccurrence, match="is not the id"):
            deliver(name, HOUR, id=cronjob.occurrence_id(name, HOUR), app="other")

    def test_an_instant_that_is_no_firing_is_refused_unless_the_round_was_manual(
        self, deliver, replicas, engine
    ):
        name = unique("report")
        replica_of(replicas, engine, name)
        asked = HOUR + timedelta(minutes=7, seconds=3)
        with pytest.raises(InvalidOccurrence, match=r"is not a firing of .* \(0 0 \* \* \* \*\)$"):
            deliver(name, asked)  # no trigger: a scheduled round, as earlier messages
        with pytest.raises(InvalidOccurrence, match="is not a firing"):
            deliver(name, asked, trigger="backfill")
        assert deliver(name, asked, trigger="manual") == ("done", 1)

    def test_a_manual_round_still_needs_its_id_and_a_name(self, deliver, replicas, engine):
        name = unique("report")
        replica_of(replicas, engine, name)
        asked = HOUR + timedelta(seconds=9)
        with pytest.raises(InvalidOccurrence, match="is not the id"):
            deliver(name, asked, id="forged", trigger="manual")
        assert deliver(unique("gone"), asked, trigger="manual") == (None, 0)

    def test_an_unknown_trigger_is_refused(self, deliver, replicas, engine):
        name = unique("report")
        replica_of(replicas, engine, name)
        with pytest.raises(InvalidOccurrence, match=r"^trigger 'whenever' is not one of "):
            deliver(name, HOUR, trigger="whenever")


def test_a_message_without_cronjobs_fields_has_no_claim():
    assert claim_of(app=None, schedule=None, instant=None, occurrence_id="x") is None


class TestTheTriggerIsCarried:
    """A manual round's message says so, in each target's own place; a scheduled round's
    message is as before (no field)."""

    def occurrence(self, trigger: str) -> Occurrence:
        at = HOUR + timedelta(seconds=5)
        return Occurrence(
            id=cronjob.occurrence_id("n", at), name="n", instant=at, headers={}, trigger=trigger
        )

    def test_dramatiq(self):
        from dramatiq.brokers.stub import StubBroker

        from cronjob.contrib.dramatiq import DramatiqPublisher

        publisher = DramatiqPublisher(StubBroker(), "actor", queue_name="q")
        assert publisher.message(self.occurrence("manual")).options["cronjob_trigger"] == "manual"
        assert "cronjob_trigger" not in publisher.message(self.occurrence("schedule")).options

    def test_stream(self):
        from cronjob.contrib.streams import entry_fields

        assert entry_fields(self.occurrence("manual"))["trigger"] == "manual"
        assert "trigger" not in entry_fields(self.occurrence("schedule"))

    def test_rq(self, redis_url):
        redis = pytest.importorskip("redis")
        import rq

        from cronjob.contrib.rq import RQPublisher

        connection = redis.Redis.from_url(redis_url, socket_timeout=5)
        queue = rq.Queue(unique("cronjob-test-trigger"), connection=connection)
        try:
            manual = self.occurrence("manual")
            RQPublisher(queue, "tests.rq_tasks.counted").publish(manual)
            assert queue.fetch_job(manual.id).meta["cronjob"]["trigger"] == "manual"
        finally:
            queue.empty()
            connection.close()

    def test_celery(self, monkeypatch):
        from celery import Celery

        from cronjob.contrib.celery import CeleryPublisher

        sent: list[dict[str, Any]] = []
        app = Celery("t", broker="memory://")
        monkeypatch.setattr(app, "send_task", lambda *a, **kw: sent.append(kw["headers"]))
        publisher = CeleryPublisher(app, "t.task")
        publisher.publish(self.occurrence("manual"))
        publisher.publish(self.occurrence("schedule"))
        assert sent[0]["cronjob_trigger"] == "manual"
        assert "cronjob_trigger" not in sent[1]
