"""Where an outbox round's wall time goes: `bench_outbox` under py-spy, summarised.

Run: ``python -m benchmarks.profile_outbox [--target rq] [--per-minute 10000]
[--seconds 42] [--rate 50] [--max-workers N] [--pool-size N] [--experiment E] [--keep DIR]`` (needs
``py-spy``, installed from PyPI in the virtualenv: ``pip install py-spy``; not a
dependency of the project).

Runs one `bench_outbox` cell (one target, one rate, no plain run) under two py-spy
samplers at once, both ``--nonblocking``: one with ``--idle`` (every thread, running or
waiting: where the wall time goes) and one with ``--gil`` (only the thread that holds
the GIL: where the CPU goes). Each sample is put in a phase by the frames on its stack
(record: the fenced transaction that writes the outbox row; send: the publish; mark: the
transaction that marks the row sent; sweep: the outbox's sweep; other threads by kind)
and in a state by its innermost frames (waiting for a pooled connection, for
PostgreSQL or MariaDB, for the broker; idle; or running Python, which with ``--idle``
includes waiting for the GIL). Prints, for each, the mean number of threads in it (the
samples divided by the ticks) and, for ``--gil``, the share of the GIL. Not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.bench_outbox import WINDOW

#: (phase, a fragment that marks it), the first match from the innermost frame outwards.
PHASES = (
    ("record", "record_publication"),
    ("record", "Round.transaction"),
    ("record", "Fencing.transaction"),
    ("send", ".publish ("),
    ("mark", "_mark ("),
    ("claim", "_claim ("),
    ("sweep", "_resend_all"),
    ("sweep", "due_publications"),
    ("round, other", "Handoff.__call__"),
    ("round, other", "_run_round"),
    ("finisher", "finish_many"),
    ("dispatcher", "Dispatcher"),
)
#: (state, fragments any of which, in the innermost frames, marks it).
STATES = (
    ("waiting for a pooled connection", ("_do_get (",)),
    ("waiting for the database", ("Connection.wait (psycopg", "_read_bytes (pymysql")),
    ("waiting for the broker", ("socket", "recv", "select", "poll", "_read (", "read_response")),
    ("idle (no round to run)", ("_work (", "Event.wait", "sleep (", "Condition.wait")),
)


def classify(stack: str) -> tuple[str, str]:
    """(phase, state) of one sample's collapsed stack (root first, leaf last)."""
    frames = stack.split(";")
    phase = "main" if "_run_module_as_main" in stack else "other"
    for name, fragment in PHASES:
        if phase == "other" and fragment in stack:
            phase = name
            break
    inner = ";".join(frames[-6:]).replace("site-packages/", "")
    state = "running Python (or waiting for the GIL)"
    if frames and "CeleryPublisher.publish (" in frames[-1]:  # blocked in its lock (C)
        return phase, "waiting for the publisher's lock"
    for name, fragments in STATES:
        if any(f in inner for f in fragments):
            state = name
            break
    return phase, state


def summarise(path: Path, ticks: int) -> dict[str, dict[str, float]]:
    """Mean threads (samples / ticks) by phase and state."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        counts[classify(stack)] += int(n)
    table: dict[str, dict[str, float]] = {}
    for (phase, state), n in sorted(counts.items()):
        table.setdefault(phase, {})[state] = round(n / max(1, ticks), 2)
    return table


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target", default="rq")
    parser.add_argument("--per-minute", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=42.0)
    parser.add_argument("--rate", type=int, default=50, help="samples a second")
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument("--pool-size", type=int, default=None)
    parser.add_argument("--experiment", default="", help="passed on to bench_outbox")
    parser.add_argument("--keep", help="keep py-spy's raw files in this directory")
    args = parser.parse_args(argv)
    spy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        bench = [
            sys.executable, "-m", "benchmarks.bench_outbox", "--targets", args.target,
            "--per-minute", str(args.per_minute), "--seconds", str(args.seconds), "--no-plain",
        ]  # fmt: skip
        if args.max_workers:
            bench += ["--max-workers", str(args.max_workers)]
        if args.experiment:
            bench += ["--experiment", args.experiment]
        if args.pool_size:
            bench += ["--pool-size", str(args.pool_size)]
        proc = subprocess.Popen(bench, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:  # the window opens: sample it, and it alone
            if line.startswith(WINDOW):
                start, end = map(float, line.split()[2:4])
                break
        else:
            raise SystemExit("bench_outbox ended before its window")
        samplers = []
        for kind in ("idle", "gil"):
            spied = [
                str(spy), "record", "--nonblocking", f"--{kind}", "-r", str(args.rate),
                "-f", "raw", "-o", str(out / f"{kind}.txt"), "--pid", str(proc.pid),
                "-d", str(round(end - time.time())),
            ]  # fmt: skip
            quiet = subprocess.DEVNULL
            samplers.append(subprocess.Popen(spied, stdout=quiet, stderr=quiet))
        stdout, stderr = proc.communicate()
        for sampler in samplers:
            sampler.wait(60)
        rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        idle = (out / "idle.txt").read_text().splitlines()
        # The main thread is sampled at every tick (idle included): it counts the ticks.
        ticks = sum(int(line.rpartition(" ")[2]) for line in idle if classify(line)[0] == "main")
        result = {
            "bench": rows,
            "window": [start, end],
            "warnings": Counter(
                re.sub(r"\d+", "N", line)[:90] for line in stderr.splitlines() if line.strip()
            ).most_common(5),
            "ticks": ticks,
            "wall_threads": summarise(out / "idle.txt", ticks),
            "gil_share": summarise(out / "gil.txt", ticks),
        }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
