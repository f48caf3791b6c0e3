"""Run replica processes of one scheduler on one piece of work and measure them.

A *scenario* is: which scheduler (``cronjob``, ``apscheduler3``, ``apscheduler4``,
``procrastinate``, ``dbos``), how many replicas (OS processes), how many jobs on which
schedule, and a measurement window.
The harness

1. recreates the benchmark database (``cronjob_bench`` by default, on the server of
   ``$CRONJOB_BENCH_POSTGRES_URL``, or of the URL given to :func:`use_server`: a
   MariaDB/MySQL one runs ``cronjob`` alone; never the tests' database);
2. starts the replicas (the first one alone when the peer writes its schedules at start,
   so they do not race to insert them), waits a warm-up, and opens the window at the
   next whole second that is an instant of the jobs (a multiple of their period);
3. samples each replica's CPU time (``/proc/PID/stat``) at the window's start and end and
   its resident memory (``VmRSS``) every half second;
4. stops them with SIGTERM a few seconds after the window (drain), collects what each
   recorded (:mod:`benchmarks.workers._record`) and the database's own counters
   (``pg_stat_database``: transactions and rows, whole lifetime of the replicas).

Only rounds whose scheduled instant lies in the window count. *Expected* are all the
instants of every job in the window; *missed* are expected (job, instant) pairs no
replica started; *duplicates* are starts beyond the first of a pair.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SERVER_URL = os.environ.get(
    "CRONJOB_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
DATABASE = os.environ.get("CRONJOB_BENCH_DATABASE", "cronjob_bench")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def use_server(url: str) -> None:
    """Run the scenarios on the server at ``url`` (PostgreSQL, or MariaDB/MySQL for
    ``cronjob`` alone) instead of ``$CRONJOB_BENCH_POSTGRES_URL``'s."""
    global SERVER_URL
    SERVER_URL = url


def on_mariadb() -> bool:
    """Whether the scenarios run on a MariaDB/MySQL server."""
    return sa.make_url(SERVER_URL).get_backend_name() in ("mysql", "mariadb")


def bench_url(driver: str | None = "postgresql+psycopg") -> str:
    """The benchmark database's URL, with ``driver`` (``None``: the server URL's own)."""
    url = sa.make_url(SERVER_URL)
    url = url.set(drivername=driver or url.drivername, database=DATABASE)
    return url.render_as_string(hide_password=False)


@contextlib.contextmanager
def _admin() -> Iterator[sa.Connection]:
    """A connection to the server's own database (autocommit), its engine disposed after."""
    engine = sa.create_engine(SERVER_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def reset_database() -> None:
    with _admin() as conn:
        if on_mariadb():
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{DATABASE}`"))
            conn.execute(sa.text(f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4"))
            return
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{DATABASE}"'))


def db_counters() -> dict[str, int]:
    """The benchmark database's counters in ``pg_stat_database`` (flushed by the server);
    none on MariaDB/MySQL, whose counters are the whole (shared) server's."""
    if on_mariadb():
        return {}
    with _admin() as conn:
        row = (
            conn.execute(
                sa.text(
                    "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, "
                    "tup_inserted, tup_updated, tup_deleted FROM pg_stat_database "
                    "WHERE datname = :name"
                ),
                {"name": DATABASE},
            )
            .mappings()
            .one()
        )
    return {key: int(value) for key, value in row.items()}


def server_info() -> dict[str, str]:
    with _admin() as conn:
        if on_mariadb():
            return {"mariadb": str(conn.execute(sa.text("SELECT VERSION()")).scalar_one())}
        version = conn.execute(sa.text("SHOW server_version")).scalar_one()
    return {"postgresql": str(version)}


@dataclass
class Implementation:
    """How to start one replica of a scheduler."""

    name: str
    command: list[str]
    #: The SQLAlchemy driver of its URL; ``None``: the server URL's (``cronjob``).
    driver: str | None = "postgresql+psycopg"
    ready_marker: bool = False  # the worker touches BENCH_OUT.ready once it has started
    env: dict[str, str] = field(default_factory=dict)
    #: Threads a replica starts per job (DBOS: one per schedule), to refuse a row that
    #: would take a large part of the machine's process ids (shared with other work).
    threads_per_job: int = 0


def cronjob_impl(log_level: str = "WARNING") -> Implementation:
    python = str(ROOT / ".venv" / "bin" / "python")
    return Implementation(
        name="cronjob",
        command=[
            python,
            "-m",
            "cronjob",
            "run",
            "--database-url",
            "{url}",
            "--max-workers",
            "{slots}",
            "benchmarks.workers.cronjob_jobs",
        ],
        env={"CRONJOB_LOG_LEVEL": log_level},
        driver=None,
    )


def _peer(
    name: str, requirements: str, worker: str, **options: Any
) -> Callable[[], Implementation]:
    """A peer's ``Implementation`` factory: ``benchmarks/workers/WORKER`` run by the
    interpreter of the peer's own virtualenv, pinned by the list named ``requirements``
    in :mod:`benchmarks.peers.requirements` (created on first use). Peers write their
    schedules at start, so the first replica starts alone."""

    def make() -> Implementation:
        from benchmarks.peers import ensure_venv
        from benchmarks.peers import requirements as pins

        python = str(ensure_venv(name, getattr(pins, requirements)))
        return Implementation(
            name=name,
            command=[python, str(ROOT / "benchmarks" / "workers" / worker)],
            ready_marker=True,
            **options,
        )

    return make


IMPLEMENTATIONS: dict[str, Callable[[], Implementation]] = {
    "cronjob": cronjob_impl,
    "apscheduler3": _peer("apscheduler3", "APSCHEDULER3", "aps3_worker.py"),
    "apscheduler4": _peer("apscheduler4", "APSCHEDULER4", "aps4_worker.py"),
    # procrastinate and DBOS take a libpq URL (no SQLAlchemy driver name).
    "procrastinate": _peer(
        "procrastinate", "PROCRASTINATE", "procrastinate_worker.py", driver="postgresql"
    ),
    "dbos": _peer("dbos", "DBOS", "dbos_worker.py", driver="postgresql", threads_per_job=1),
}
#: Every scheduler, in the order the scenarios interleave them.
ALL = ",".join(IMPLEMENTATIONS)


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _expected_instants(start: int, end: int, period: int | None) -> list[int]:
    if period is None:
        return []
    first = math.ceil(start / period) * period
    return list(range(first, end, period))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def run_scenario(
    impl: Implementation,
    *,
    scenario: str,
    replicas: int,
    jobs: int,
    spec: str,
    period: int | None,
    seconds: int,
    warmup: float,
    grace: float = 3.0,
    job_seconds: float = 0.0,
    slots: int = 64,
    kill_at: float | None = None,
    ready_timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``replicas`` processes of ``impl`` with ``jobs`` jobs on ``spec``; measure.

    ``period`` is the spacing of the jobs' instants in seconds (``None``: none expected in
    the window, as in the idle scenario). Each round works ``job_seconds``; each replica
    runs at most ``slots`` rounds at once. ``kill_at``: seconds into the window at which
    the last replica is killed (``kill -9``); the result then has ``kill`` (see
    :func:`kill_phases`). ``ready_timeout``: how long a replica may take to say it is
    ready (peers that write their schedules at start) before the row is given up
    (default: 60 s, or ``jobs / 50`` s if longer).
    """
    if ready_timeout is None:
        ready_timeout = max(60.0, jobs / 50)
    threads = replicas * jobs * impl.threads_per_job
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    if threads > pid_max // 2:
        raise RuntimeError(
            f"not run: {threads} threads ({impl.threads_per_job} per job per replica) would"
            f" take over half of this machine's {pid_max} process ids"
        )
    if on_mariadb() and impl.driver is not None:
        raise RuntimeError(f"not run: {impl.name} runs here on PostgreSQL only")
    reset_database()
    url = bench_url(impl.driver)
    before = db_counters()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{impl.name}-"))
    procs: list[subprocess.Popen[bytes]] = []
    outs: list[Path] = []
    logs = []
    launched = time.time()
    try:
        for index in range(replicas):
            out = workdir / f"replica-{index}.json"
            env = dict(os.environ)
            env.update(impl.env)
            env.update(
                {
                    "BENCH_JOBS": str(jobs),
                    "BENCH_SPEC": spec,
                    "BENCH_OUT": str(out),
                    "BENCH_REPLICA": f"r{index}",
                    "BENCH_JOB_SECONDS": str(job_seconds),
                    "BENCH_SLOTS": str(slots),
                    "BENCH_STREAM": "1" if kill_at is not None else "0",
                    "BENCH_DATABASE_URL": url,
                    "PYTHONPATH": str(ROOT),
                }
            )
            command = [
                part.replace("{url}", url).replace("{slots}", str(slots)) for part in impl.command
            ]
            log = open(workdir / f"replica-{index}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log))
            outs.append(out)
            if impl.ready_marker and index == 0:
                _wait_ready(out, procs[0], timeout=ready_timeout)
        for index, out in enumerate(outs):
            if impl.ready_marker:
                _wait_ready(out, procs[index], timeout=ready_timeout)
        step = period or 1
        window_start = math.ceil((time.time() + warmup) / step) * step
        window_end = window_start + seconds
        _sleep_until(window_start)
        cpu_start = [_cpu_seconds(p.pid) for p in procs]
        load_start = _loadavg()
        rss_max = [0.0] * replicas
        killed_at: float | None = None
        while time.time() < window_end:
            if kill_at is not None and killed_at is None and time.time() >= window_start + kill_at:
                procs[-1].kill()
                killed_at = time.time()
            for index, proc in enumerate(procs):
                rss = _rss_mb(proc.pid)
                if rss is not None:
                    rss_max[index] = max(rss_max[index], rss)
            wake = min(window_end, time.time() + 0.5)
            if kill_at is not None and killed_at is None:
                wake = min(wake, window_start + kill_at)
            time.sleep(max(0.0, wake - time.time()))
        cpu_end = [_cpu_seconds(p.pid) for p in procs]
        load_end = _loadavg()
        _sleep_until(window_end + grace)
        alive = [proc.poll() is None for proc in procs]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        exit_codes = []
        for proc in procs:
            try:
                exit_codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                exit_codes.append(proc.wait())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    time.sleep(1.0)  # let the server flush the exited backends' counters
    after = db_counters()
    reports = []
    for out in outs:
        try:
            reports.append(json.loads(out.read_text()))
        except (OSError, ValueError):
            stream = Path(str(out) + ".rounds")
            rounds = (
                [
                    [name, float(instant), float(start)]
                    for name, instant, start in (
                        line.split() for line in stream.read_text().splitlines() if line
                    )
                ]
                if stream.exists()
                else []
            )
            reports.append({"rounds": rounds, "statements": [], "checkouts": [], "missing": True})
    result = _analyse(
        reports,
        window_start=window_start,
        window_end=window_end,
        jobs=jobs,
        period=period,
        kill_time=killed_at,
    )
    cpu = [
        (b - a) if a is not None and b is not None else None
        for a, b in zip(cpu_start, cpu_end, strict=True)
    ]
    result.update(
        {
            "scenario": scenario,
            "implementation": impl.name,
            "replicas": replicas,
            "jobs": jobs,
            "spec": spec,
            "seconds": seconds,
            "window": [window_start, window_end],
            "startup_s": round(window_start - launched, 1),
            "cpu_s": round(sum(c for c in cpu if c is not None), 2),
            "cpu_s_per_replica": [None if c is None else round(c, 2) for c in cpu],
            "rss_max_mb": [round(r, 1) for r in rss_max],
            "alive_at_end": alive,
            "exit_codes": exit_codes,
            "db_counters_lifetime": {k: after[k] - before[k] for k in after},
            "loadavg": {"start": load_start, "end": load_end},
            "logs": str(workdir),
        }
    )
    counted = result["db_counters_lifetime"]
    result["db_xacts_per_round_lifetime"] = (
        round(
            (
                result["db_counters_lifetime"]["xact_commit"]
                + result["db_counters_lifetime"]["xact_rollback"]
            )
            / max(1, result["rounds_total"]),
            2,
        )
        if result["rounds_total"] and counted
        else None
    )
    # No rounds in the window: no cost per round (not the CPU over a pretend one).
    run = result["rounds_run"]
    result["cpu_ms_per_round"] = round(result["cpu_s"] * 1000 / run, 3) if run else None
    result["cpu_us_per_round"] = round(result["cpu_s"] * 1e6 / run) if run else None
    result["killed_at_s"] = None if killed_at is None else round(killed_at - window_start, 2)
    return result


def _wait_ready(out: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    marker = Path(str(out) + ".ready")
    deadline = time.time() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"replica exited with {proc.returncode} before it was ready")
        if time.time() > deadline:
            raise RuntimeError("replica not ready in time")
        time.sleep(0.1)


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.5))


def _shares(by_instant: dict[int, list[int]], *, killed_after: int | None = None) -> dict[str, Any]:
    """How evenly each instant's rounds were shared by the live replicas: every replica,
    but the last one (the one a kill run kills) no longer after ``killed_after``, its
    kill instant. The lowest and highest share of a replica in an instant, in % of its
    fair share (the instant's rounds / live replicas); the instants run by more than one
    replica; and those in which every live replica ran 80-120 % of its fair share.

    A replica that ran nothing in an instant is live all the same: it counts at 0 %
    (a scheduler that leaves one replica idle is not sharing).
    """
    low, high, multi, fair_instants = float("inf"), 0.0, 0, 0
    for instant, counts in by_instant.items():
        live = counts if killed_after is None or instant <= killed_after else counts[:-1]
        if sum(1 for n in live if n) > 1:
            multi += 1
        fair = sum(live) / len(live) if live else 0
        if fair:
            low = min(low, min(live) / fair * 100)
            high = max(high, max(live) / fair * 100)
            fair_instants += 0.8 * fair <= min(live) and max(live) <= 1.2 * fair
    return {
        "share_pct": [round(low), round(high)] if by_instant else None,
        "instants_fair": f"{fair_instants}/{len(by_instant)}",
        "instants_shared": f"{multi}/{len(by_instant)}",
    }


def kill_phases(
    by_instant: dict[int, list[int]],
    seen: set[tuple[str, int]],
    *,
    names: list[str],
    instants: list[int],
    replicas: int,
    kill_time: float,
) -> dict[str, Any]:
    """Split a run in which a replica was killed at ``kill_time`` (epoch seconds) around
    the kill: the *kill instant* is the last expected instant at or before the kill (its
    rounds may have been in flight in the killed replica), *before* are the instants
    earlier, *after* the instants later. For each phase: the (job, instant) pairs no
    replica started (``missed_*``), and each replica's mean rounds per instant
    (``rounds_per_instant_*``; ``None`` for a phase without instants).
    ``by_instant`` maps an instant to the rounds each replica started for it; ``seen``
    holds every (job, instant) started.
    """
    at = max((i for i in instants if i <= kill_time), default=None)
    phases = {
        "before": [i for i in instants if at is not None and i < at],
        "at_kill": [] if at is None else [at],
        "after": [i for i in instants if at is None or i > at],
    }
    result: dict[str, Any] = {"kill_instant": at, "kill_after_instant_s": None}
    if at is not None:
        result["kill_after_instant_s"] = round(kill_time - at, 3)
    for phase, chosen in phases.items():
        result[f"missed_{phase}"] = sum(1 for i in chosen for n in names if (n, i) not in seen)
        result[f"rounds_per_instant_{phase}"] = (
            [
                round(sum(by_instant.get(i, [0] * replicas)[r] for i in chosen) / len(chosen), 1)
                for r in range(replicas)
            ]
            if chosen
            else None
        )
    result["missed"] = [result[f"missed_{phase}"] for phase in phases]
    return result


def _analyse(
    reports: list[dict[str, Any]],
    *,
    window_start: int,
    window_end: int,
    jobs: int,
    period: int | None,
    kill_time: float | None = None,
) -> dict[str, Any]:
    seen: dict[tuple[str, int], int] = {}
    lateness_ms: list[float] = []
    rounds_total = 0
    # Rounds each replica started, per instant of the window.
    by_instant: dict[int, list[int]] = {}
    for index, report in enumerate(reports):
        for name, instant, start in report["rounds"]:
            rounds_total += 1
            if instant != instant:  # NaN: no instant known
                continue
            whole = round(instant)
            if not window_start <= whole < window_end:
                continue
            seen[(name, whole)] = seen.get((name, whole), 0) + 1
            lateness_ms.append((start - instant) * 1000)
            by_instant.setdefault(whole, [0] * len(reports))[index] += 1
    names = [f"job-{i:05d}" for i in range(jobs)]
    instants = _expected_instants(window_start, window_end, period)
    expected = len(names) * len(instants)
    missed = sum(1 for i in instants for n in names if (n, i) not in seen)
    duplicates = sum(count - 1 for count in seen.values())
    run = sum(seen.values())
    statements: dict[str, int] = {}
    checkouts = 0
    per_replica_statements = []
    for report in reports:
        own = 0
        for second, kind, count in report["statements"]:
            if window_start <= second < window_end:
                statements[kind] = statements.get(kind, 0) + count
                own += count
        per_replica_statements.append(own)
        checkouts += sum(
            n for second, n in report["checkouts"] if window_start <= second < window_end
        )
    total_statements = sum(statements.values())
    minutes = (window_end - window_start) / 60
    kill = (
        kill_phases(
            by_instant,
            set(seen),
            names=names,
            instants=instants,
            replicas=len(reports),
            kill_time=kill_time,
        )
        if kill_time is not None
        else None
    )
    return {
        **_shares(by_instant, killed_after=None if kill is None else kill["kill_instant"]),
        # Each replica's mean rounds started per expected instant of the window.
        "rounds_per_instant": [
            round(sum(counts[r] for counts in by_instant.values()) / len(instants), 1)
            for r in range(len(reports))
        ]
        if instants
        else None,
        "kill": kill,
        # Rounds each replica started at each instant of the window (JSON only).
        "rounds_by_instant": {str(k): v for k, v in sorted(by_instant.items())},
        "expected": expected,
        "rounds_run": run,
        "rounds_total": rounds_total,
        "duplicates": duplicates,
        "missed": missed,
        "lateness_ms": {
            "p50": round(_percentile(lateness_ms, 0.50), 2),
            "p95": round(_percentile(lateness_ms, 0.95), 2),
            "p99": round(_percentile(lateness_ms, 0.99), 2),
            "max": round(max(lateness_ms), 2) if lateness_ms else float("nan"),
            "mean": round(statistics.fmean(lateness_ms), 2) if lateness_ms else float("nan"),
        },
        "statements": total_statements,
        "statements_by_kind": dict(sorted(statements.items(), key=lambda kv: -kv[1])),
        "statements_per_round": round(total_statements / run, 3) if run else None,
        "statements_per_replica_per_minute": [
            round(n / minutes, 1) for n in per_replica_statements
        ],
        "pool_checkouts": checkouts,
        "pool_checkouts_per_round": round(checkouts / run, 3) if run else None,
        "replica_reports_missing": sum(1 for r in reports if r.get("missing")),
        "cpu_s_reported_lifetime": [r.get("cpu_s") for r in reports],
        "maxrss_mb_lifetime": [round(r.get("maxrss_kb", 0) / 1024, 1) for r in reports],
    }


def save(name: str, document: dict[str, Any], *, merge: bool = False) -> Path:
    """Write ``document`` to ``results/NAME.json``.

    With ``merge``, rows of the file already there whose (implementation, replicas, jobs,
    variant, job_ms, slots) this run did not measure are kept (re-running one peer keeps
    the others' rows).
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    if merge and path.exists():
        previous = json.loads(path.read_text()).get("results", [])

        def key(row: dict[str, Any]) -> tuple[Any, ...]:
            return tuple(
                row.get(k)
                for k in ("implementation", "replicas", "jobs", "variant", "job_ms", "slots")
            )

        fresh = {key(row) for row in document["results"]}
        kept = [row for row in previous if key(row) not in fresh]
        document = {**document, "results": kept + document["results"]}
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return path


def publish(name: str, benchmark: str, rows: list[dict[str, Any]], *, merge: bool = False) -> Path:
    """Save ``rows`` as the results of ``benchmark`` (with the time and the machine) to
    ``results/NAME.json`` (see :func:`save` for ``merge``) and say where."""
    path = save(
        name,
        {
            "benchmark": benchmark,
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "results": rows,
        },
        merge=merge,
    )
    print(f"written to {path}")
    return path


def save_run(benchmark: str, **fields: Any) -> Path:
    """Save one run of ``benchmark`` to ``results/BENCHMARK.json``: its name, the time, the
    Python and SQLAlchemy versions, then ``fields``; and say where."""
    path = save(
        benchmark,
        {
            "benchmark": benchmark,
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "sqlalchemy": sa.__version__,
            **fields,
        },
    )
    print(f"written to {path}")
    return path


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    info = {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem_gb": round(int(mem) / 1024 / 1024, 1),
        "python": sys.version.split()[0],
        "loadavg": _loadavg(),
    }
    try:
        info.update(server_info())
    except sa.exc.SQLAlchemyError as exc:
        info["postgresql"] = f"unavailable: {exc}"
    return info
