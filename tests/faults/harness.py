"""The fault harness: replicas as ``cronjob run`` processes, faults, and the invariants.

A :class:`Scenario` runs on one of the supported databases (:data:`DATABASES`) and owns
a lease table of its own there: a PostgreSQL schema (the replicas' ``search_path``), a
MariaDB database, or a SQLite file in the scenario's folder shared by replicas on this
host. So scenarios running at once, and other people's tests on the same servers, never
see each other's lease tables. It starts replicas (:class:`Replica`: an OS process
running ``python -m cronjob run``, optionally behind a :class:`Proxy` of its own or with
a wall clock running ahead under libfaketime), injects faults (``kill -9``, SIGTERM, a
cut connection, a server restart, a SQLite file locked by another process) and records
them as events in the same append-only JSON-lines log the job modules write (see
``jobs_spec``). :func:`check_invariants` then
reads the rounds back from the log and checks the library's promises over them.

Every event carries ``mono``, the host's ``CLOCK_MONOTONIC``: one time base for every
process on the machine, whatever its wall clock says.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import cronjob
import lease
from lease import _engine as lease_engine

REPO = Path(__file__).resolve().parents[2]
#: The PostgreSQL server of the development and CI machines (see SPEC.md, "Databases").
POSTGRES_URL = os.environ.get(
    "CRONJOB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
#: The suite's PgBouncer (scripts/pgbouncer): transaction pooling in front of PostgreSQL.
PGBOUNCER_URL = os.environ.get(
    "CRONJOB_TEST_PGBOUNCER_URL", "postgresql+psycopg://postgres@127.0.0.1:6432/test"
)
#: The MariaDB/MySQL server of the development and CI machines.
MYSQL_URL = os.environ.get("CRONJOB_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
#: The MariaDB server binary ``.ci/run`` starts (and the restart scenario restarts).
MARIADBD = "/usr/sbin/mariadbd"
#: Where each scenario keeps its event log and the replicas' output.
RUNS_DIR = Path(os.environ.get("FAULTS_DIR") or Path(tempfile.gettempdir()) / "cronjob-faults")
#: Keep each scenario's schema after it ends (to look at the lease table).
KEEP = os.environ.get("FAULTS_KEEP") == "1"
#: Debian's libfaketime (package ``faketime``).
LIBFAKETIME_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)
#: The module registering jobs from ``$FAULTS_JOBS``.
JOBS_MODULE = "tests.faults.jobs_spec"

#: The library's timing rules, as the scenarios check them (seconds).
LEASE_TTL = 15.0
RENEW_EVERY = 5.0
LOST_AFTER = 10.0
EXIT_AFTER_LOST = 5.0
SWEEP_EVERY = 15.0
DRAIN_LIMIT = 5.0
EXIT_LEASE_LOST = 70
#: How long a leased round may go on after its timeout cancelled it before its process
#: exits (with :data:`EXIT_LEASE_LOST`, as after a lost lease).
TIMEOUT_GRACE = 5.0
#: How long a SQLite writer waits for another process's write lock (lease/_engine.py).
SQLITE_BUSY_TIMEOUT = lease_engine.SQLITE_BUSY_TIMEOUT

T = TypeVar("T")


def libfaketime() -> str | None:
    """The path of libfaketime, or ``None`` if the ``faketime`` package is missing."""
    return next((p for p in LIBFAKETIME_CANDIDATES if Path(p).exists()), None)


def wait_until(
    probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1
) -> T:
    """Poll ``probe`` until it returns something truthy; raise ``TimeoutError`` naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# -- the database ---------------------------------------------------------------------------


def schema_url(schema: str, *, port: int | None = None, base: str = POSTGRES_URL) -> str:
    """``base`` with ``search_path`` set to ``schema`` (and another port, for a proxy)."""
    url = sa.make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    if port is not None:
        url = url.set(host="127.0.0.1", port=port)
    return url.render_as_string(hide_password=False)


def execute(
    url: str, statement: str, params: dict[str, Any] | None = None, *, autocommit: bool = False
) -> list[Any]:
    """Run one statement on a connection of its own (in autocommit if told: ``CREATE
    DATABASE`` refuses a transaction); return its rows (if any)."""
    parsed = sa.make_url(url).difference_update_query(["pooler"])  # lease's, not libpq's
    sqlite = parsed.get_backend_name() == "sqlite"
    connect_args = {"timeout": 5} if sqlite else {"connect_timeout": 5}
    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    engine = sa.create_engine(parsed, poolclass=NullPool, connect_args=connect_args, **options)
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), params or {})
            return list(result.mappings()) if result.returns_rows else []
    finally:
        engine.dispose()


def reachable(url: str) -> str | None:
    """``None`` if the server at ``url`` answers, else why not."""
    try:
        execute(url, "SELECT 1")
    except sa.exc.SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc
        return f"{type(cause).__name__}: {cause}"
    return None


def postgres_reachable(url: str = POSTGRES_URL) -> str | None:
    """``None`` if the PostgreSQL server answers, else why not."""
    return reachable(url)


def postgres_cluster() -> tuple[str, str] | None:
    """The local Debian cluster serving port 5432, as ``(version, name)``, if any."""
    if shutil.which("pg_lsclusters") is None:
        return None
    port = sa.make_url(POSTGRES_URL).port or 5432
    listing = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True)
    for line in listing.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == str(port) and parts[3] == "online":
            return parts[0], parts[1]
    return None


def restart_postgres(mode: str = "fast", timeout: float = 60.0) -> float:
    """Restart the local PostgreSQL cluster (every session is cut); return the seconds
    it took until the server answered again."""
    cluster = postgres_cluster()
    if cluster is None:
        raise RuntimeError("no local PostgreSQL cluster on the test port to restart")
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "restart", "-m", mode],
        check=True,
        capture_output=True,
        timeout=timeout,
    )
    wait_until(lambda: postgres_reachable() is None, timeout, "PostgreSQL to answer again", 0.2)
    return time.monotonic() - began


def mysql_restartable(url: str = MYSQL_URL) -> str | None:
    """``None`` if the MariaDB server at ``url`` runs here and can be restarted, else why
    not."""
    host = sa.make_url(url).host or "127.0.0.1"
    if host not in ("127.0.0.1", "localhost"):
        return f"the MariaDB server runs on {host}, not on this host"
    for tool in ("mariadb-admin", "start-stop-daemon", "pgrep"):
        if shutil.which(tool) is None:
            return f"{tool} is missing"
    if not Path(MARIADBD).exists():
        return f"{MARIADBD} is missing"
    return None


def restart_mysql(url: str = MYSQL_URL, timeout: float = 90.0) -> float:
    """Restart the local MariaDB server (every session is cut): shut it down, start
    ``mariadbd`` again as ``.ci/run`` does; return the seconds it took until the server
    answered again."""
    parsed = sa.make_url(url)
    began = time.monotonic()
    subprocess.run(
        [
            "mariadb-admin",
            "-h",
            parsed.host or "127.0.0.1",
            "-P",
            str(parsed.port or 3306),
            "-u",
            parsed.username or "root",
            "shutdown",
        ],
        check=True,
        capture_output=True,
        timeout=timeout,
    )

    def gone() -> bool:
        return subprocess.run(["pgrep", "-x", "mariadbd"], capture_output=True).returncode != 0

    wait_until(gone, timeout, "mariadbd to exit", 0.2)
    subprocess.run(
        ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", MARIADBD],
        check=True,
        capture_output=True,
        timeout=timeout,
    )
    wait_until(lambda: reachable(url) is None, timeout, "MariaDB to answer again", 0.2)
    return time.monotonic() - began


@dataclass(frozen=True)
class Database:
    """One of the supported databases, as a scenario uses it: ``kind`` is ``postgres``,
    ``pgbouncer`` (PostgreSQL through PgBouncer in transaction mode), ``mysql``
    (MariaDB/MySQL) or ``sqlite``; ``url`` is the server's (empty for SQLite).

    Each scenario gets a lease table of its own (:meth:`create`): a schema on PostgreSQL,
    a database on MariaDB and behind PgBouncer (which does not pass on the ``options``
    that name a schema), a file in the scenario's folder for SQLite.
    """

    kind: str
    url: str = ""

    @property
    def server(self) -> bool:
        """Whether it is a server reached over TCP (so a proxy can cut it off)."""
        return self.kind != "sqlite"

    def reachable(self) -> str | None:
        """``None`` if the database can be used, else why not."""
        return reachable(self.url) if self.server else None

    def upstream(self) -> tuple[str, int]:
        """The server's address, for a :class:`Proxy`."""
        parsed = sa.make_url(self.url)
        return parsed.host or "127.0.0.1", parsed.port or {"postgres": 5432}.get(self.kind, 3306)

    def create(self, name: str, folder: Path) -> str:
        """Make an empty place for one scenario's lease table; return its URL."""
        if self.kind == "postgres":
            execute(self.url, f"CREATE SCHEMA {name}")
            return schema_url(name, base=self.url)
        if self.kind == "mysql":
            execute(self.url, f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
            return sa.make_url(self.url).set(database=name).render_as_string(hide_password=False)
        if self.kind == "pgbouncer":
            execute(POSTGRES_URL, f"CREATE DATABASE {name}", autocommit=True)
            url = sa.make_url(self.url).set(database=name)
            url = url.update_query_dict({"pooler": "transaction"})
            return url.render_as_string(hide_password=False)
        return f"sqlite:///{folder / 'lease.sqlite'}"

    def drop(self, name: str) -> None:
        if self.kind == "postgres":
            execute(self.url, f"DROP SCHEMA IF EXISTS {name} CASCADE")
        elif self.kind == "pgbouncer":  # FORCE: PgBouncer keeps server connections to it
            execute(POSTGRES_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", autocommit=True)
        elif self.kind == "mysql":
            execute(self.url, f"DROP DATABASE IF EXISTS {name}")

    def via(self, url: str, port: int) -> str:
        """``url`` through a proxy listening on ``port`` on this host."""
        parsed = sa.make_url(url).set(host="127.0.0.1", port=port)
        return parsed.render_as_string(hide_password=False)

    def restartable(self) -> str | None:
        """``None`` if the suite can restart the server, else why not."""
        if self.kind in ("postgres", "pgbouncer"):
            return None if postgres_cluster() is not None else "no local PostgreSQL cluster"
        if self.kind == "mysql":
            return mysql_restartable(self.url)
        return "SQLite has no server to restart"

    def restart(self) -> float:
        """Restart the server; return the seconds until it answered again."""
        if self.kind in ("postgres", "pgbouncer"):
            return restart_postgres()
        if self.kind == "mysql":
            return restart_mysql(self.url)
        raise RuntimeError("SQLite has no server to restart")


#: The databases the suite runs on, by the name the tests and ``--database`` use.
DATABASES = {
    "postgres": Database("postgres", POSTGRES_URL),
    "pgbouncer": Database("pgbouncer", PGBOUNCER_URL),
    "mysql": Database("mysql", MYSQL_URL),
    "sqlite": Database("sqlite"),
}


# -- SQLite locks ---------------------------------------------------------------------------

#: The byte of the ``-shm`` file a SQLite connection locks while it holds the write lock
#: of a WAL database (``WALINDEX_LOCK_OFFSET`` + ``WAL_WRITE_LOCK`` in sqlite3.c).
WAL_WRITE_LOCK_BYTE = 120


def sqlite_path(url: str) -> Path:
    database = sa.make_url(url).database
    assert database, f"not a SQLite file: {url}"
    return Path(database)


def sqlite_writers(path: Path) -> set[int]:
    """The pids holding the write lock of the WAL database at ``path`` (``/proc/locks``)."""
    try:
        inode = os.stat(f"{path}-shm").st_ino
    except FileNotFoundError:
        return set()
    found: set[int] = set()
    with open("/proc/locks") as handle:
        for line in handle:
            parts = line.split()
            # "1: POSIX  ADVISORY  WRITE 1234 fe:00:5678 120 120"
            if len(parts) < 8 or parts[1] != "POSIX" or parts[3] != "WRITE":
                continue
            if parts[5].rsplit(":", 1)[-1] == str(inode) and parts[6] == str(WAL_WRITE_LOCK_BYTE):
                found.add(int(parts[4]))
    return found


_HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN IMMEDIATE")
print("locked", time.monotonic(), flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
print("released", time.monotonic(), flush=True)
"""


def hold_sqlite_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    """Start a process that takes the write lock of ``path`` (``BEGIN IMMEDIATE``), holds
    it ``seconds``, and commits; it prints ``locked <mono>`` and ``released <mono>``."""
    return subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(path), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )


# -- the proxy ------------------------------------------------------------------------------


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset, as a dropped connection looks to its peer.

    ``shutdown`` first: a plain ``close`` while a pump thread is blocked in ``recv`` on
    the socket releases only the descriptor, and the connection would stay open.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    upstream: socket.socket | None = None
    cut: bool = False

    def reset(self) -> None:
        _reset(self.client)
        if self.upstream is not None:
            _reset(self.upstream)


class Proxy:
    """A TCP proxy of the suite's own between one replica and its database server.

    ``cut("blackhole")`` keeps every connection open but forwards nothing either way, and
    new connections are accepted and then left hanging: the replica's statements never
    return, as behind a dead network path. ``cut("reset")`` resets every connection and
    refuses new ones at once. ``heal()`` forwards again (connections left over from a
    blackhole are reset, so their holders notice and reconnect).
    """

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        url = sa.make_url(POSTGRES_URL)
        self._upstream = upstream or (url.host or "127.0.0.1", url.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._mode = "pass"
        self._pairs: set[_Pair] = set()
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def mode(self) -> str:
        return self._mode

    def cut(self, mode: str = "blackhole") -> None:
        if mode not in ("blackhole", "reset"):
            raise ValueError(f"unknown cut mode {mode!r}")
        with self._lock:
            self._mode = mode
            pairs = list(self._pairs)
            for pair in pairs:
                pair.cut = True
        if mode == "reset":
            for pair in pairs:
                pair.reset()

    def heal(self) -> None:
        with self._lock:
            self._mode = "pass"
            stale = [pair for pair in self._pairs if pair.cut]
            self._pairs.difference_update(stale)
        for pair in stale:
            pair.reset()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            pair.reset()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                mode = self._mode
                if mode != "reset":
                    pair = _Pair(client, cut=mode == "blackhole")
                    self._pairs.add(pair)
            if mode == "reset":
                _reset(client)
                continue
            if pair.cut:  # blackhole: read and drop whatever the client sends
                self._spawn(pair, client, None)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                pair.reset()
                continue
            pair.upstream = upstream
            self._spawn(pair, client, upstream)
            self._spawn(pair, upstream, client)

    def _spawn(self, pair: _Pair, src: socket.socket, dst: socket.socket | None) -> None:
        threading.Thread(target=self._pump, args=(pair, src, dst), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket | None) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if pair.cut or dst is None:
                    continue  # swallowed
                dst.sendall(data)
        except OSError:
            pass
        if pair.cut and src is pair.upstream:
            return  # behind a blackhole the client must not learn the server went away
        with self._lock:
            self._pairs.discard(pair)
        pair.reset()


# -- replicas -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """One job of ``jobs_spec`` (see its docstring for the modes).

    ``options`` are the keyword options passed on to ``register`` (the job's policies,
    such as ``{"timeout": 3}``); they must survive JSON, as they reach the replicas in
    ``$FAULTS_JOBS``.
    """

    name: str
    spec: str
    mode: str = "work"
    duration: float = 0.0
    per_instance: bool = False
    options: dict[str, Any] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "mode": self.mode,
            "duration": self.duration,
            "per_instance": self.per_instance,
            "options": dict(self.options),
        }


class Process:
    """One OS process of a replica (a restart is a new one)."""

    def __init__(self, replica: Replica, generation: int, argv: list[str], env: dict[str, str]):
        self.replica = replica
        self.log_path = replica.scenario.dir / f"{replica.name}.{generation}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self.started = time.monotonic()
        self.exited: float | None = None
        self.rc: int | None = None
        replica.scenario.emit("spawn", replica=replica.name, pid=self.pid)
        threading.Thread(target=self._reap, name=f"reap-{self.pid}", daemon=True).start()

    def _reap(self) -> None:
        rc = self.popen.wait()
        self.exited = time.monotonic()
        self.rc = rc
        self._log.close()
        self.replica.scenario.emit("exit", replica=self.replica.name, pid=self.pid, rc=rc)

    @property
    def alive(self) -> bool:
        return self.rc is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int, kind: str) -> None:
        self.replica.scenario.emit("fault", kind=kind, replica=self.replica.name, pid=self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        wait_until(lambda: not self.alive, timeout, f"{self.replica.name} (pid {self.pid}) to exit")
        assert self.rc is not None
        return self.rc

    def wait_log(self, pattern: str, timeout: float) -> re.Match[str]:
        regex = re.compile(pattern)

        def probe() -> re.Match[str] | None:
            alive = self.alive  # read first: a line written before the exit is seen
            found = regex.search(self.output())
            if found is None and not alive:
                raise RuntimeError(
                    f"{self.replica.name} (pid {self.pid}) exited with status {self.rc} "
                    f"before {pattern!r}:\n{self.output()[-3000:]}"
                )
            return found

        return wait_until(
            probe,
            timeout,
            f"{pattern!r} in the output of {self.replica.name} (pid {self.pid})",
            interval=0.2,
        )


class Replica:
    """A named replica of a scenario: ``cronjob run`` with the scenario's jobs module.

    ``proxy=True`` puts a :class:`Proxy` of its own between it and the database server;
    ``faketime="+2s"`` runs its wall clock ahead under libfaketime (its monotonic clock
    stays the host's).
    """

    def __init__(
        self,
        scenario: Scenario,
        name: str,
        *,
        proxy: bool = False,
        faketime: str | None = None,
        env: dict[str, str] | None = None,
        modules: Sequence[str] | None = None,
        url: str | None = None,
    ) -> None:
        self.scenario = scenario
        self.name = name
        if proxy and not scenario.db.server:
            raise ValueError(f"no proxy for {scenario.db.kind}: it is not reached over TCP")
        self.proxy = Proxy(scenario.db.upstream()) if proxy else None
        if self.proxy is not None:
            scenario.proxies.append(self.proxy)
        self.faketime = faketime
        self.extra_env = env or {}
        self.modules = list(modules or scenario.modules)
        if url is not None:
            self.url = url
        elif self.proxy is not None:
            self.url = scenario.db.via(scenario.url, self.proxy.port)
        else:
            self.url = scenario.url
        self.processes: list[Process] = []

    def __repr__(self) -> str:
        return f"<Replica {self.name} pid={self.pid}>"

    @property
    def current(self) -> Process:
        return self.processes[-1]

    @property
    def pid(self) -> int | None:
        return self.processes[-1].pid if self.processes else None

    @property
    def alive(self) -> bool:
        return bool(self.processes) and self.current.alive

    def start(self) -> Process:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("FAULTS_", "CRONJOB_", "LD_PRELOAD", "FAKETIME"))
        }
        env.update(
            FAULTS_LOG=str(self.scenario.log), CRONJOB_LOG_LEVEL="INFO", PYTHONUNBUFFERED="1"
        )
        if JOBS_MODULE in self.modules:
            env["FAULTS_JOBS"] = json.dumps([job.as_dict() for job in self.scenario.jobs])
        if self.faketime is not None:
            library = libfaketime()
            if library is None:
                raise RuntimeError("libfaketime is missing: apt-get install faketime")
            env.update(
                LD_PRELOAD=library,
                FAKETIME=self.faketime,
                FAKETIME_DONT_FAKE_MONOTONIC="1",
                FAKETIME_DONT_RESET="1",
            )
        env.update(self.extra_env)
        argv = [sys.executable, "-m", "cronjob", "run", "--database-url", self.url, *self.modules]
        process = Process(self, len(self.processes), argv, env)
        self.processes.append(process)
        return process

    def wait_started(self, timeout: float = 60.0) -> None:
        self.current.wait_log(r"scheduler \S+ started", timeout)

    def kill9(self) -> Process:
        process = self.current
        process.signal(signal.SIGKILL, "kill9")
        return process

    def term(self) -> Process:
        process = self.current
        process.signal(signal.SIGTERM, "sigterm")
        return process

    def cut(self, mode: str = "blackhole") -> None:
        assert self.proxy is not None, f"{self.name} has no proxy"
        self.scenario.emit("fault", kind=f"cut-{mode}", replica=self.name, pid=self.pid)
        self.proxy.cut(mode)

    def heal(self) -> None:
        assert self.proxy is not None
        self.scenario.emit("heal", replica=self.name, pid=self.pid)
        self.proxy.heal()

    def output(self) -> str:
        return "".join(process.output() for process in self.processes)


# -- scenarios ------------------------------------------------------------------------------


class Scenario:
    """One scenario: a lease table of its own on ``db`` (a key of :data:`DATABASES`, or a
    :class:`Database` of the test's own, such as a private server's), an event log,
    replicas, faults.

    Use as a context manager: on exit every process still alive is killed, the proxies
    closed and the schema or database dropped (kept with ``FAULTS_KEEP=1``). The event
    log, the replicas' output and a SQLite database stay in :attr:`dir`.
    """

    def __init__(
        self,
        name: str,
        jobs: Sequence[JobSpec] = (),
        *,
        modules: Sequence[str] = (JOBS_MODULE,),
        db: str | Database = "postgres",
    ) -> None:
        self.name = name
        self.db = DATABASES[db] if isinstance(db, str) else db
        self.jobs = list(jobs)
        self.modules = list(modules)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        token = uuid.uuid4().hex[:8]
        self.dir = RUNS_DIR / f"{name}-{self.db.kind}-{stamp}-{token}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "events.jsonl"
        self.log.touch()
        #: The scenario's schema (PostgreSQL) or database (MariaDB).
        self.schema = f"faults_{re.sub(r'[^a-z0-9]', '_', name.lower())}_{token}"
        self.url = self.db.create(self.schema, self.dir)
        self.replicas: dict[str, Replica] = {}
        self.proxies: list[Proxy] = []
        self.began = time.monotonic()

    def __enter__(self) -> Scenario:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Scenario {self.name} in {self.dir}>"

    def replica(self, name: str, **options: Any) -> Replica:
        replica = Replica(self, name, **options)
        self.replicas[name] = replica
        return replica

    def start(self, *names: str, wait: bool = True) -> None:
        """Start the named replicas (all if none named), and wait until they run."""
        chosen = [self.replicas[n] for n in names] if names else list(self.replicas.values())
        for replica in chosen:
            replica.start()
        if wait:
            for replica in chosen:
                replica.wait_started()

    def stop(self, timeout: float = 15.0) -> dict[str, int]:
        """SIGTERM every live replica; return the exit status of each."""
        live = [r for r in self.replicas.values() if r.alive]
        self.emit("stop")
        for replica in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(replica.current.pid, signal.SIGTERM)
        return {r.name: r.current.wait(timeout) for r in live}

    def close(self) -> None:
        for replica in self.replicas.values():
            for process in replica.processes:
                if process.alive:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGKILL)
        for proxy in self.proxies:
            proxy.close()
        for replica in self.replicas.values():
            for process in replica.processes:
                with contextlib.suppress(TimeoutError):
                    process.wait(10)
        if not KEEP:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self.db.drop(self.schema)

    # -- the log ---------------------------------------------------------------------------

    def emit(self, ev: str, **fields: Any) -> None:
        """Append a harness event (a fault, a process exit) to the log."""
        record = {"ev": ev, "scenario": self.name, **fields}
        record.update(t=time.time(), mono=time.monotonic())
        line = (json.dumps(record) + "\n").encode()
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def events(self) -> list[dict[str, Any]]:
        with self.log.open() as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def wait_event(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            return next((e for e in self.events() if predicate(e)), None)

        return wait_until(probe, timeout, what, interval=0.05)

    def wait_start(
        self,
        job: str,
        timeout: float,
        *,
        attempt: int | None = None,
        after: float = 0.0,
        pid: int | None = None,
        exclude_pid: int | None = None,
    ) -> dict[str, Any]:
        """Wait for a round of ``job`` to start (after monotonic time ``after``)."""

        def match(e: dict[str, Any]) -> bool:
            return (
                e["ev"] == "start"
                and e["job"] == job
                and e["mono"] >= after
                and (attempt is None or e["attempt"] == attempt)
                and (pid is None or e["pid"] == pid)
                and (exclude_pid is None or e["pid"] != exclude_pid)
            )

        desc = f"a round of {job!r}" + (f" (attempt {attempt})" if attempt else "")
        return self.wait_event(match, timeout, desc)

    def rounds(self) -> list[RoundRecord]:
        return build_rounds(self.events())

    def outputs(self) -> dict[int, str]:
        return {
            process.pid: process.output()
            for replica in self.replicas.values()
            for process in replica.processes
        }

    def disturbed(self) -> dict[int, list[float]]:
        """When each process was hit by a fault or ended (monotonic times, by pid)."""
        return disturbances(self.events())

    def unrecorded(self) -> set[tuple[str, str, int]]:
        """``(job, instant, attempt)`` of rounds whose end the library could not record."""
        return unrecorded_ends(self.outputs().values())

    def check(
        self, *, fault_free: bool = False, window: tuple[datetime, datetime] | None = None
    ) -> Report:
        """Check the invariants over the log so far (see :func:`check_invariants`)."""
        return check_invariants(
            self.rounds(),
            {job.name: job for job in self.jobs},
            unrecorded=self.unrecorded(),
            disturbed=self.disturbed(),
            fault_free=fault_free,
            window=window,
            horizon=time.monotonic(),
        )

    # -- the lease table -------------------------------------------------------------------

    def sql(self, statement: str, **params: Any) -> list[Any]:
        return execute(self.url, statement, params)

    def lease_row(self, name: str) -> dict[str, Any] | None:
        rows = self.sql("SELECT * FROM cronjob_lease WHERE name = :name", name=name)
        return dict(rows[0]) if rows else None


# -- the rounds and the invariants ----------------------------------------------------------


@dataclass
class RoundRecord:
    """One round as the log tells it."""

    job: str
    instant: datetime
    attempt: int
    replica: str
    pid: int
    start: float  # monotonic
    end: float | None = None  # monotonic: the job's end event, else its process's exit
    outcome: str = "running"  # done, failed, cut (raised its cancellation), died, running
    cause: str = ""
    cancelled_at: float | None = None  # when a job ignoring its cancellation noticed it
    exit_rc: int | None = None  # the exit status of a process that died in the round

    @property
    def ran_to_end(self) -> bool:
        return self.outcome in ("done", "failed")

    def describe(self) -> str:
        return (
            f"{self.job} {self.instant.isoformat()} attempt {self.attempt} on pid {self.pid}"
            f" ({self.outcome})"
        )


def build_rounds(events: Iterable[dict[str, Any]]) -> list[RoundRecord]:
    """Rebuild the scheduled rounds from the log: start, end, cancellation, process exit
    (manual rounds, ``cronjob trigger``'s, are left to the scenario that asks for them)."""
    # A process may start the same (job, instant, attempt) twice (a claim the database
    # forgot, after a failover to a standby that lacked it): each start is a round, and
    # an end or a cancellation belongs to the earliest start under its key not yet ended.
    rounds: dict[tuple[int, str, str, int], list[RoundRecord]] = defaultdict(list)
    exits: dict[int, dict[str, Any]] = {}
    for e in events:
        ev = e["ev"]
        if ev == "exit":
            exits[e["pid"]] = e
            continue
        if ev not in ("start", "end", "cancelled") or e.get("trigger") == "manual":
            continue  # a manual round runs off the schedule: the scenario checks its own
        key = (e["pid"], e["job"], e["instant"], e["attempt"])
        if ev == "start":
            rounds[key].append(
                RoundRecord(
                    job=e["job"],
                    instant=datetime.fromisoformat(e["instant"]),
                    attempt=e["attempt"],
                    replica=e["replica"],
                    pid=e["pid"],
                    start=e["mono"],
                )
            )
            continue
        record = next((r for r in rounds.get(key, ()) if r.end is None), None)
        if record is None:
            continue
        if ev == "end":
            record.end = e["mono"]
            record.outcome = e["outcome"]
            record.cause = e.get("cause", "")
        else:
            record.cancelled_at = e["mono"]
            record.cause = e.get("cause", "")
    every = [record for records in rounds.values() for record in records]
    for record in every:
        if record.end is None and record.pid in exits:
            record.end = exits[record.pid]["mono"]
            record.outcome = "died"
            record.exit_rc = exits[record.pid]["rc"]
    return sorted(every, key=lambda r: r.start)


_UNRECORDED = re.compile(
    r"round of job '(?P<job>[^']+)' instant (?P<instant>\S+) attempt (?P<attempt>\d): "
    r"its end is not on record"
)


#: A first round whose claim the library handed back before it ran (the claim came back
#: after its loss deadline, or no thread could run it): the sweep runs it as attempt 2.
_NOT_STARTED = re.compile(
    r"job '(?P<job>[^']+)': the round of (?P<instant>\S+) is not started: no worker thread"
)
#: The same for the rounds of a claim given back unrun (it came back too late, or a drain
#: began before their instant), a hundred names a line.
_CLAIM_HANDED_BACK = re.compile(
    r"the claim of (?P<instant>\S+) .*: given back, not run here: (?P<jobs>.*)$",
    re.MULTILINE,
)


def unrecorded_ends(outputs: Iterable[str]) -> set[tuple[str, str, int]]:
    """The rounds whose end the library logged as not on record, and the first rounds it
    handed back before they ran (as ``(job, instant, 1)``)."""
    found: set[tuple[str, str, int]] = set()
    for text in outputs:
        for m in _UNRECORDED.finditer(text):
            instant = datetime.fromisoformat(m["instant"]).isoformat()
            found.add((m["job"], instant, int(m["attempt"])))
        for m in _NOT_STARTED.finditer(text):
            instant = datetime.fromisoformat(m["instant"]).isoformat()
            found.add((m["job"], instant, 1))
        for m in _CLAIM_HANDED_BACK.finditer(text):
            instant = datetime.fromisoformat(m["instant"]).isoformat()
            found.update((job, instant, 1) for job in re.findall(r"'([^']+)'", m["jobs"]))
    return found


def disturbances(events: Iterable[dict[str, Any]]) -> dict[int, list[float]]:
    """When each process was hit by a fault (kill, SIGTERM, cut) or ended, by pid."""
    found: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e["ev"] in ("fault", "exit") and e.get("pid") is not None:
            found[e["pid"]].append(e["mono"])
    return found


@dataclass
class Report:
    """What :func:`check_invariants` found."""

    rounds: int = 0
    violations: list[str] = field(default_factory=list)
    #: Rounds cut short that ran a second time, with the delay from the first's end.
    reruns: list[tuple[RoundRecord, RoundRecord, float]] = field(default_factory=list)
    #: Rounds cut short that a later instant gave up.
    given_up: list[RoundRecord] = field(default_factory=list)
    #: Rounds cut short too close to the end of the log to tell.
    pending: list[RoundRecord] = field(default_factory=list)
    #: Rounds cut short twice (given up by the rule).
    twice: list[RoundRecord] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert not self.violations, "invariant violations:\n  " + "\n  ".join(self.violations)


def expected_instants(spec: str, start: datetime, end: datetime) -> list[datetime]:
    """The instants of ``spec`` in ``[start, end]``."""
    schedule = cronjob.parse(spec)
    found: list[datetime] = []
    moment = schedule.next(start - timedelta(microseconds=1))
    while moment is not None and moment <= end:
        found.append(moment)
        moment = schedule.next(moment)
    return found


def check_invariants(
    rounds: Sequence[RoundRecord],
    jobs: dict[str, JobSpec],
    *,
    unrecorded: set[tuple[str, str, int]] = frozenset(),  # type: ignore[assignment]
    disturbed: dict[int, list[float]] | None = None,
    fault_free: bool = False,
    window: tuple[datetime, datetime] | None = None,
    horizon: float | None = None,
    settle: float = LEASE_TTL + 2 * SWEEP_EVERY,
) -> Report:
    """Check the library's promises over ``rounds`` (leased jobs only).

    1. Two rounds of one job never overlap in time, across every replica.
    2. An instant starts at most twice: attempt 1, then attempt 2 only after a first that
       did not run to its end, or whose end may not be on record: the library logged it
       so, or the first round's process was hit by a fault or ended between the round's
       end and the second run (``disturbed``: pid -> times), before writing it. And only
       if no later instant of the job started in between.
    3. Every round cut short is re-run, or given up by a later instant, or cut short a
       second time; ``pending`` holds those too close to ``horizon`` (within ``settle``
       seconds) to tell.
    4. With ``fault_free`` and a ``window`` (wall-clock UTC), every instant of each job
       shorter than its period in the window ran exactly once.
    """
    report = Report(rounds=len(rounds))
    bad = report.violations
    by_job: dict[str, list[RoundRecord]] = defaultdict(list)
    for r in rounds:
        spec = jobs.get(r.job)
        if spec is not None and spec.per_instance:
            continue
        by_job[r.job].append(r)

    for job, job_rounds in by_job.items():
        job_rounds.sort(key=lambda r: r.start)
        # 1. No overlap: each round starts after every earlier one has ended.
        busy_until: float | None = None  # None: nothing ran yet; inf: one never ended
        holder: RoundRecord | None = None
        for r in job_rounds:
            if holder is not None and busy_until is not None and r.start < busy_until:
                bad.append(f"overlap: {r.describe()} started while {holder.describe()} ran")
            end = r.end if r.end is not None else float("inf")
            if busy_until is None or end >= busy_until:
                busy_until, holder = end, r
        # 2. At most twice, in order.
        by_instant: dict[datetime, list[RoundRecord]] = defaultdict(list)
        for r in job_rounds:
            by_instant[r.instant].append(r)
        for instant, runs in by_instant.items():
            if len(runs) > 2:
                bad.append(
                    f"instant run {len(runs)} times: " + "; ".join(x.describe() for x in runs)
                )
                continue
            first = runs[0]
            handed_back = (job, instant.isoformat(), 1) in unrecorded
            if first.attempt != 1 and not handed_back:
                bad.append(f"first run of an instant is not attempt 1: {first.describe()}")
            if len(runs) == 2:
                second = runs[1]
                if second.attempt != 2:
                    bad.append(f"second run of an instant is not attempt 2: {second.describe()}")
                key = (job, instant.isoformat(), 1)
                hit = [
                    t
                    for t in (disturbed or {}).get(first.pid, [])
                    if first.end is not None and first.end - 1.0 <= t <= second.start
                ]
                if first.ran_to_end and key not in unrecorded and not hit:
                    bad.append(
                        f"re-run of a round that ran to its end (and on record): "
                        f"{second.describe()} after {first.describe()}"
                    )
                later = [
                    x
                    for x in job_rounds
                    if x.instant > instant and first.start < x.start < second.start
                ]
                if later:
                    bad.append(
                        f"re-run after a later instant started: {second.describe()} after "
                        f"{later[0].describe()}"
                    )
                if first.end is not None:
                    report.reruns.append((first, second, second.start - first.end))
                if not second.ran_to_end:
                    report.twice.append(second)
        # 3. Every round cut short re-run or given up.
        for instant, runs in by_instant.items():
            first = runs[0]
            unfinished = not first.ran_to_end or (job, instant.isoformat(), 1) in unrecorded
            if len(runs) != 1 or first.attempt != 1 or not unfinished:
                continue
            if any(x.instant > instant and x.start > first.start for x in job_rounds):
                report.given_up.append(first)
            elif first.end is None or horizon is None or horizon - first.end < settle:
                report.pending.append(first)
            else:
                bad.append(
                    f"round cut short neither re-run nor given up within {settle:g}s: "
                    f"{first.describe()}"
                )
    # 4. No instant lost without faults.
    if fault_free and window is not None:
        for name, spec in jobs.items():
            if spec.per_instance:
                continue
            period = _period(spec.spec)
            if period is not None and spec.duration >= period:
                continue  # instants in flight are skipped by design
            job_rounds = by_job.get(name, [])
            ran = {r.instant for r in job_rounds}
            # A round that ended after a later instant overran it, and the rule skips an
            # overrun instant: under load a round can start late enough to overrun the
            # next one, though its job is shorter than the period. (Monotonic time is
            # the host's, shared by the replicas' processes.)
            to_wall = time.time() - time.monotonic()
            overran = [(r.instant, r.end + to_wall) for r in job_rounds if r.end is not None]
            for instant in expected_instants(spec.spec, *window):
                if instant in ran:
                    continue
                at = instant.timestamp()
                if any(begun < instant and ended >= at for begun, ended in overran):
                    continue
                bad.append(f"instant lost without a fault: {name} {instant.isoformat()}")
    return report


def _period(spec: str) -> float | None:
    """The shortest gap between two instants of ``spec`` over a sample, in seconds."""
    schedule = cronjob.parse(spec)
    moments: list[datetime] = []
    moment: datetime | None = datetime(2026, 1, 1, tzinfo=UTC)
    while moment is not None and len(moments) < 20:
        moment = schedule.next(moment)
        if moment is not None:
            moments.append(moment)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(moments)]
    return min(gaps) if gaps else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


def wall_now() -> datetime:
    """The harness's (real) wall clock, as an aware UTC datetime."""
    return datetime.now(UTC)


@contextlib.contextmanager
def timed(record: dict[str, float], key: str) -> Iterator[None]:
    began = time.monotonic()
    try:
        yield
    finally:
        record[key] = round(time.monotonic() - began, 2)


def redacted(url: str) -> str:
    return lease.redact(url)
