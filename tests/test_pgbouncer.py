"""Behind PgBouncer in transaction mode (``?pooler=transaction``): nothing relies on a
session.

Each transaction may run on another server connection, and the one we just used goes
to whichever client asks next (PgBouncer hands out the most recently used first). So:
no statement is prepared on one server connection and run on another; the store's
bound holds inside its own transactions and nowhere else; a migration locks for its
transaction; the scheduler does not ``LISTEN``, and says so once. The lease suite
(``tests/test_lease.py``) and some scheduler tests (``tests/test_scheduler.py``) run
through PgBouncer too; these are the cases a direct connection cannot show.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import POSTGRES_URL, START
from sqlalchemy import event

import lease
from cronjob import admin
from cronjob.engine import _listen
from cronjob.engine._listen import Listener
from tests._helpers import nightly_scheduler

pytestmark = [pytest.mark.postgres, pytest.mark.pgbouncer]

#: The statement that shows the server connection and the bound a transaction runs with.
SHOW = "SELECT pg_backend_pid(), current_setting('statement_timeout')"


@contextmanager
def seen_by_the_store(engine: sa.Engine) -> Iterator[list[tuple[int, str]]]:
    """Collect ``(server process, statement_timeout)`` inside each lease statement's
    transaction on ``engine``, read on the same driver connection right after it."""
    seen: list[tuple[int, str]] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "cronjob_lease" in statement:
            seen.append(tuple(cursor.connection.execute(SHOW).fetchone()))

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield seen
    finally:
        event.remove(engine, "after_cursor_execute", after)


@contextmanager
def held_server_connection(url: str | sa.URL, statement: str = "SELECT 1") -> Iterator[int]:
    """Keep a transaction that ran ``statement`` open through PgBouncer (so it keeps
    that server connection: the one used last) until the block ends; yield its server
    process id."""
    engine = lease.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.begin()
            conn.exec_driver_sql(statement)
            yield conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            conn.rollback()
    finally:
        engine.dispose()


@pytest.fixture
def engine(pgbouncer_url: str) -> Iterator[sa.Engine]:
    engine = lease.create_engine(pgbouncer_url)
    lease.migrate(engine)
    yield engine
    engine.dispose()


class TestTheUrlParameter:
    def test_it_is_read_from_the_url_and_kept_from_the_driver(self, engine, pgbouncer_url):
        assert lease.behind_transaction_pooler(pgbouncer_url)
        assert lease.behind_transaction_pooler(engine)
        assert engine.url.query["pooler"] == "transaction"
        with engine.connect() as conn:
            assert conn.connection.driver_connection.prepare_threshold is None
        assert not lease.behind_transaction_pooler(POSTGRES_URL)

    @pytest.mark.parametrize(
        ("url", "message"),
        [
            (
                "postgresql+psycopg://u@h/db?pooler=session",
                r"^the URL's pooler='session' is not understood: pooler=transaction says a "
                r"transaction pooler is in between; a session pooler needs nothing$",
            ),
            (
                "mysql+pymysql://u@h/db?pooler=transaction",
                r"^pooler=transaction is for PostgreSQL \(PgBouncer\), not mysql$",
            ),
            (
                "postgresql+asyncpg://u@h/db?pooler=transaction",
                r"^asyncpg prepares every statement, which a transaction pooler does not keep "
                r"from one transaction to the next: use postgresql\+psycopg behind it$",
            ),
        ],
    )
    def test_what_it_cannot_honour_is_refused(self, url, message):
        with pytest.raises(lease.DatabaseError, match=message):
            if "asyncpg" in url:
                lease.create_async_engine(url)
            else:
                lease.create_engine(url)

    def test_an_async_engine_for_jobs_prepares_nothing_either(self, pgbouncer_url):
        url = lease.async_url(pgbouncer_url)
        assert lease.behind_transaction_pooler(url)
        assert url.get_driver_name() == "psycopg_async"


class TestPreparedStatements:
    def test_a_statement_run_often_still_runs_on_another_server_connection(self, engine):
        """psycopg prepares a statement on its 5th run: on a server connection the next
        transaction may not get."""
        store = lease.LeaseStore(engine)
        store.ensure(["a"])
        with seen_by_the_store(engine) as seen:
            for _ in range(8):
                store.read(["a"])
            with held_server_connection(engine.url) as held:
                for _ in range(8):
                    assert store.read(["a"])["a"].name == "a"
        pids = [pid for pid, _ in seen]
        assert held == pids[7] and pids[8] != held  # the server connection did change


class TestStatementBound:
    def test_the_bound_holds_in_the_store_s_transaction_and_nowhere_else(self, engine):
        """The next client on the same server connection runs unbounded; the store's own
        transactions are bounded on whichever server connection they get."""
        other = lease.create_engine(engine.url, poolclass=sa.pool.NullPool)
        try:
            with other.connect() as conn:
                (_, unbounded) = conn.exec_driver_sql(SHOW).one()
            store = lease.LeaseStore(engine, statement_timeout=1.0)
            with seen_by_the_store(engine) as seen:
                store.ensure(["a"])
                with held_server_connection(engine.url):  # the store gets another one
                    store.read(["a"])
                store.read(["a"])  # its server connection is now the next one lent
            assert len({pid for pid, _ in seen}) >= 2
            assert {bound for _, bound in seen} == {"1s"}
            with other.connect() as conn:  # the store's last server connection
                assert conn.exec_driver_sql(SHOW).one() == (seen[-1][0], unbounded)
            assert unbounded != "1s"
        finally:
            other.dispose()

    def test_the_bound_goes_with_the_begin_and_the_next_user_gets_a_transaction(
        self, pgbouncer_url
    ):
        """psycopg's BEGIN and the bound are one round trip, the driver in autocommit
        meanwhile: after a store transaction that committed, and one that gave up, the
        one connection of the pool is transactional again for a job."""
        engine = lease.create_engine(pgbouncer_url, pool_size=1, max_overflow=0)
        try:
            lease.migrate(engine)
            store = lease.LeaseStore(engine, ttl=3600, statement_timeout=1.0)
            store.ensure(["a"])
            (claim,) = store.claim(["a"], START, "r1")
            statements: list[str] = []
            event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
            store.read(["a"])
            assert statements[0] == (
                "BEGIN ISOLATION LEVEL READ COMMITTED;"
                " SELECT set_config('statement_timeout', '1000', true)"
            )
            assert len(statements) == 2
            locked = "SELECT * FROM cronjob_lease FOR UPDATE"
            with (
                held_server_connection(engine.url, locked),
                pytest.raises(lease.DatabaseUnavailable, match="statement timeout"),
            ):
                store.renew([("a", claim.token)], "r1")
            with engine.connect() as conn:  # as ctx.transaction() does
                assert conn.connection.driver_connection.autocommit is False
                conn.begin()
                conn.exec_driver_sql("CREATE TABLE job_work (id int)")
                conn.rollback()
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT to_regclass('job_work')").scalar() is None
            assert store.renew([("a", claim.token)], "r1")
        finally:
            engine.dispose()


class TestMigration:
    def test_replicas_migrating_together_leave_no_lock_behind(self, pgbouncer_url):
        database = sa.make_url(pgbouncer_url).database
        errors: list[BaseException] = []

        def migrate() -> None:
            engine = lease.create_engine(pgbouncer_url)
            try:
                lease.migrate(engine)
            except BaseException as exc:
                errors.append(exc)
            finally:
                engine.dispose()

        threads = [threading.Thread(target=migrate) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        engine = lease.create_engine(pgbouncer_url)
        try:
            assert lease.current_revision(engine) == lease.head_revision()
        finally:
            engine.dispose()
        direct = sa.create_engine(POSTGRES_URL, poolclass=sa.pool.NullPool)
        try:
            with direct.connect() as conn:
                locks = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_locks JOIN pg_database d ON d.oid = database"
                        " WHERE locktype = 'advisory' AND d.datname = :name"
                    ),
                    {"name": database},
                ).scalar_one()
        finally:
            direct.dispose()
        assert locks == 0


class TestListening:
    @pytest.mark.slow
    def test_declared_it_does_not_listen_says_so_once_and_the_sweep_takes_requests(
        self, pgbouncer_url, caplog
    ):
        """On the system clock, so the listener would apply: the request is taken by the
        sweep, 15 s after the first."""
        caplog.set_level(logging.INFO, logger="cronjob")
        with nightly_scheduler(pgbouncer_url) as started:
            assert "cronjob-listener" not in {t.name for t in threading.enumerate()}
            admin.trigger(pgbouncer_url, "nightly", by="ops")
            assert started.wait(25), "the sweep did not take the request"
        said = [r.getMessage() for r in caplog.records if "listening" in r.getMessage()]
        assert said == [
            "not listening for requests behind a transaction pooler (pooler=transaction): "
            "the sweep takes requests for a round now, within 15 s"
        ]

    def test_undeclared_it_finds_notifications_do_not_arrive_and_gives_up_once(
        self, pgbouncer_url, caplog, monkeypatch
    ):
        monkeypatch.setattr(_listen, "PROBE_WAIT", 1.0)
        undeclared = sa.make_url(pgbouncer_url).difference_update_query(["pooler"])
        engine = lease.create_engine(undeclared)
        woken: list[None] = []
        listener = Listener(engine, lambda: woken.append(None))
        try:
            listener.start()
            listener._thread.join(10)
            assert not listener._thread.is_alive()
        finally:
            listener.close()
            engine.dispose()
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert [r.getMessage() for r in warned] == [
            "listening for requests: a notification sent to this replica did not arrive "
            "within 1.0 s (a transaction pooler in between? then add pooler=transaction to "
            "the database URL); the sweep takes requests for a round now, within 15 s"
        ]
        assert woken == []

    def test_directly_the_probe_arrives_and_a_request_wakes_it(self, postgres_url, caplog):
        engine = lease.create_engine(postgres_url)
        woken = threading.Event()
        listener = Listener(engine, woken.set)
        try:
            listener.start()
            deadline = time.monotonic() + 10
            while not woken.is_set():  # until it listens: a NOTIFY before that is lost
                assert time.monotonic() < deadline, "no request woke the listener"
                with engine.begin() as conn:
                    conn.execute(sa.select(sa.func.pg_notify(lease.TRIGGER_CHANNEL, "a")))
                woken.wait(0.2)
            assert listener._thread.is_alive()
        finally:
            listener.close()
            engine.dispose()
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
