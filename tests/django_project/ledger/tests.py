"""Run by Django's test runner on its test database (SQLite or PostgreSQL), from
tests/test_django.py: fenced ORM transactions against real schedulers on a fake clock."""

from datetime import UTC, datetime

import sqlalchemy as sa
from django.db import connection, transaction
from django.test import TransactionTestCase

import cronjob
import lease
from cronjob.contrib.django import database_url, fenced
from cronjob.testing import FakeClock, make_round

from .models import Entry

START = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
NINE = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def steal(name: str) -> None:
    """Another claim took the lease: the row's fencing token changes."""
    engine = lease.create_engine(database_url())
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE cronjob_lease SET token = 12345 WHERE name = :name"),
                {"name": name},
            )
    finally:
        engine.dispose()


class TestDiscovery(TransactionTestCase):
    def test_the_apps_cronjobs_module_registered_its_job(self):
        assert "ledger-hourly" in [job.name for job in cronjob.default_registry.jobs]

    def test_the_lease_table_lives_in_djangos_test_database(self):
        url = sa.make_url(database_url())
        assert url.database == connection.settings_dict["NAME"]
        assert url.database.rsplit("/", 1)[-1].startswith("test_")


class TestFenced(TransactionTestCase):
    def setUp(self):
        # Lease rows outlive Django's flush: each test's job has a name of its own.
        self.name = self._testMethodName.removeprefix("test_")

    def run_hour(self, job, *, leased=True):
        """Run ``job`` hourly on one replica up to 09:00; return what it raised."""
        errors = []

        def recorded(ctx):
            try:
                job(ctx)
            except Exception as exc:
                errors.append(exc)
                raise

        registry = cronjob.Registry()
        register = registry.register if leased else registry.register_per_instance
        register(recorded, "0 0 * * * *", self.name)
        clock = FakeClock(START)
        with cronjob.Scheduler(
            database_url(), registry=registry, clock=clock, on_fatal=lambda message: None
        ):
            clock.advance_to(NINE)  # the round starts, and runs until it waits
            self.between(clock)
        return errors

    def between(self, clock):
        """What happens while the round waits (overridden by a test)."""

    def test_orm_writes_commit_while_the_lease_holds(self):
        def writer(ctx):
            with fenced(ctx):
                Entry.objects.create(job=ctx.name, instant=ctx.instant)

        assert self.run_hour(writer) == []
        assert list(Entry.objects.values_list("job", "instant")) == [(self.name, NINE)]

    def test_a_lease_taken_before_the_block_refuses_it_with_lease_lost(self):
        def writer(ctx):
            ctx.wait(2)
            with fenced(ctx):
                Entry.objects.create(job=ctx.name, instant=ctx.instant)

        def between(clock):
            steal(self.name)
            clock.advance(2)

        self.between = between
        errors = self.run_hour(writer)
        assert [type(error) for error in errors] == [cronjob.LeaseLost]
        assert str(errors[0]) == f"job {self.name!r}: lease lost: the round no longer holds it"
        assert Entry.objects.count() == 0

    def test_a_lease_taken_inside_the_block_rolls_its_writes_back(self):
        if connection.vendor == "sqlite":
            # The block's write holds SQLite's one write lock until it commits: no claim
            # can take the lease meanwhile (it waits), so there is nothing to refuse.
            self.skipTest("SQLite serialises writers: no claim can land inside the block")

        def writer(ctx):
            with fenced(ctx):
                Entry.objects.create(job=ctx.name, instant=ctx.instant)
                ctx.wait(2)

        def between(clock):
            steal(self.name)
            clock.advance(2)

        self.between = between
        errors = self.run_hour(writer)
        assert [str(error) for error in errors] == [
            f"job {self.name!r}: lease lost: taken before the transaction committed"
        ]
        assert Entry.objects.count() == 0

    def test_a_per_instance_round_gets_a_plain_atomic_block(self):
        def writer(ctx):
            with fenced(ctx):
                Entry.objects.create(job=ctx.name, instant=ctx.instant)

        assert self.run_hour(writer, leased=False) == []
        assert Entry.objects.count() == 1

    def test_inside_an_atomic_block_it_refuses_to_guard_a_savepoint(self):
        ctx = make_round("writer", START)
        with (
            transaction.atomic(),
            self.assertRaisesRegex(RuntimeError, "savepoint"),
            fenced(ctx),
        ):
            pass

    def test_a_round_from_make_round_writes_without_a_lease(self):
        with fenced(make_round("writer", START)):
            Entry.objects.create(job="writer", instant=START)
        assert Entry.objects.count() == 1
