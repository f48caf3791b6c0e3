"""The same every-second schedule through ``celery beat`` and through ``cronjob beat``:
the duplicates two schedulers send, and the gap when the only one is down.

Run: ``python -m benchmarks.bench_celery_beat [--seconds 30] [--broker redis://...]
[--database-url URL]``.

One ``beat_schedule`` entry every second (benchmarks/workers/celery_beat_app.py). A
consumer on the benchmark's own queue notes each message as it arrives. Scenarios, each
``--seconds`` long:

- ``celery beat x1``: one beat, as Celery asks;
- ``celery beat x2``: two beats (two deployments, or a rollout that overlaps);
- ``celery beat, down a third``: one beat, stopped for the middle third of the window,
  then started again (a crash and a restart, a node drain);
- ``cronjob beat x2``: two ``cronjob beat`` replicas on one SQLite file (or, with
  ``--database-url``, a fresh schema of that PostgreSQL server, or database of that
  MariaDB server); each sends through the outbox (record, publish, mark);
- ``cronjob beat x2, one down a third``: one of the two stopped for the middle third.

Columns: messages; seconds with at least one message (for cronjob: distinct instants,
read from the ``cronjob_instant`` header); duplicates (beat: messages beyond one in a
second, since each send has a new id; cronjob: messages beyond one per task id);
seconds of the window with none (the gap); the load average at the window's start and
end. Writes ``benchmarks/results/celery_beat.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kombu import Connection

from benchmarks._outbox_targets import fresh_database

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "celery_beat.json"
APP = "benchmarks.workers.celery_beat_app"
CRONJOB_BEAT = "from cronjob.admin._cli import main; raise SystemExit(main())"


class Arrivals:
    """Consume the queue on a thread, noting (arrival time, task id) of each message."""

    def __init__(self, broker: str, queue: str) -> None:
        self.seen: list[tuple[float, str, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(broker, queue), daemon=True)
        self._thread.start()

    def _run(self, broker: str, queue: str) -> None:
        with Connection(broker) as conn:
            simple = conn.SimpleQueue(queue)
            while not self._stop.is_set():
                try:
                    message = simple.get(block=True, timeout=0.2)
                except simple.Empty:
                    continue
                headers = message.headers
                self.seen.append(
                    (time.time(), str(headers.get("id")), headers.get("cronjob_instant"))
                )
                message.ack()
            simple.close()

    def stop(self) -> None:
        time.sleep(1.5)  # the last sends
        self._stop.set()
        self._thread.join(5)


def launch(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def celery_beat(workdir: Path, n: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        APP,
        "beat",
        "--schedule",
        str(workdir / f"celerybeat-{n}"),
        "--loglevel",
        "WARNING",
    ]


def cronjob_beat(database: str) -> list[str]:
    return [sys.executable, "-c", CRONJOB_BEAT, "beat", "-A", APP, "--database-url", database]


def scenario(
    name: str, broker: str, seconds: float, argvs: list[list[str]], down: int | None
) -> dict[str, Any]:
    """Run the processes ``argvs`` for ``seconds``; process ``down`` (an index) is
    stopped for the middle third and started again."""
    queue = f"bench-beat-{uuid.uuid4().hex[:8]}"
    env = {
        "BENCH_CELERY_BROKER": broker,
        "BENCH_CELERY_QUEUE": queue,
        "CRONJOB_LOG_LEVEL": "WARNING",
    }
    arrivals = Arrivals(broker, queue)
    procs = [launch(a, env) for a in argvs]
    try:
        time.sleep(5)  # start-up: not counted
        start, load = time.time(), os.getloadavg()
        if down is None:
            time.sleep(seconds)
        else:
            time.sleep(seconds / 3)
            stop(procs[down])
            time.sleep(seconds / 3)
            procs[down] = launch(argvs[down], env)
            time.sleep(seconds / 3)
        end = time.time()
    finally:
        for proc in procs:
            stop(proc)
        arrivals.stop()
        with Connection(broker) as conn:
            conn.default_channel.queue_delete(queue)
    inside = [(t, i, at) for t, i, at in arrivals.seen if start <= t < end]
    window = int(end - start)
    if name.startswith("celery"):  # no instant on beat's messages: the second it came in
        slots = {int(t - start) for t, _, _ in inside}
    else:  # the instant the message is for
        slots = {at for _, _, at in inside}
    ids = [i for _, i, _ in inside]
    return {
        "scenario": name,
        "broker": broker.split(":")[0],
        "seconds": window,
        "messages": len(inside),
        "seconds_with_message": len(slots),
        # Beat gives each send a new id: a second message in a second is the duplicate.
        # cronjob's id is the instant's: a duplicate is an id seen twice.
        "duplicates": (
            len(inside) - len(slots) if name.startswith("celery") else len(ids) - len(set(ids))
        ),
        "seconds_without": window - len(slots),
        "load": [round(x, 2) for x in (*load, *os.getloadavg())],
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--database-url", default=None, help="cronjob beat's server (default a SQLite file)"
    )
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        if args.database_url is None:
            database = f"sqlite:///{work / 'lease.sqlite'}"
        else:
            database, drop = fresh_database(args.database_url)
            stack.callback(drop)
        plans = [
            ("celery beat x1", [celery_beat(work, 1)], None),
            ("celery beat x2", [celery_beat(work, 2), celery_beat(work, 3)], None),
            ("celery beat, down a third", [celery_beat(work, 4)], 0),
            ("cronjob beat x2", [cronjob_beat(database), cronjob_beat(database)], None),
            (
                "cronjob beat x2, one down a third",
                [cronjob_beat(database), cronjob_beat(database)],
                1,
            ),
        ]
        for name, argvs, down in plans:
            row = scenario(name, args.broker, args.seconds, argvs, down)
            row["database"] = database.split(":")[0].split("+")[0]
            print(json.dumps(row), flush=True)
            rows.append(row)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    header = ["scenario", "s", "messages", "s with one", "duplicates", "s with none"]
    print(" | ".join(header))
    for r in rows:
        cells = ["scenario", "seconds", "messages", "seconds_with_message", "duplicates"]
        print(" | ".join(str(r[c]) for c in [*cells, "seconds_without"]))
    return rows


if __name__ == "__main__":
    main()
