"""Engines made for leases, URL redaction, the exception tree and the public surface."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import lease
from tests._helpers import statements


@contextmanager
def connected(url: str | sa.URL) -> Iterator[sa.Connection]:
    """A connection of a new lease engine on ``url``; the engine is disposed after."""
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


class TestRedact:
    def test_it_hides_the_password(self):
        url = "postgresql+psycopg://app:s3cr%40t@db.internal:5432/app"
        assert lease.redact(url) == "postgresql+psycopg://app:***@db.internal:5432/app"

    def test_it_hides_the_password_of_a_url_object(self):
        url = sa.make_url("mysql+pymysql://root:hunter2@127.0.0.1/test")
        assert lease.redact(url) == "mysql+pymysql://root:***@127.0.0.1/test"

    def test_it_leaves_a_url_without_password_alone(self):
        assert lease.redact("sqlite:///var/lib/app.sqlite") == "sqlite:///var/lib/app.sqlite"
        assert lease.redact("postgresql://postgres@h/db") == "postgresql://postgres@h/db"

    def test_it_hides_the_password_of_a_url_that_does_not_parse(self):
        assert lease.redact("not a url://me:hunter2@host/db") == "not a url://me:***@host/db"
        assert "hunter2" not in lease.redact("::bad::pg://me:hunter2@host")


class TestSqliteEngine:
    def test_a_file_gets_one_connection_wal_and_a_busy_timeout(self, sqlite_url):
        engine = lease.create_engine(sqlite_url)
        try:
            assert engine.pool.size() == 1  # type: ignore[attr-defined]
            assert engine.pool._max_overflow == 0  # type: ignore[attr-defined]
            with engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        finally:
            engine.dispose()

    def test_transactions_begin_immediate_and_reads_deferred(self, sqlite_url):
        engine = lease.create_engine(sqlite_url)
        lease.migrate(engine)
        store = lease.LeaseStore(engine)
        try:
            with statements(engine, keep=lambda statement: statement.startswith("BEGIN")) as seen:
                store.ensure(["a"])
                store.read(["a"])
        finally:
            engine.dispose()
        # ensure reads which rows it would change, then writes them; read only reads.
        assert seen == ["BEGIN DEFERRED", "BEGIN IMMEDIATE", "BEGIN DEFERRED"]

    def test_the_connection_can_be_used_from_any_thread(self, sqlite_url):
        engine = lease.create_engine(sqlite_url)
        lease.migrate(engine)
        store = lease.LeaseStore(engine)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                store.ensure(["a"])
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        engine.dispose()
        assert errors == []

    @pytest.mark.parametrize(
        "url",
        [
            "sqlite://",
            "sqlite:///:memory:",
            "sqlite+pysqlite:///:memory:",
            "sqlite:///file::memory:?uri=true",
            "sqlite:///file::memory:?cache=shared&uri=true",
            "sqlite:///file:jobs?mode=memory&cache=shared&uri=true",
        ],
    )
    def test_it_refuses_an_in_memory_database(self, url):
        """One connection shared by every thread: lease statements would run inside a
        job's transaction, and commit or roll back with it."""
        message = (
            f"the in-memory SQLite database {url!r} cannot carry leases: its one "
            "connection would be shared by every thread, so lease statements would run "
            "inside jobs' transactions; use a file, e.g. 'sqlite:///cronjob.sqlite'"
        )
        with pytest.raises(lease.UnsupportedDatabase, match="^" + re.escape(message) + "$"):
            lease.create_engine(url)
        # Made elsewhere, then handed to the package.
        engine = sa.create_engine(url, poolclass=NullPool)
        refused = r"^the in-memory SQLite database 'sqlite(\+pysqlite)?://.* cannot carry leases"
        with pytest.raises(lease.UnsupportedDatabase, match=refused):
            lease.LeaseStore(engine)
        with pytest.raises(lease.UnsupportedDatabase, match=refused):
            lease.migrate(engine)

    def test_a_file_uri_is_not_taken_for_memory(self, tmp_path):
        engine = lease.create_engine(f"sqlite:///file:{tmp_path / 'a.sqlite'}?uri=true")
        try:
            lease.migrate(engine)
            lease.LeaseStore(engine).ensure(["a"])
        finally:
            engine.dispose()
        assert (tmp_path / "a.sqlite").exists()


class TestServerEngine:
    @pytest.mark.parametrize("backend", ["mysql+pymysql", "mariadb+pymysql"])
    def test_the_async_url_leaves_out_pymysql_s_ssl_disabled(self, backend):
        # aiomysql and asyncmy take no ssl_disabled, and use no TLS unless given a context:
        # a URL that turns PyMySQL's preferred TLS off must still open an async engine.
        url = lease.async_url(f"{backend}://root@db:3306/app?ssl_disabled=true&charset=utf8mb4")
        assert url.get_dialect().is_async
        assert dict(url.query) == {"charset": "utf8mb4"}

    @pytest.mark.parametrize(
        "server",
        [
            pytest.param("postgres", marks=pytest.mark.postgres),
            pytest.param("mysql", marks=pytest.mark.mysql),
        ],
    )
    def test_pings_and_reads_committed(self, server, request):
        with connected(request.getfixturevalue(f"{server}_url")) as conn:
            assert conn.engine.pool._pre_ping  # type: ignore[attr-defined]
            assert conn.get_isolation_level() == "READ COMMITTED"

    @pytest.mark.parametrize(
        "server",
        [
            pytest.param("postgres", marks=pytest.mark.postgres),
            pytest.param("mysql", marks=pytest.mark.mysql),
        ],
    )
    def test_a_burst_of_checkouts_reuses_the_connections_the_last_one_opened(self, server, request):
        """Two bursts of `POOL_SIZE` transactions at once (the rounds of many hand-off
        jobs falling on one instant) open `POOL_SIZE` connections in all: the second
        burst reuses them. SQLAlchemy's default pool (5 + 10 overflow) closed the 10 past
        its 5 as they came back, and opened them again at every burst."""
        engine = lease.create_engine(request.getfixturevalue(f"{server}_url"))
        opened = []
        sa.event.listen(engine, "connect", lambda *_: opened.append(1))
        size = lease._engine.POOL_SIZE
        try:
            for _ in range(2):
                held = [engine.connect() for _ in range(size)]
                for conn in held:
                    conn.exec_driver_sql("SELECT 1")
                for conn in held:
                    conn.close()
            assert len(opened) == size
            assert engine.pool.checkedin() == size  # type: ignore[attr-defined]
        finally:
            engine.dispose()

    def test_a_pool_given_is_the_caller_s(self, postgres_url):
        engine = lease.create_engine(postgres_url, pool_size=2)
        try:
            assert engine.pool.size() == 2  # type: ignore[attr-defined]
            assert engine.pool._max_overflow == 10  # type: ignore[attr-defined]
        finally:
            engine.dispose()

    @pytest.mark.mysql
    def test_mysql_connections_notice_a_vanished_peer_within_seconds(self, mysql_url):
        """PyMySQL has no option for it: the socket is set up as it connects."""
        with connected(mysql_url) as conn:
            dbapi = conn.connection.dbapi_connection
            sock = dbapi._sock  # type: ignore[union-attr]
            options = {
                "SO_KEEPALIVE": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                **{
                    name: sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))
                    for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT")
                },
                "TCP_USER_TIMEOUT": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            }
            connect_timeout = dbapi.connect_timeout  # type: ignore[union-attr]
        assert options == {
            "SO_KEEPALIVE": 1,
            "TCP_KEEPIDLE": 5,
            "TCP_KEEPINTVL": 2,
            "TCP_KEEPCNT": 3,
            "TCP_USER_TIMEOUT": 10_000,
        }
        assert connect_timeout == 10

    @pytest.mark.mysql
    def test_mysql_connect_timeout_in_the_url_wins(self, mysql_url):
        with connected(sa.make_url(mysql_url).update_query_dict({"connect_timeout": "3"})) as conn:
            assert conn.connection.dbapi_connection.connect_timeout == 3  # type: ignore[union-attr]

    @pytest.mark.postgres
    def test_postgres_connections_notice_a_vanished_peer_within_seconds(self, postgres_url):
        with connected(postgres_url) as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert {key: params.get(key) for key in ("keepalives", "tcp_user_timeout")} == {
            "keepalives": "1",
            "tcp_user_timeout": "10000",
        }

    @pytest.mark.postgres
    def test_the_url_wins_over_the_connection_defaults(self, postgres_url):
        separator = "&" if "?" in postgres_url else "?"
        engine = lease.create_engine(f"{postgres_url}{separator}tcp_user_timeout=2500")
        try:
            with engine.connect() as conn:
                params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        finally:
            engine.dispose()
        assert params.get("tcp_user_timeout") == "2500"

    def test_a_url_for_no_installed_dialect_is_a_lease_error(self):
        with pytest.raises(lease.DatabaseError, match=r"^create engine: "):
            lease.create_engine("nosuchdb://x@y/z")


class TestExceptions:
    def test_the_tree_has_one_root_and_the_fitting_builtins(self):
        assert issubclass(lease.DatabaseUnavailable, lease.LeaseError)
        assert issubclass(lease.DatabaseUnavailable, ConnectionError)
        # A refusal fails a start, but a running replica treats it as an outage.
        assert issubclass(lease.DatabaseRefused, lease.DatabaseUnavailable)
        for leaf in (
            lease.DatabaseError,
            lease.UnsupportedDatabase,
            lease.MigrationRequired,
            lease.MigrationFailed,
        ):
            assert issubclass(leaf, lease.LeaseError)
            assert issubclass(leaf, RuntimeError)


class TestSurface:
    def test_the_public_names_are_pinned(self):
        assert lease.__all__ == sorted(lease.__all__)
        assert lease.__all__ == [
            "ACK_NOTE",
            "Admission",
            "BackfillCancellation",
            "Backfills",
            "CLAIM_AHEAD_LIMIT",
            "COUNTED_FAILURES",
            "Claim",
            "ClaimBatch",
            "CutRound",
            "CutShort",
            "DEFAULT_HISTORY_DAYS",
            "DEFAULT_HISTORY_PER_NAME",
            "DEFAULT_STATEMENT_TIMEOUT",
            "DEFAULT_TTL",
            "DatabaseError",
            "DatabaseRefused",
            "DatabaseUnavailable",
            "Definition",
            "Ending",
            "HOLDER_LENGTH",
            "LeaseError",
            "LeaseRow",
            "LeaseState",
            "LeaseStore",
            "LeaseWrite",
            "MigrationFailed",
            "MigrationRequired",
            "NOT_SCHEDULED",
            "ONCE_DONE",
            "ONCE_RUNNING",
            "OutboxRow",
            "OutboxSummary",
            "POLICIES_FORMAT",
            "Publication",
            "REASON_LENGTH",
            "REQUEST_TTL",
            "ReplicaRow",
            "RoundRow",
            "RoundSpan",
            "SCHEDULE_FORMAT",
            "SKIP_NOTE",
            "ScheduleRow",
            "Survey",
            "TABLE_NAME",
            "TRIGGER_CHANNEL",
            "Tally",
            "TriggerRow",
            "TriggerState",
            "Triggers",
            "UNCLAIMED_LIMIT",
            "UNCLAIMED_WITHIN",
            "UnsupportedDatabase",
            "VERSION_TABLE",
            "WriteKind",
            "admit",
            "async_url",
            "begin_once",
            "behind_transaction_pooler",
            "bump_schedule_rev",
            "check_dialect",
            "check_holder",
            "claim_publication",
            "count_failure",
            "create_async_engine",
            "create_engine",
            "current_revision",
            "defer_publications",
            "definition",
            "due_publications",
            "finish_once",
            "forgo_former_rounds",
            "head_revision",
            "held_publications",
            "insert_schedules",
            "is_async_url",
            "leased_names",
            "mark_published",
            "mark_published_many",
            "metadata",
            "migrate",
            "next_publication_ms",
            "once_state",
            "orphaned_publications",
            "outbox_summary",
            "paused_names",
            "prune_outbox",
            "prune_schedules",
            "read_admission",
            "read_schedule_rev",
            "read_schedules",
            "record_publication",
            "record_publications",
            "redact",
            "redeploy_schedule_leases",
            "release_once",
            "remove_schedule",
            "replace_schedules",
            "resolve_obsolete",
            "retime_schedule_leases",
            "schedule_changes",
            "schedule_lease_rows",
            "schedule_values",
            "set_paused_on",
            "sync_url",
            "taken_schedule_ids",
            "tell_on_commit",
            "tell_schedules_changed",
            "unstorable",
            "update_schedule",
        ]

    def test_public_objects_carry_the_public_module(self):
        for name in lease.__all__:
            module = getattr(getattr(lease, name), "__module__", "lease")
            if module.startswith("lease"):
                assert module == "lease", name
