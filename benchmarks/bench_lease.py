"""Lease throughput and statement counts, per database: reported, not asserted.

Run: ``python -m benchmarks.bench_lease [--cycles N] [--jobs N]``.

For each database (SQLite file, PostgreSQL, MariaDB/MySQL; a server that cannot be reached
is reported as such), on the database's own clock, as in production:

- ``claims_per_s``: claim + finish cycles of one lease, back to back, one thread.
- ``batch_round_ms``: one round of ``--jobs`` leases: claim them all at one instant (one
  statement), renew them all (one statement), finish each.
- ``statements``: statements sent per operation, counted with a ``before_cursor_execute``
  listener (``BEGIN`` excluded): claim, renew, finish, find_cut_short.

The servers get a scratch schema / database, dropped afterwards. Results go to stdout as a
table and to ``benchmarks/results/lease.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import lease
from benchmarks._harness import save_run
from tests._helpers import statements

POSTGRES_URL = os.environ.get(
    "CRONJOB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("CRONJOB_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
START = datetime(2026, 1, 1, tzinfo=UTC)


def _execute(url: str, statement: str) -> None:
    engine = sa.create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement))
    finally:
        engine.dispose()


@contextmanager
def _sqlite() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield f"sqlite:///{directory}/bench.sqlite"


@contextmanager
def _postgres() -> Iterator[str]:
    schema = f"lease_bench_{uuid.uuid4().hex[:12]}"
    _execute(POSTGRES_URL, f"CREATE SCHEMA {schema}")
    try:
        url = sa.make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        _execute(POSTGRES_URL, f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def _mysql() -> Iterator[str]:
    database = f"lease_bench_{uuid.uuid4().hex[:12]}"
    _execute(MYSQL_URL, f"CREATE DATABASE {database} CHARACTER SET utf8mb4")
    try:
        yield sa.make_url(MYSQL_URL).set(database=database).render_as_string(hide_password=False)
    finally:
        _execute(MYSQL_URL, f"DROP DATABASE {database}")


DATABASES: dict[str, Callable[[], Any]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
    "mysql": _mysql,
}


def _count(engine: sa.Engine, operation: Callable[[], object]) -> int:
    with statements(engine, keep=lambda statement: not statement.startswith("BEGIN")) as sent:
        operation()
    return len(sent)


def seeded(engine: sa.Engine, jobs: int) -> tuple[lease.LeaseStore, list[str]]:
    """Migrate the database of ``engine`` and ensure the leases of ``solo`` and of ``jobs``
    jobs named ``job-0``, ``job-1``…: the store, and those jobs' names."""
    lease.migrate(engine)
    store = lease.LeaseStore(engine)
    names = [f"job-{i}" for i in range(jobs)]
    store.ensure(["solo", *names])
    return store, names


def bench(url: str, *, cycles: int, jobs: int) -> dict[str, Any]:
    engine = lease.create_engine(url)
    try:
        store, names = seeded(engine, jobs)
        instant = START

        def next_instant() -> datetime:
            nonlocal instant
            instant += timedelta(seconds=1)
            return instant

        # Warm up the pool and SQLAlchemy's statement cache.
        for _ in range(20):
            for claim in store.claim(["solo"], next_instant(), "bench"):
                store.finish("solo", claim.token, ended=claim.instant)

        began = time.perf_counter()
        for _ in range(cycles):
            (claim,) = store.claim(["solo"], next_instant(), "bench")
            store.finish("solo", claim.token, ended=claim.instant)
        claims_per_s = cycles / (time.perf_counter() - began)

        rounds = max(3, cycles // 100)
        began = time.perf_counter()
        for _ in range(rounds):
            claims = store.claim(names, next_instant(), "bench")
            store.renew([(c.name, c.token) for c in claims], "bench")
            for claim in claims:
                store.finish(claim.name, claim.token, ended=claim.instant)
        batch_round_ms = (time.perf_counter() - began) / rounds * 1000

        statements: dict[str, int] = {}
        claims = []
        statements["claim"] = _count(
            engine, lambda: claims.extend(store.claim(names, next_instant(), "bench"))
        )
        held = [(c.name, c.token) for c in claims]
        statements["renew"] = _count(engine, lambda: store.renew(held, "bench"))
        statements["finish"] = _count(
            engine, lambda: store.finish(claims[0].name, claims[0].token, ended=instant)
        )
        statements["find_cut_short"] = _count(engine, lambda: store.find_cut_short(names))
        return {
            "claims_per_s": round(claims_per_s, 1),
            "batch_round_ms": round(batch_round_ms, 2),
            "batch_jobs": jobs,
            "statements": statements,
        }
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=1000, help="claim+finish cycles")
    parser.add_argument("--jobs", type=int, default=100, help="leases in a batch round")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    for name, scratch in DATABASES.items():
        try:
            with scratch() as url:
                results[name] = bench(url, cycles=args.cycles, jobs=args.jobs)
        except (sa.exc.SQLAlchemyError, lease.LeaseError) as exc:
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    header = f"{'database':<10} {'claims/s':>10} {'round(ms)':>10}"
    print(f"{header}  statements (claim/renew/finish/find)")
    for name, result in results.items():
        if "error" in result:
            print(f"{name:<10} unavailable: {result['error']}")
            continue
        counts = result["statements"]
        print(
            f"{name:<10} {result['claims_per_s']:>10.0f} {result['batch_round_ms']:>10.1f}  "
            f"{counts['claim']}/{counts['renew']}/{counts['finish']}/{counts['find_cut_short']}"
        )
    save_run("lease", cycles=args.cycles, results=results)


if __name__ == "__main__":
    main()
