"""What the scheduler did, read back as OpenTelemetry metrics with the SDK's in-memory reader.

Each replica gets a meter provider of its own (as each process would), so a test can tell
which replica counted what; the deployment's figure is the sum over replicas. Everything
runs on a fake clock: durations and lateness are exact.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

import cronjob
import lease
from cronjob import Registry, Scheduler, admin
from cronjob.testing import FakeClock

#: A Monday, on the hour.
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

Point = dict[str, str]


@dataclass
class Replica:
    """A scheduler with a meter provider of its own, and what it measured."""

    scheduler: Scheduler
    reader: InMemoryMetricReader = field(repr=False)

    def _data_points(self, name: str, attributes: dict[str, str]) -> Iterator[tuple[Point, Any]]:
        """The data points of metric ``name`` whose attributes include ``attributes``
        (keyword style: ``cronjob_job`` stands for ``cronjob.job``)."""
        wanted = {key.replace("_", "."): value for key, value in attributes.items()}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        found = {k: str(v) for k, v in (point.attributes or {}).items()}
                        if wanted.items() <= found.items():
                            yield found, point

    def points(self, name: str) -> list[tuple[Point, float]]:
        """The data points of ``name``: (attributes, value, or a histogram's sum)."""
        return [
            (found, point.sum if isinstance(point, HistogramDataPoint) else point.value)
            for found, point in self._data_points(name, {})
        ]

    def value(self, name: str, **attributes: str) -> float:
        """The sum of ``name`` (values, or histogram sums) over the points that match."""
        return sum(
            point.sum if isinstance(point, HistogramDataPoint) else point.value
            for _found, point in self._data_points(name, attributes)
        )

    def count(self, name: str, **attributes: str) -> int:
        """How many measurements histogram ``name`` recorded, over the points that match."""
        return sum(point.count for _found, point in self._data_points(name, attributes))


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def any_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.sqlite'}"
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.sqlite'}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def replicas(clock: FakeClock) -> Iterator[Callable[..., Replica]]:
    """Start replicas, each measured by its own in-memory reader; stop them at the end."""
    started: list[Scheduler] = []

    def start(url: str, registry: Registry, replica_id: str, **options) -> Replica:
        reader = InMemoryMetricReader()
        scheduler = Scheduler(
            url,
            registry=registry,
            clock=clock,
            replica_id=replica_id,
            meter_provider=MeterProvider(metric_readers=[reader]),
            **options,
        )
        scheduler.start()
        started.append(scheduler)
        return Replica(scheduler, reader)

    yield start
    for scheduler in started:
        with contextlib.suppress(Exception):
            scheduler.stop()


def total(replicas: list[Replica], name: str, **attributes: str) -> float:
    return sum(replica.value(name, **attributes) for replica in replicas)


def lasting(seconds: float) -> Callable[[cronjob.Round], None]:
    """A job that works ``seconds`` on the clock and stops early, cut short, when cancelled."""

    def job(ctx: cronjob.Round) -> None:
        if ctx.wait(seconds):
            ctx.check()

    return job


class Boom(Exception):
    pass


def failing(ctx: cronjob.Round) -> None:
    raise Boom("no invoices today")


class TestRounds:
    def test_each_round_is_counted_once_across_three_replicas_by_job_and_outcome(
        self, any_url, replicas, clock
    ):
        registry = Registry()
        registry.register(lasting(30), "0 0 * * * *", "report")
        registry.register(failing, "0 30 * * * *", "invoices")
        three = [replicas(any_url, registry, r) for r in "abc"]
        clock.advance(3 * 3600 + 60)  # 10:00, 11:00, 12:00 and 09:30, 10:30, 11:30
        rounds = functools.partial(total, three, "cronjob.rounds")
        assert rounds(cronjob_job="report") == 3
        assert rounds(cronjob_job="report", cronjob_outcome="succeeded") == 3
        assert rounds(cronjob_job="invoices") == 3
        assert rounds(cronjob_job="invoices", cronjob_outcome="failed") == 3
        failed = [
            point
            for replica in three
            for point, value in replica.points("cronjob.rounds")
            if point.get("cronjob.outcome") == "failed" and value
        ]
        assert failed and all(p["error.type"] == "test_metrics.Boom" for p in failed)
        assert total(three, "cronjob.round.active") == 0

    def test_an_error_type_is_on_each_round_that_ended_in_error_and_only_there(
        self, url, replicas, clock
    ):
        registry = Registry()
        registry.register(failing, "0 0 * * * *", "invoices", retries=1, retry_backoff=1)
        registry.register(lasting(60), "0 0 * * * *", "slow", timeout=30)
        registry.register(lasting(10), "0 0 * * * *", "quick")
        a = replicas(url, registry, "a")
        clock.advance(3600 + 120)  # 10:00: two attempts of invoices, slow cut at 30 s
        kinds = {
            (point["cronjob.job"], point["cronjob.outcome"]): point.get("error.type")
            for point, value in a.points("cronjob.rounds")
            if value
        }
        assert kinds == {
            ("invoices", "retrying"): "test_metrics.Boom",
            ("invoices", "failed"): "test_metrics.Boom",
            ("slow", "timed_out"): "timeout",
            ("quick", "succeeded"): None,
        }

    def test_duration_and_lateness_are_seconds_on_the_clock(self, url, replicas, clock):
        registry = Registry()
        registry.register(lasting(30), "0 0 * * * *", "report")
        a = replicas(url, registry, "a")
        clock.advance(2 * 3600 + 60)  # 10:00 and 11:00, 30 s each
        assert a.count("cronjob.round.duration", cronjob_job="report") == 2
        assert a.value("cronjob.round.duration", cronjob_outcome="succeeded") == 60
        assert a.count("cronjob.round.lateness", cronjob_reason="schedule") == 2
        assert a.value("cronjob.round.lateness") == 0  # a fake clock starts rounds on time

    def test_a_round_running_now_is_active_until_it_ends(self, url, replicas, clock):
        registry = Registry()
        registry.register(lasting(30), "0 0 * * * *", "report")
        a = replicas(url, registry, "a")
        clock.advance(3600 + 10)
        assert a.value("cronjob.round.active", cronjob_job="report") == 1
        clock.advance(20)
        assert a.value("cronjob.round.active", cronjob_job="report") == 0

    def test_a_replica_starts_each_jobs_success_count_at_zero(self, url, replicas):
        registry = Registry()
        registry.register(failing, "0 0 * * * *", "invoices")
        a = replicas(url, registry, "a")
        assert a.points("cronjob.rounds") == [
            ({"cronjob.job": "invoices", "cronjob.outcome": "succeeded"}, 0)
        ]


class TestSecondRunsAndLosses:
    def test_a_round_cut_short_and_its_rerun_are_counted_where_they_ran(self, url, replicas, clock):
        registry = Registry()
        registry.register(lasting(30), "0 0 * * * *", "export")
        a = replicas(url, registry, "a")
        clock.advance(3600)
        b = replicas(url, registry, "b")
        a.scheduler.stop()  # deploy: a drains, its round is cut short
        clock.advance(15 + 30)  # b's sweep finds it; the second run lasts 30 s
        assert a.value("cronjob.rounds", cronjob_outcome="cut short") == 1
        assert a.value("cronjob.reruns") == 0
        assert b.value("cronjob.reruns", cronjob_job="export") == 1
        assert b.value("cronjob.rounds", cronjob_outcome="succeeded") == 1
        assert b.count("cronjob.round.lateness", cronjob_reason="re-run") == 1

    def test_a_second_round_cut_short_is_counted_as_given_up(self, url, replicas, clock):
        registry = Registry()
        registry.register(lasting(100), "0 0 * * * *", "export")
        a = replicas(url, registry, "a")
        clock.advance(3600)
        b = replicas(url, registry, "b")
        a.scheduler.stop()
        clock.advance(15)
        b.scheduler.stop()  # cut short again: given up
        assert b.value("cronjob.rounds", cronjob_outcome="given up") == 1
        assert b.value("cronjob.rounds", cronjob_outcome="cut short") == 0

    def test_a_lease_taken_under_a_round_is_a_lost_lease_and_a_round_cut_short(
        self, url, replicas, clock
    ):
        registry = Registry()
        registry.register(lasting(60), "0 0 * * * *", "report")
        a = replicas(url, registry, "a", on_fatal=lambda message: None)
        clock.advance(3600)
        engine = lease.create_engine(url)
        try:
            with engine.begin() as conn:  # another claim takes it: the token changes
                conn.execute(sa.text("UPDATE cronjob_lease SET token = 12345"))
        finally:
            engine.dispose()
        clock.advance(5)  # the renewal finds it taken
        assert a.value("cronjob.lost_leases", cronjob_job="report") == 1
        assert a.value("cronjob.rounds", cronjob_outcome="cut short") == 1


class TestCatchUpAndSkips:
    def test_a_catch_up_is_counted_with_its_lateness(self, url, replicas, clock):
        registry = Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        first = replicas(url, registry, "first")
        clock.advance(3600)  # runs 10:00
        first.scheduler.stop()
        clock.advance(3 * 3600 + 1800)  # down through 13:00; now 13:30
        b = replicas(url, registry, "b")
        clock.advance(0)
        assert b.value("cronjob.catch_ups", cronjob_job="hourly", cronjob_reason="catch-up") == 1
        assert b.value("cronjob.round.lateness", cronjob_reason="catch-up") == 1800
        assert first.value("cronjob.catch_ups") == 0

    def test_instants_no_replica_ran_are_counted_missed_once_by_the_replica_catching_up(
        self, any_url, replicas, clock
    ):
        """Both replicas down from 10:30 to 13:30: 11:00 and 12:00 ran nowhere (13:00, the
        latest, is caught up); the replica whose catch-up wins counts them. Status shows
        them skipped by the catch-up policy, not missed: the catch-up decided on them."""
        registry = Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        first = [replicas(any_url, registry, "a1"), replicas(any_url, registry, "b1")]
        clock.advance(3600 + 1800)  # 10:00 ran
        for replica in first:
            replica.scheduler.stop()
        clock.advance(3 * 3600)  # 13:30
        again = [replicas(any_url, registry, "a2"), replicas(any_url, registry, "b2")]
        clock.advance(0)
        assert total(again, "cronjob.instants.missed", cronjob_job="hourly") == 2
        assert total(again, "cronjob.catch_ups") == 1
        assert total(first, "cronjob.instants.missed") == 0
        [job] = admin.status(any_url, now=clock.now()).jobs
        assert (job.missed, job.skipped) == (0, 2)

    def test_instants_that_came_due_while_a_round_ran_are_counted_as_skipped(
        self, url, replicas, clock
    ):
        registry = Registry()
        registry.register(lasting(90), "0 * * * * *", "slow")
        a = replicas(url, registry, "a")
        b = replicas(url, registry, "b")
        clock.advance(5 * 60)  # 09:01 and 09:03 run 90 s each: 09:02 and 09:04 skipped
        both = [a, b]
        assert total(both, "cronjob.skipped_instants", cronjob_reason="overrun") == 2
        assert total(both, "cronjob.rounds") == 2  # and 09:05 runs now


def test_the_global_meter_provider_is_the_default(tmp_path):
    """Without ``meter_provider=``, the measurements go to OpenTelemetry's global provider."""
    program = textwrap.dedent(
        f"""
        from datetime import datetime, timezone
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
        import cronjob
        from cronjob.testing import FakeClock

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        registry = cronjob.Registry()
        registry.register(lambda ctx: None, "0 0 * * * *", "hourly")
        clock = FakeClock(datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc))
        with cronjob.Scheduler("sqlite:///{tmp_path / "global.sqlite"}", registry=registry,
                               clock=clock):
            clock.advance(2 * 3600)
        data = reader.get_metrics_data()
        print(sum(point.value for resource in data.resource_metrics
                  for scope in resource.scope_metrics for metric in scope.metrics
                  if metric.name == "cronjob.rounds" for point in metric.data.data_points))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2\n"
