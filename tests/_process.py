"""Run a scheduler command in a process of its own: start it, wait until it has started,
SIGTERM it, and tell how it ended; then read the lease rows it left (tests of
``cronjob run`` and the framework commands, and ``scripts/wheel_smoke.py``); or run a
``python -m`` command or a ``python -c`` program to its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa


@dataclass
class Watched:
    """A process :func:`watched` started, and what it has said so far."""

    process: subprocess.Popen[str]
    #: Its output, line by line, as a thread reads it.
    lines: list[str] = field(default_factory=list)
    #: Set once a line says ``started:``, or once its output ends (it ended before it
    #: started).
    started: threading.Event = field(default_factory=threading.Event)

    @property
    def output(self) -> str:
        return "".join(self.lines)


@contextmanager
def watched(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, stdout_too: bool = False
) -> Iterator[Watched]:
    """Start ``argv`` (``env`` over this process's environment) and read its stderr, with
    ``stdout_too`` its stdout as well, on a thread into :attr:`Watched.lines`. When the
    block ends, a process still running is killed and the reader given 5 s to finish."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE if stdout_too else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if stdout_too else subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    stream = process.stdout if stdout_too else process.stderr
    assert stream is not None
    run = Watched(process)

    def read() -> None:
        for line in stream:
            run.lines.append(line)
            if "started:" in line:
                run.started.set()
        run.started.set()  # ended before it started

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield run
    finally:
        if process.poll() is None:
            process.kill()
        reader.join(5)


def run_until_started(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 30
) -> tuple[int, str]:
    """Start ``argv``; once its log says ``started:``, send SIGTERM; return (status, stderr).

    A process that ends before it starts is returned as it ended, without a signal.
    """
    with watched(argv, cwd=cwd, env=env) as run:
        assert run.started.wait(timeout), run.output
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGTERM)
        status = run.process.wait(timeout=timeout)
    return status, run.output


def drained(*runs: Watched, timeout: float = 60) -> None:
    """SIGTERM each of ``runs`` still running, and wait until each has ended with status 0:
    its drain finished the rounds in flight (a hand-off round its send and its mark).
    Killed ones (already ended) are skipped."""
    live = [run for run in runs if run.process.poll() is None]
    for run in live:
        run.process.send_signal(signal.SIGTERM)
    for run in live:
        status = run.process.wait(timeout=timeout)
        assert status == 0, run.output


def run_python(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` (``-m MODULE …``, ``-c CODE …``) with this interpreter, in ``cwd``,
    ``env`` over this process's environment; it must end within ``timeout`` s. Its output
    is captured as text; its exit status is the caller's to check."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def lease_names(sqlite_file: Path) -> list[str]:
    """The names in the lease table of a SQLite file, in the table's order."""
    engine = sa.create_engine(f"sqlite:///{sqlite_file}")
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text("SELECT name FROM cronjob_lease")).scalars())
    finally:
        engine.dispose()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, read from ``/proc`` (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def in_session(
    argv: list[str], *, cwd: Path, env: dict[str, str], output: Path
) -> subprocess.Popen[str]:
    """Start ``argv`` in a session of its own (``os.killpg`` on its pid then reaches its
    children too), its stdout and stderr written to ``output``; ``env`` is its whole
    environment."""
    with open(output, "w") as out:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
