"""Publication latency and cost of ``celery beat`` x1, RedBeat x2 and ``cronjob beat``
(x1 and x2), side by side on the same broker and consumer, at N entries every second.

Run: ``python -m benchmarks.bench_beat_latency [--entries 17 167] [--seconds 60]
[--broker amqp://guest:guest@127.0.0.1:5672//] [--database-url postgresql+psycopg://
postgres@127.0.0.1:5432/test | sqlite] [--schedulers celery,redbeat,cronjob1,cronjob2]``
(RedBeat needs ``pip install -e '.[bench]'``).

One app (benchmarks/workers/celery_beat_app.py): ``--entries`` entries every second (17
and 167 are about 1,000 and 10,000 occurrences a minute) to a queue of the run's own. A
plain consumer (kombu, one thread of this process) notes each message's arrival. Each
scheduler runs alone for a window of ``--seconds`` after a warm-up, one after another, in
one invocation. Per scheduler:

- **missing / duplicates**: of entries x whole seconds of the window, the (entry,
  instant) pairs with no message by ``--grace`` seconds (15) after the window (the
  schedulers run on meanwhile: a row left to cronjob's sweep counts once it is sent),
  and the messages beyond one per pair; **late > 1 s**: the messages that came more
  than a second after their instant. cronjob's
  instant is the message's ``cronjob_instant`` header; ``celery beat``'s and RedBeat's is
  their own due time (``bench_due``, the entry's last run plus its period, stamped in
  the beat process by the app), counted in the window by that; an interval entry
  drifts, so fewer than one send a second is "missing" there, as in issue 47.
- **arrival p50 / p99**: the message's arrival at the consumer minus its instant (due).
- **accepted p50 / p99** (cronjob only): the outbox row's ``sent_ms`` (set once the
  broker confirmed the message) minus the instant.
- **outbox recorded / unsent** (cronjob only): the window's (entry, instant) pairs on
  record in the outbox after the grace, and how many of its rows are still unsent: a
  missing pair that is on record and unsent was late, one not on record never published.
- **CPU s**: the beat processes' user + system CPU over the window (``/proc``).
- **connections / commits** (PostgreSQL only): the sessions opened and transactions
  committed in the window on the run's own database (``pg_stat_database``), created for
  each cronjob scenario and dropped after.
- the 1-minute load average at the window's start and end.

Results are appended to ``benchmarks/results/beat_latency.json`` (one row per scenario,
with the commit, the machine and the load).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from kombu import Connection

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "beat_latency.json"
APP = "benchmarks.workers.celery_beat_app"
CRONJOB = "from cronjob.admin._cli import main; raise SystemExit(main())"
SCHEDULERS = ("celery", "redbeat", "cronjob1", "cronjob2")


class Arrivals:
    """Consume a queue on a thread: (arrival, name, instant epoch s, id) per message."""

    def __init__(self, broker: str, queue: str) -> None:
        self.seen: list[tuple[float, str, float, str]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(broker, queue), daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self, broker: str, queue: str) -> None:
        with Connection(broker) as conn:
            simple = conn.SimpleQueue(queue)
            simple.consumer.qos(prefetch_count=500)
            self._ready.set()
            while not self._stop.is_set():
                try:
                    message = simple.get(block=True, timeout=0.2)
                except simple.Empty:
                    continue
                now = time.time()
                h = message.headers
                if "cronjob_instant" in h:
                    at = datetime.fromisoformat(h["cronjob_instant"].replace("Z", "+00:00"))
                    self.seen.append((now, h["cronjob_name"], at.timestamp(), str(h["id"])))
                elif "bench_due" in h:
                    self.seen.append((now, h["bench_entry"], float(h["bench_due"]), str(h["id"])))
                message.ack()
            simple.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (its threads included)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def fresh_postgres(server: str) -> Iterator[tuple[str, sa.Engine, str]]:
    """A database of the run's own on the PostgreSQL server of ``server`` (a URL naming
    any database): its URL, an engine on the server's ``test`` database, its name."""
    name = f"bench_beat_{uuid.uuid4().hex[:8]}"
    url = sa.make_url(server)
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False), admin, name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _pg_counts(admin: sa.Engine, name: str) -> tuple[int, int]:
    with admin.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        row = conn.execute(
            sa.text("SELECT sessions, xact_commit FROM pg_stat_database WHERE datname = :n"),
            {"n": name},
        ).one()
    return int(row[0]), int(row[1])


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def scenario(
    name: str,
    *,
    entries: int,
    broker: str,
    seconds: float,
    warmup: float,
    grace: float,
    database: str | None,
    redis: str,
) -> dict[str, Any]:
    """Run scheduler ``name`` for ``seconds`` after ``warmup``; its row."""
    queue = f"bench-beat-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "BENCH_CELERY_BROKER": broker,
        "BENCH_CELERY_QUEUE": queue,
        "BENCH_BEAT_ENTRIES": str(entries),
        "BENCH_REDBEAT_URL": redis,
        "BENCH_REDBEAT_PREFIX": f"redbeat-{queue}",
        "CRONJOB_LOG_LEVEL": "WARNING",
    }
    py = sys.executable
    with contextlib.ExitStack() as stack:
        admin = dbname = None
        url = database
        if name.startswith("cronjob"):
            if database is None or database.startswith("sqlite"):
                url = f"sqlite:///{ROOT / 'benchmarks' / 'results' / (queue + '.sqlite')}"
                stack.callback(
                    lambda: [Path(url[10:] + s).unlink(True) for s in ("", "-wal", "-shm")]
                )
            else:
                url, admin, dbname = stack.enter_context(fresh_postgres(database))
            replicas = int(name[-1])
            # $BENCH_CRONJOB_SCRIPT: a script to run `cronjob` with instead (a profiler's).
            run = os.environ.get("BENCH_CRONJOB_SCRIPT")
            head = [py, run] if run else [py, "-c", CRONJOB]
            argvs = [[*head, "beat", "-A", APP, "--database-url", url]] * replicas
        elif name == "celery":
            sched = ROOT / "benchmarks" / "results" / f"{queue}.beat"
            stack.callback(lambda: [p.unlink() for p in sched.parent.glob(sched.name + "*")])
            argvs = [[py, "-m", "celery", "-A", APP, "beat", "-s", str(sched), "-l", "WARNING"]]
        else:  # redbeat x2, its keys deleted after
            stack.callback(_drop_redbeat, redis, env["BENCH_REDBEAT_PREFIX"])
            redbeat = ["-S", "redbeat.RedBeatScheduler", "-l", "WARNING"]
            argvs = [[py, "-m", "celery", "-A", APP, "beat", *redbeat]] * 2
        arrivals = Arrivals(broker, queue)
        logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in argvs]
        procs = [
            subprocess.Popen(a, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
            for a, log in zip(argvs, logs, strict=True)
        ]
        try:
            # Warm-up: until the first message has come, then ``warmup`` seconds more; the
            # window opens on a whole second.
            began = time.time()
            while not arrivals.seen and time.time() - began < 120:
                time.sleep(0.1)
            time.sleep(warmup - time.time() % 1)
            start, load0 = time.time(), os.getloadavg()[0]
            cpu0 = sum(_cpu(p.pid) for p in procs)
            pg0 = _pg_counts(admin, dbname) if admin is not None else None
            time.sleep(seconds)
            end, load1 = time.time(), os.getloadavg()[0]
            cpu1 = sum(_cpu(p.pid) for p in procs)
            time.sleep(grace)  # the window's last sends, and the sweep's re-sends
            pg1 = _pg_counts(admin, dbname) if admin is not None else None
            accepted: list[float] = []
            outbox: dict[str, int] = {}
            if name.startswith("cronjob"):
                accepted = _accepted(url, start, end)  # type: ignore[arg-type]
                outbox = _outbox(url, start, end)  # type: ignore[arg-type]
        finally:
            for proc in procs:
                _stop(proc)
            arrivals.stop()
            with Connection(broker) as conn:
                conn.default_channel.queue_delete(queue)
        errors = []
        for log in logs:
            log.seek(0)
            errors.append(log.read().decode(errors="replace")[-3000:])
    inside = [s for s in arrivals.seen if start <= s[2] < end]
    pairs = {(n, int(at)) for _, n, at, _ in inside} if name.startswith("cronjob") else None
    if pairs is None:  # drifting due times: one message per (entry, due) is one send
        pairs = {(n, at) for _, n, at, _ in inside}
    expected = entries * round(end - start)
    late = [t - at for t, _, at, _ in inside]
    row: dict[str, Any] = {
        "scheduler": {
            "celery": "celery beat x1",
            "redbeat": "RedBeat x2",
            "cronjob1": "cronjob beat x1",
            "cronjob2": "cronjob beat x2",
        }[name],
        "entries_per_second": entries,
        "per_minute": entries * 60,
        "broker": broker.split(":")[0],
        "database": url.split(":")[0].split("+")[0] if name.startswith("cronjob") and url else None,
        "seconds": round(end - start),
        "expected": expected,
        "messages": len(inside),
        "missing": max(0, expected - len(pairs)),
        "duplicates": len(inside) - len(pairs),
        "arrival_p50_ms": _pct(late, 0.5),
        "arrival_p99_ms": _pct(late, 0.99),
        "arrival_max_ms": _pct(late, 1.0),
        "late_over_1s": sum(x > 1 for x in late),
        "accepted_p50_ms": _pct(accepted, 0.5),
        "accepted_p99_ms": _pct(accepted, 0.99),
        **outbox,
        "cpu_s": round(cpu1 - cpu0, 2),
        "connections_opened": None if pg0 is None or pg1 is None else pg1[0] - pg0[0],
        "commits": None if pg0 is None or pg1 is None else pg1[1] - pg0[1],
        "load": [round(load0, 2), round(load1, 2)],
    }
    if any("Traceback" in e for e in errors):
        row["stderr"] = [e for e in errors if "Traceback" in e][:1]
    return row


def _drop_redbeat(redis_url: str, prefix: str) -> None:
    from redis import Redis

    client = Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


def _outbox(url: str, start: float, end: float) -> dict[str, int]:
    """What the outbox holds of the window's instants once the grace is over: the
    (name, instant) pairs on record, and how many of them are still unsent. A pair
    missing at the consumer but on record and unsent was late, not lost; one not on
    record was never published."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            recorded, unsent = conn.execute(
                sa.text(
                    "SELECT COUNT(DISTINCT name || ':' || instant_ms),"
                    " COUNT(*) FILTER (WHERE sent_ms IS NULL AND obsolete_ms IS NULL)"
                    " FROM cronjob_outbox WHERE instant_ms >= :a AND instant_ms < :b"
                ),
                {"a": int(start * 1000), "b": int(end * 1000)},
            ).one()
    finally:
        engine.dispose()
    return {"outbox_recorded": int(recorded), "outbox_unsent": int(unsent)}


def _accepted(url: str, start: float, end: float) -> list[float]:
    """Seconds from instant to broker acceptance (``sent_ms``) of the window's rows."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT instant_ms, sent_ms FROM cronjob_outbox WHERE sent_ms IS NOT NULL "
                    "AND instant_ms >= :a AND instant_ms < :b"
                ),
                {"a": int(start * 1000), "b": int(end * 1000)},
            ).all()
    finally:
        engine.dispose()
    return [(s - i) / 1000 for i, s in rows]


def _commit() -> str:
    if os.environ.get("BENCH_CRONJOB_SCRIPT") == "benchmarks/_base_cronjob.py":
        return f"{os.environ.get('BENCH_BASE_COMMIT', '?')} (cronjob from $BENCH_BASE)"
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "cronjob", "lease"], cwd=ROOT, capture_output=True
        )
        return out.stdout.decode().strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, nargs="+", default=[17, 167])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument(
        "--grace", type=float, default=15, help="seconds the schedulers run after the window"
    )
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="RedBeat's store")
    parser.add_argument(
        "--database-url",
        default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
        help="cronjob beat's server (a fresh database each scenario), or 'sqlite'",
    )
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--note", default="", help="a note kept with each row")
    args = parser.parse_args(argv)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for entries in args.entries:
        for name in args.schedulers.split(","):
            row = scenario(
                name,
                entries=entries,
                broker=args.broker,
                seconds=args.seconds,
                warmup=args.warmup,
                grace=args.grace,
                database=args.database_url,
                redis=args.redis,
            )
            row |= {
                "commit": _commit(),
                "note": args.note,
                "when": datetime.now().astimezone().isoformat(timespec="seconds"),
                "machine": f"{platform.node()} {os.cpu_count()} cpu {platform.machine()}",
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps(old + rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
