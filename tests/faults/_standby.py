"""A private PostgreSQL primary and its streaming standby, for the failover tests.

:class:`StandbyPair` builds, on free ports and in a temporary folder of its own, a
primary (``initdb``) and a standby copied from it (``pg_basebackup -R``, streaming), and
then breaks them on demand: the primary killed as a machine dies (``SIGKILL`` to its
whole process group, postmaster and backends at once), the standby promoted
(``pg_ctl promote``), the standby cut off from the primary's stream (:meth:`detach`).
It never touches the shared server on 5432: every test gets a pair of its own, and
:meth:`close` kills both servers and deletes their files.

Replication is asynchronous by default (``synchronous_standby_names`` empty: a commit is
acknowledged once it is flushed on the primary). ``synchronous=True`` names the standby
in ``synchronous_standby_names`` and sets ``synchronous_commit = remote_apply``: a commit
is acknowledged only once the standby has replayed it, so what the primary acknowledged
is visible on the standby. The standby's own configuration (what it runs with once
promoted) names no synchronous standby: nothing follows it, and a name there would make
its every commit wait.

PostgreSQL's ``initdb`` refuses to run as root, so as root the server programs run as
the ``postgres`` OS user (``runuser``), in folders it owns.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from tests._process import children

from .harness import Database, execute, wait_until


def _server_programs() -> Path:
    """Where Debian keeps the newest installed PostgreSQL's server programs."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


#: The server programs (``initdb``, ``pg_ctl``, ``pg_basebackup``): Debian's newest
#: ``postgresql-N`` unless ``CRONJOB_TEST_PG_BIN`` names a folder.
PG_BIN = Path(os.environ.get("CRONJOB_TEST_PG_BIN") or _server_programs())
#: The OS user the servers run as when the tests run as root.
PG_USER = "postgres"
#: The standby's ``application_name`` (its ``cluster_name``), as the primary's
#: ``synchronous_standby_names`` names it.
STANDBY_NAME = "standby"
#: The database the replicas use on the pair.
DATABASE = "test"
#: Replication settings of a server that waits for no standby.
_ASYNC = "synchronous_standby_names = ''\nsynchronous_commit = on\n"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def missing() -> str | None:
    """``None`` if a pair can be built here, else what is missing."""
    for tool in ("initdb", "pg_ctl", "pg_basebackup"):
        if not (PG_BIN / tool).exists():
            return f"{PG_BIN / tool} is missing (Debian's postgresql package)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            return f"running as root, and there is no {PG_USER!r} OS user to run the servers"
    return None


def _url(*hosts: tuple[str, int], database: str = DATABASE, **query: str) -> str:
    """A psycopg URL for ``database`` on ``hosts`` (several: a libpq multi-host URL)."""
    base = f"postgresql+psycopg://postgres@/{database}"
    if len(hosts) == 1:
        (host, port) = hosts[0]
        base = f"postgresql+psycopg://postgres@{host}:{port}/{database}"
        return sa.make_url(base).update_query_dict(query).render_as_string(hide_password=False)
    url = sa.make_url(base).update_query_dict(
        {"host": [f"{host}:{port}" for host, port in hosts], **query}
    )
    return url.render_as_string(hide_password=False)


class StandbyPair:
    """A primary and its streaming standby on this host, each on a free port.

    Use as a context manager (or call :meth:`close`): the servers are started on entry
    and killed, with their files, on exit.
    """

    def __init__(
        self, *, synchronous: bool = False, lag: float = 0.0, root: Path | None = None
    ) -> None:
        self.synchronous = synchronous
        #: The one-way delay, in seconds, of the standby's stream from the primary (and of
        #: its replies), through a :class:`LagProxy`: 0 streams directly.
        self.lag = lag
        self._proxy: LagProxy | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="cronjob-standby-", dir=root))
        self.primary_port = free_port()
        self.standby_port = free_port()
        while self.standby_port == self.primary_port:
            self.standby_port = free_port()
        self.primary_dir = self.dir / "primary"
        self.standby_dir = self.dir / "standby"
        #: The primary, the standby, and both as libpq's multi-host URL that connects to
        #: whichever accepts writes (``target_session_attrs=read-write``).
        self.primary_url = _url(("127.0.0.1", self.primary_port))
        self.standby_url = _url(("127.0.0.1", self.standby_port))
        self.url = _url(
            ("127.0.0.1", self.primary_port),
            ("127.0.0.1", self.standby_port),
            target_session_attrs="read-write",
        )
        self.primary_killed = False
        self.promoted = False

    def __enter__(self) -> StandbyPair:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "remote_apply" if self.synchronous else "async"
        lag = f" lag {self.lag * 1000:g} ms" if self.lag else ""
        return (
            f"<StandbyPair {mode}{lag} :{self.primary_port} -> :{self.standby_port} in {self.dir}>"
        )

    @property
    def database(self) -> Database:
        """The primary, as a fault scenario's database (its schema is made there)."""
        return Database("postgres", self.primary_url)

    # -- building -------------------------------------------------------------------------

    def start(self) -> StandbyPair:
        """Make the primary, copy the standby from it, start both; return once the standby
        streams (and, with ``synchronous``, is the primary's synchronous standby)."""
        why = missing()
        if why is not None:
            raise RuntimeError(f"cannot build a standby pair: {why}")
        if os.geteuid() == 0:
            os.chown(self.dir, pwd.getpwnam(PG_USER).pw_uid, -1)
        self._run(
            "initdb", "-D", self.primary_dir, "-U", "postgres", "--auth=trust", "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        # Asynchronous until the standby streams: a synchronous name would hang every
        # commit before (CREATE DATABASE included).
        self._configure(self.primary_dir, self.primary_port, "primary", _ASYNC)
        self._pg_ctl(self.primary_dir, "start")
        self._autocommit(self.primary_port, "postgres", f"CREATE DATABASE {DATABASE}")
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
            "-D", self.standby_dir, "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip
        # Once promoted, nothing follows the standby: a synchronous name would hang its commits.
        self._configure(self.standby_dir, self.standby_port, STANDBY_NAME, _ASYNC)
        if self.lag > 0:
            self._proxy = LagProxy(("127.0.0.1", self.primary_port), self.lag)
            auto = self.standby_dir / "postgresql.auto.conf"
            text = re.sub(
                rf"\bport={self.primary_port}\b", f"port={self._proxy.port}", auto.read_text()
            )
            auto.write_text(text)
        self._pg_ctl(self.standby_dir, "start")
        wait_until(
            lambda: self._replication_state() == ("streaming", "async"),
            30,
            "the standby to stream",
        )
        if self.synchronous:
            for statement in (
                f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'",
                "ALTER SYSTEM SET synchronous_commit = 'remote_apply'",
                "SELECT pg_reload_conf()",
            ):
                self._autocommit(self.primary_port, DATABASE, statement)
            wait_until(
                lambda: self._replication_state() == ("streaming", "sync"),
                30,
                "the standby to stream as the synchronous standby",
            )
        return self

    def _configure(self, data: Path, port: int, name: str, extra: str) -> None:
        settings = (
            f"\n# cronjob tests: {name}\n"
            f"listen_addresses = '127.0.0.1'\nport = {port}\n"
            f"unix_socket_directories = '{self.dir}'\ncluster_name = '{name}'\n"
            "max_connections = 60\nshared_buffers = 16MB\n"
            "wal_level = replica\nmax_wal_senders = 4\nwal_keep_size = 64MB\nhot_standby = on\n"
            f"{extra}"
        )
        with (data / "postgresql.conf").open("a") as handle:
            handle.write(settings)

    def _as_postgres(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", PG_USER, "--", *argv] if os.geteuid() == 0 else argv

    def _run(self, tool: str, *args: object) -> None:
        argv = self._as_postgres([str(PG_BIN / tool), *map(str, args)])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.dir)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}")

    def _pg_ctl(self, data: Path, *args: str) -> None:
        log = data.parent / f"{data.name}.log"
        self._run("pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", *args)

    def _autocommit(self, port: int, database: str, statement: str) -> None:
        url = _url(("127.0.0.1", port), database=database)
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(statement)
        finally:
            engine.dispose()

    def _replication_state(self) -> tuple[str, str] | None:
        rows = execute(
            self.primary_url,
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = :name",
            {"name": STANDBY_NAME},
        )
        return (rows[0]["state"], rows[0]["sync_state"]) if rows else None

    # -- reading --------------------------------------------------------------------------

    def caught_up(self, timeout: float = 30) -> None:
        """Return once the standby has replayed everything the primary has written so far."""
        (row,) = execute(self.primary_url, "SELECT pg_current_wal_lsn()::text AS lsn")
        target = row["lsn"]

        def replayed() -> bool:
            (done,) = execute(
                self.standby_url,
                "SELECT pg_last_wal_replay_lsn() >= CAST(:lsn AS pg_lsn) AS ok",
                {"lsn": target},
            )
            return bool(done["ok"])

        wait_until(replayed, timeout, f"the standby to replay the primary's WAL up to {target}")

    def receiving(self) -> bool:
        """Whether the standby's WAL receiver is connected to the primary."""
        rows = execute(self.standby_url, "SELECT status FROM pg_stat_wal_receiver")
        return bool(rows)

    # -- faults ---------------------------------------------------------------------------

    def detach(self, timeout: float = 30) -> None:
        """Cut the standby off the primary's stream (``primary_conninfo`` emptied and
        reloaded), as a network partition between them would; return once its WAL
        receiver has stopped. The primary goes on acknowledging commits it alone has
        (unless it waits for the standby: ``synchronous``)."""
        self._autocommit(self.standby_port, DATABASE, "ALTER SYSTEM SET primary_conninfo = ''")
        self._autocommit(self.standby_port, DATABASE, "SELECT pg_reload_conf()")
        wait_until(lambda: not self.receiving(), timeout, "the standby's WAL receiver to stop")

    def kill_primary(self, timeout: float = 30) -> None:
        """Kill the primary as its machine would die, every process of it at one moment:
        the postmaster and each of its children (backends, WAL sender; each runs in a
        session of its own) stopped with ``SIGSTOP``, then killed with ``SIGKILL``, so no
        WAL sender outlives it to send one more byte; return once they are gone."""
        pid = self._postmaster_pid(self.primary_dir)
        assert pid is not None and _alive(pid), "the primary is not running"
        _kill_server(pid, timeout)
        self.primary_killed = True

    def promote(self) -> float:
        """Promote the standby (``pg_ctl promote``, waiting until it accepts writes);
        return the seconds it took."""
        began = time.monotonic()
        self._pg_ctl(self.standby_dir, "promote")
        self.promoted = True
        wait_until(
            lambda: not execute(self.standby_url, "SELECT pg_is_in_recovery() AS r")[0]["r"],
            30,
            "the promoted standby to leave recovery",
        )
        return time.monotonic() - began

    # -- ending ---------------------------------------------------------------------------

    def close(self) -> None:
        """Kill both servers (if running) and delete their files."""
        for data in (self.primary_dir, self.standby_dir):
            pid = self._postmaster_pid(data)
            if pid is not None and _alive(pid):
                with contextlib.suppress(TimeoutError):
                    _kill_server(pid, 10)
        if self._proxy is not None:
            self._proxy.close()
        if os.environ.get("FAULTS_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def _postmaster_pid(data: Path) -> int | None:
        try:
            first = (data / "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        return int(first) if first.strip().isdigit() else None


def _kill_server(postmaster: int, timeout: float) -> None:
    """Stop the postmaster (it forks nothing more), then each of its children, then kill
    them all; return once every one is gone."""
    os.kill(postmaster, signal.SIGSTOP)
    doomed = [postmaster, *children(postmaster)]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for each in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, sig)
    wait_until(
        lambda: not any(map(_alive, doomed)),
        timeout,
        f"the server of postmaster {postmaster} to die",
    )


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class LagProxy:
    """A TCP proxy that delivers each chunk ``lag`` seconds after it arrived, both ways:
    a standby streaming through it lags the primary as one in another zone or region
    would (a round trip of ``2 * lag``)."""

    def __init__(self, upstream: tuple[str, int], lag: float) -> None:
        self._upstream = upstream
        self._lag = lag
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name=f"lag-{self.port}", daemon=True).start()

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                return
            upstream.settimeout(None)
            for sock in (client, upstream):  # as PostgreSQL's own sockets: no Nagle delay
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(src, chunks), daemon=True).start()
                threading.Thread(target=self._write, args=(dst, chunks), daemon=True).start()

    def _read(self, src: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            chunks.put((time.monotonic() + self._lag, data))
            if not data:
                return

    def _write(self, dst: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            due, data = chunks.get()
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return
