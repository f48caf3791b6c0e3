"""The pytest plugin: fixtures to test an application's jobs on replicas and a fake clock.

Registered through the ``pytest11`` entry point: installing ``cronjob-lease`` makes the
fixtures available, with nothing to import. Fixtures:

- ``cronjob_start``: the fake clock's start, `DEFAULT_START`; override the fixture
  to start elsewhere.
- ``cronjob_clock``: a [FakeClock][cronjob.testing.FakeClock] at ``cronjob_start``.
- ``cronjob_database_url``: ``--cronjob-database-url URL`` if given, else a new SQLite
  file in the test's ``tmp_path``.
- ``cronjob_replicas``: ``cronjob_replicas(n=1, registry=None, **options)`` starts ``n``
  schedulers (replicas ``replica-1``, ``replica-2``, ...) of ``registry`` (the default
  registry, of the modules the tests imported, if ``None``) on that clock and database,
  and returns them; they are drained and stopped after the test.
- ``cronjob_rounds``: the rounds those replicas ran, in the order they ended, as
  [RanRound][cronjob.testing.RanRound] (job, instant, attempt, replica, outcome).

On a database given with ``--cronjob-database-url``, ``cronjob_replicas`` first deletes
the lease rows and the round history of the jobs it runs, so that each test starts from
its own clock: the tables there are the tests', never a production one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import lease

from ._registry import Registry, default_registry
from .engine import Scheduler
from .testing import FakeClock, RanRound, record_rounds

__all__ = ["DEFAULT_START", "StartReplicas"]

#: Where ``cronjob_clock`` starts unless ``cronjob_start`` is overridden: a Monday.
DEFAULT_START = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)
_OPTION = "--cronjob-database-url"

#: ``cronjob_replicas(n=1, registry=None, **scheduler_options) -> [Scheduler, ...]``
StartReplicas = Callable[..., list[Scheduler]]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("cronjob").addoption(
        _OPTION,
        metavar="URL",
        default=None,
        help="run the cronjob_replicas fixture's schedulers on this database (its lease "
        "rows of the tests' jobs are deleted); default: a new SQLite file per test",
    )


@pytest.fixture
def cronjob_start() -> datetime:
    """Where ``cronjob_clock`` starts; override this fixture to start elsewhere."""
    return DEFAULT_START


@pytest.fixture
def cronjob_clock(cronjob_start: datetime) -> FakeClock:
    """A fake clock at ``cronjob_start``, shared by every replica of the test."""
    return FakeClock(cronjob_start)


@pytest.fixture
def cronjob_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """``--cronjob-database-url``, else a new SQLite file of the test's own."""
    given: str | None = request.config.getoption(_OPTION)
    return given or f"sqlite:///{tmp_path / 'cronjob.sqlite'}"


@pytest.fixture
def cronjob_rounds() -> list[RanRound]:
    """The rounds the test's replicas ran, in the order they ended."""
    return []


@pytest.fixture
def cronjob_replicas(
    request: pytest.FixtureRequest,
    cronjob_clock: FakeClock,
    cronjob_database_url: str,
    cronjob_rounds: list[RanRound],
) -> Iterator[StartReplicas]:
    """A factory of started replicas; all are drained and stopped after the test."""
    started: list[Scheduler] = []
    numbers = itertools.count(1)
    given = request.config.getoption(_OPTION) is not None

    def start(n: int = 1, *, registry: Registry | None = None, **options: Any) -> list[Scheduler]:
        if n < 1:
            raise ValueError(f"cronjob_replicas needs at least 1 replica, got {n}")
        recorded = record_rounds(registry or default_registry, cronjob_rounds)
        if given:
            _forget(cronjob_database_url, [job.name for job in recorded.jobs])
        replicas = []
        for _ in range(n):
            scheduler = Scheduler(
                cronjob_database_url,
                registry=recorded,
                clock=cronjob_clock,
                replica_id=f"replica-{next(numbers)}",
                **options,
            )
            scheduler.start()
            started.append(scheduler)
            replicas.append(scheduler)
        return replicas

    yield start
    for scheduler in reversed(started):
        scheduler.stop()


def _forget(url: str, names: list[str]) -> None:
    """Delete the lease rows and the round history of ``names`` at ``url``, and the turn
    to prune the history (its instant is another test's clock), if the tables exist."""
    import sqlalchemy as sa

    from lease._schema import lease_table, round_table

    from ._history import PRUNE_CHORE

    engine = lease.create_engine(url)
    try:
        with engine.begin() as conn:
            tables = sa.inspect(conn)
            if names and tables.has_table(lease_table.name):
                forgotten = [*names, f" {PRUNE_CHORE}"]
                conn.execute(lease_table.delete().where(lease_table.c.name.in_(forgotten)))
            if names and tables.has_table(round_table.name):
                conn.execute(round_table.delete().where(round_table.c.name.in_(names)))
    finally:
        engine.dispose()
