"""What PgBouncer in transaction mode costs a store's transaction: reported, not asserted.

Run: ``python -m benchmarks.bench_pooler [--cycles N] [--rounds N]`` (the suite's
PgBouncer must run: ``bash scripts/pgbouncer``).

One store, one thread, on the database's clock; per configuration the median and p99
time of a store transaction (checkout with its ping, ``BEGIN``, the statement,
``COMMIT``), over ``--rounds`` rounds of ``--cycles`` of each operation, the
configurations taking turns each round so that the machine's other load falls on all:

- ``read``: :meth:`LeaseStore.read` of one row (one ``SELECT``);
- ``renew``: :meth:`LeaseStore.renew` of one held lease (one ``UPDATE``).

Configurations: ``direct`` (PostgreSQL, the bound set once on the session);
``pgbouncer, session bound`` (through PgBouncer, no prepared statements, the bound on the
session as directly: wrong behind a transaction pooler, here only as the baseline);
``pgbouncer, bound apart`` (``pooler=transaction``, the bound as a statement of its own
after ``BEGIN``: what drivers other than psycopg get); ``pgbouncer, pooler=transaction``
(what users run with psycopg: the bound in the round trip of ``BEGIN``). A scratch
database, dropped afterwards.

Then the same three ways on one bare psycopg connection through PgBouncer, taking turns
each iteration (``--cycles`` times ``--rounds`` of each), without the store around them:
``BEGIN`` / ``COMMIT``; ``BEGIN`` / the bound / ``COMMIT``; ``BEGIN; the bound`` as one
query / ``COMMIT``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import lease

POSTGRES_URL = os.environ.get(
    "CRONJOB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
PGBOUNCER_URL = os.environ.get(
    "CRONJOB_TEST_PGBOUNCER_URL", "postgresql+psycopg://postgres@127.0.0.1:6432/test"
)


def _autocommit(url: str, statement: str) -> None:
    engine = sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def _timed(operation: Callable[[], object], cycles: int) -> list[float]:
    """The times of ``cycles`` runs of ``operation``, in ms."""
    times = []
    for _ in range(cycles):
        began = time.perf_counter()
        operation()
        times.append((time.perf_counter() - began) * 1000)
    return times


def _operations(engine: sa.Engine, name: str) -> dict[str, Callable[[], object]]:
    store = lease.LeaseStore(engine, ttl=3600)
    store.ensure([name])
    (claim,) = store.claim([name], datetime.now(UTC).replace(microsecond=0), "bench")
    operations: dict[str, Callable[[], object]] = {
        "read": lambda: store.read([name]),
        "renew": lambda: store.renew([(name, claim.token)], "bench"),
    }
    for operation in operations.values():  # warm up: connections made, statements cached
        for _ in range(50):
            operation()
    return operations


def _bare(url: sa.URL, iterations: int) -> dict[str, float]:
    """Median ms of the three ways to begin a bounded transaction on a bare psycopg
    connection to ``url`` (PgBouncer), taking turns each iteration."""
    import psycopg  # the postgres extra's driver

    bound = "SELECT set_config('statement_timeout', '5000', true)"
    conninfo = f"host={url.host} port={url.port} user={url.username} dbname={url.database}"
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
        ways: dict[str, Callable[[], object]] = {
            "BEGIN / COMMIT": lambda: (conn.execute("BEGIN"), conn.execute("COMMIT")),
            "BEGIN / bound / COMMIT": lambda: (
                conn.execute("BEGIN"),
                conn.execute(bound),
                conn.execute("COMMIT"),
            ),
            "BEGIN; bound / COMMIT": lambda: (
                conn.execute(f"BEGIN; {bound}"),
                conn.execute("COMMIT"),
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(iterations):
            for name, way in ways.items():
                times[name] += _timed(way, 1)
    return {name: statistics.median(measured) for name, measured in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    database = f"bench_pooler_{uuid.uuid4().hex[:12]}"
    _autocommit(POSTGRES_URL, f"CREATE DATABASE {database}")
    direct = sa.make_url(POSTGRES_URL).set(database=database)
    bouncer = sa.make_url(PGBOUNCER_URL).set(database=database)
    pooled = bouncer.update_query_dict({"pooler": "transaction"})
    apart = lease.create_engine(pooled)
    # Any driver name but psycopg's takes the path with the bound apart.
    apart.dialect.driver = "psycopg (bound apart)"
    engines = {
        "direct": lease.create_engine(direct),
        "pgbouncer, session bound": lease.create_engine(
            bouncer, connect_args={"prepare_threshold": None}
        ),
        "pgbouncer, bound apart": apart,
        "pgbouncer, pooler=transaction": lease.create_engine(pooled),
    }
    try:
        lease.migrate(engines["direct"])
        operations = {
            name: _operations(engine, f"job-{number}")
            for number, (name, engine) in enumerate(engines.items())
        }
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for name, theirs in operations.items():
                for operation, run in theirs.items():
                    times.setdefault((name, operation), []).extend(_timed(run, args.cycles))
        print(f"{'configuration':<32}{'operation':<10}{'median ms':>10}{'p99 ms':>10}")
        for (name, operation), measured in times.items():
            measured.sort()
            p99 = measured[int(len(measured) * 0.99) - 1]
            print(f"{name:<32}{operation:<10}{statistics.median(measured):>10.3f}{p99:>10.3f}")
        print(f"\n{'bare psycopg through PgBouncer':<42}{'median ms':>10}")
        for name, median in _bare(bouncer, args.cycles * args.rounds).items():
            print(f"{name:<42}{median:>10.3f}")
    finally:
        for engine in engines.values():
            engine.dispose()
        _autocommit(POSTGRES_URL, f"DROP DATABASE {database} WITH (FORCE)")


if __name__ == "__main__":
    main()
