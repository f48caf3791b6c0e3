"""Run one cell of the fleet benchmark (``bench_fleet``): R ``cronjob run`` replicas (OS
processes) with J jobs of one mix against one PostgreSQL, measured over a window.

1. The benchmark database is recreated (``_harness.reset_database``: ``cronjob_bench``
   on ``$CRONJOB_BENCH_POSTGRES_URL``).
2. The replicas start together (``benchmarks/workers/fleet_jobs.py``). Start-up is
   measured apart: *registered* is when a replica's jobs module had registered every job,
   *ready* when it is on record in ``cronjob_replica`` (its scheduler started: tables
   migrated, ``ensure`` of every row, start-up's read, first sweep). A cell whose replicas
   are not all ready within ``ready_cap`` seconds is given up: its replicas are killed
   and the row says so (with the start-up measured so far).
3. After ``warmup`` seconds (the replicas learn of each other) the window opens at the
   next whole second (whole minute for the ``same-second`` mix, so its instant is in it)
   and lasts ``seconds``. At its ends: each replica's CPU (``/proc/PID/stat``), the
   database server's CPU (the postmaster and all its children, the same way: on a
   server shared with other work, theirs counts too) and ``pg_stat_database``'s counters
   (flushed by the server within about a second). Resident memory sampled every half
   second in the window; the peak of each replica's life (``VmHWM``) at its end.
4. ``grace`` seconds after the window (late rounds of its last instants start), SIGTERM;
   the replicas' reports are read and analysed (:mod:`benchmarks._fleet_analysis`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks import _fleet_analysis, _harness, _mix
from tests._process import children


def _status_kb(pid: int, field: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def postmaster_pid() -> int | None:
    """The benchmark server's postmaster, if it runs on this machine (the parent of the
    backend that answers us), else ``None``."""
    with _harness._admin() as conn:
        backend = int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
        try:  # while the backend lives: it ends with the connection
            stat = Path(f"/proc/{backend}/stat").read_text()
        except OSError:
            return None
    parent = int(stat.rsplit(")", 1)[1].split()[1])
    return parent if Path(f"/proc/{parent}").exists() else None


def server_cpu(postmaster: int | None) -> dict[int, float]:
    """CPU seconds of the postmaster and each of its children, by process id."""
    if postmaster is None:
        return {}
    cpu = {pid: _harness._cpu_seconds(pid) for pid in [postmaster, *children(postmaster)]}
    return {pid: seconds for pid, seconds in cpu.items() if seconds is not None}


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent between two readings: a process that started between counts whole; one
    that ended between is lost (its last part uncounted)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


#: The lease table's access counters (``pg_stat_user_tables``) read over the window:
#: whole-table reads (``seq_*``), index probes (``idx_*``), rows written.
TABLE_COUNTERS = (
    "seq_scan",
    "seq_tup_read",
    "idx_scan",
    "idx_tup_fetch",
    "n_tup_upd",
    "n_tup_hot_upd",
)


def lease_table_counters() -> dict[str, int]:
    """``cronjob_lease``'s counters in ``pg_stat_user_tables`` (empty if unreadable)."""
    engine = sa.create_engine(_harness.bench_url(), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            row = (
                conn.execute(
                    sa.text(
                        f"SELECT {', '.join(TABLE_COUNTERS)} FROM pg_stat_user_tables "
                        "WHERE relname = 'cronjob_lease'"
                    )
                )
                .mappings()
                .first()
            )
    except sa.exc.SQLAlchemyError:
        return {}
    finally:
        engine.dispose()
    return {} if row is None else {key: int(value or 0) for key, value in row.items()}


def lease_index_counters() -> dict[str, int]:
    """Live rows fetched through each of ``cronjob_lease``'s indexes
    (``pg_stat_user_indexes.idx_tup_fetch``, by index; empty if unreadable): which read
    fetches the rows counted in ``idx_tup_fetch``."""
    if _harness.on_mariadb():
        return {}
    engine = sa.create_engine(_harness.bench_url(), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT indexrelname, idx_tup_fetch FROM pg_stat_user_indexes "
                    "WHERE relname = 'cronjob_lease'"
                )
            ).all()
    except sa.exc.SQLAlchemyError:
        return {}
    finally:
        engine.dispose()
    return {str(name): int(fetched or 0) for name, fetched in rows}


#: The statements' counters read from ``pg_stat_statements`` (where the server loads it).
STATEMENT_COUNTERS = ("calls", "rows", "shared_blks_hit", "shared_blks_read")


def statement_counters() -> dict[str, dict[str, int]]:
    """Each statement's counters in ``pg_stat_statements`` on the benchmark's database, by
    its text (empty where the server's own database has not the extension): which
    statements read the lease table's rows."""
    if _harness.on_mariadb():
        return {}
    try:
        with _harness._admin() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT query, {', '.join(STATEMENT_COUNTERS)} FROM pg_stat_statements "
                    "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = :name)"
                ),
                {"name": _harness.DATABASE},
            ).all()
    except sa.exc.SQLAlchemyError:
        return {}
    found: dict[str, dict[str, int]] = {}
    for query, *values in rows:
        into = found.setdefault(str(query), dict.fromkeys(STATEMENT_COUNTERS, 0))
        for key, value in zip(STATEMENT_COUNTERS, values, strict=True):
            into[key] += int(value or 0)
    return found


def statement_deltas(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], *, top: int = 12
) -> list[dict[str, Any]]:
    """The ``top`` statements by blocks touched between two readings, with their text cut
    to 160 characters."""
    deltas = []
    for query, counts in after.items():
        was = before.get(query, {})
        delta = {key: counts[key] - was.get(key, 0) for key in STATEMENT_COUNTERS}
        if delta["calls"] > 0:
            deltas.append({"query": " ".join(query.split())[:160], **delta})
    deltas.sort(key=lambda d: d["shared_blks_hit"] + d["shared_blks_read"], reverse=True)
    return deltas[:top]


def _on_record() -> dict[int, float]:
    """Replicas on record (``cronjob_replica``), by process id, with when each was first
    seen there; empty while the table does not exist yet."""
    engine = sa.create_engine(_harness.bench_url(), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT pid FROM cronjob_replica")).all()
    except sa.exc.SQLAlchemyError:
        return {}
    finally:
        engine.dispose()
    return {int(pid): time.time() for (pid,) in rows}


def _read_report(out: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(out.read_text()))
    except (OSError, ValueError):
        return {"rounds": [], "missing": True}


def _stop(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    codes = []
    deadline = time.time() + timeout
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


def _add_schedules(jobs: list[_mix.Job]) -> float:
    """Migrate the benchmark database and add ``jobs`` as schedules of the task ``fleet``
    (``add_many``, 10,000 a transaction); the seconds it took."""
    import lease
    from cronjob import schedules

    engine = lease.create_engine(_harness.bench_url())
    try:
        lease.migrate(engine)
        began = time.time()
        news = [schedules.New(job.name, task="fleet", spec=job.spec) for job in jobs]
        for first in range(0, len(news), 10_000):
            schedules.add_many(engine, news[first : first + 10_000])
        return round(time.time() - began, 2)
    finally:
        engine.dispose()


def run_cell(
    *,
    replicas: int,
    jobs: int,
    mix: str,
    seconds: int,
    warmup: float = 8.0,
    grace: float = 10.0,
    ready_cap: float = 150.0,
    slots: int = 64,
    log_level: str = "WARNING",
    say: Callable[[str], None] = print,
    data: bool = False,
) -> dict[str, Any]:
    """Run ``replicas`` processes with ``jobs`` jobs of ``mix`` over a window of
    ``seconds``; return the row (see the module's docstring). A cell given up has
    ``error`` and the start-up measured until then. With ``data``, the jobs are schedules
    made of data of one task (``schedules.add_many`` before the replicas start), named
    and timed as the registered jobs would be."""
    the_jobs = _mix.mix(mix, jobs)
    _harness.reset_database()
    added_s = _add_schedules(the_jobs) if data else None
    postmaster = postmaster_pid()
    url = _harness.bench_url()
    command = _harness.cronjob_impl(log_level).command
    command = [
        "benchmarks.workers.fleet_jobs"
        if part == "benchmarks.workers.cronjob_jobs"
        else part.replace("{url}", url).replace("{slots}", str(slots))
        for part in command
    ]
    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    row: dict[str, Any] = {
        "implementation": "cronjob",
        "variant": f"{mix} data" if data else mix,
        "mix": mix,
        "data": data,
        "schedules_added_s": added_s,
        "replicas": replicas,
        "jobs": jobs,
        "seconds": seconds,
        "warmup_s": warmup,
        "grace_s": grace,
        "logs": str(workdir),
        "loadavg_before": _harness._loadavg(),
    }
    procs: list[subprocess.Popen[bytes]] = []
    outs: list[Path] = []
    logs = []
    launched = time.time()
    try:
        for index in range(replicas):
            out = workdir / f"replica-{index}.json"
            env = {
                **os.environ,
                "CRONJOB_LOG_LEVEL": log_level,
                "BENCH_JOBS": str(jobs),
                "BENCH_MIX": mix,
                "BENCH_OUT": str(out),
                "BENCH_REPLICA": f"r{index}",
                "BENCH_SLOTS": str(slots),
                "BENCH_DATA": "1" if data else "",
                "PYTHONPATH": str(_harness.ROOT),
            }
            log = open(workdir / f"replica-{index}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(command, cwd=_harness.ROOT, env=env, stdout=log, stderr=log)
            )
            outs.append(out)
        ready = _wait_ready(procs, launched, ready_cap, row)
        row["startup"] = _startup(procs, outs, launched, ready)
        if "error" in row:
            say(f"  given up: {row['error']}")
            return row
        align = 60 if mix == "same-second" else 1
        start = math.ceil((time.time() + warmup) / align) * align
        end = start + seconds
        _harness._sleep_until(start)
        cpu0 = [_harness._cpu_seconds(p.pid) for p in procs]
        pg0 = server_cpu(postmaster)
        counters0 = _harness.db_counters()
        table0 = lease_table_counters()
        statements0 = statement_counters()
        indexes0 = lease_index_counters()
        rss_max = [0.0] * replicas
        while time.time() < end:
            for index, proc in enumerate(procs):
                rss_max[index] = max(rss_max[index], _harness._rss_mb(proc.pid) or 0.0)
            time.sleep(max(0.0, min(0.5, end - time.time())))
        cpu1 = [_harness._cpu_seconds(p.pid) for p in procs]
        pg1 = server_cpu(postmaster)
        hwm = [(_status_kb(p.pid, "VmHWM") or 0) / 1024 for p in procs]
        row["loadavg_window_end"] = _harness._loadavg()
        time.sleep(1.2)  # the server flushes its counters about every second
        counters1 = _harness.db_counters()
        table1 = lease_table_counters()
        row["pg_statements"] = statement_deltas(statements0, statement_counters())
        row["lease_index_fetches"] = {
            name: fetched - indexes0.get(name, 0)
            for name, fetched in lease_index_counters().items()
        }
        _harness._sleep_until(end + grace)
        row["alive_at_end"] = sum(proc.poll() is None for proc in procs)
        row["exit_codes"] = _stop(procs, timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    reports = [_read_report(out) for out in outs]
    cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True) if a is not None and b is not None]
    row.update(
        _fleet_analysis.analyse(
            reports,
            the_jobs,
            start=start,
            end=end,
            server={
                "counters": {k: counters1[k] - counters0[k] for k in counters1},
                "cpu_s": round(cpu_between(pg0, pg1), 2) if postmaster else None,
                "lease_table": {k: table1[k] - table0.get(k, 0) for k in table1},
            },
        )
    )
    row.update(
        {
            "window": [start, end],
            "replica_cpu_s": round(sum(cpu), 2),
            "replica_cpu_pct_each_max": round(max(cpu, default=0) / seconds * 100, 1),
            "rss_window_max_mb": round(max(rss_max), 1),
            "rss_peak_lifetime_mb": round(max(hwm, default=0), 1),
            "replica_reports_missing": sum(1 for r in reports if r.get("missing")),
            "loadavg_after": _harness._loadavg(),
            "wall_s": round(time.time() - launched, 1),
        }
    )
    return row


def _wait_ready(
    procs: list[subprocess.Popen[bytes]], launched: float, cap: float, row: dict[str, Any]
) -> dict[int, float]:
    """Wait until every replica is on record; at most ``cap`` seconds from ``launched``.
    Sets ``row["error"]`` when one exited or the cap passed."""
    ready: dict[int, float] = {}
    pids = {proc.pid for proc in procs}
    while len(ready) < len(procs):
        for pid, when in _on_record().items():
            if pid in pids:
                ready.setdefault(pid, when)
        dead = [proc for proc in procs if proc.poll() is not None]
        if dead:
            row["error"] = f"a replica exited with {dead[0].returncode} before it was ready"
            break
        if time.time() - launched > cap and len(ready) < len(procs):
            row["error"] = f"not ready in {cap:.0f} s: {len(ready)}/{len(procs)} replicas started"
            break
        time.sleep(0.5)
    return ready


def _startup(
    procs: list[subprocess.Popen[bytes]], outs: list[Path], launched: float, ready: dict[int, float]
) -> dict[str, Any]:
    """Start-up, the slowest replica's: seconds to register the jobs, then to be ready."""
    registered = []
    for out in outs:
        with contextlib.suppress(OSError, ValueError):  # not registered (yet)
            registered.append(float(Path(str(out) + ".registered").read_text()) - launched)
    started = [when - launched for when in ready.values()]
    return {
        "registered_s": round(max(registered), 1) if registered else None,
        "ready_s": round(max(started), 1) if len(started) == len(procs) else None,
        "ready_replicas": len(ready),
        "rss_peak_mb": round(
            max(((_status_kb(p.pid, "VmHWM") or 0) / 1024 for p in procs), default=0), 1
        ),
    }
