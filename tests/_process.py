"""Run a scheduler command in a process of its own: start it, wait until it has started,
SIGTERM it, and tell how it ended; then read the lease rows it left (tests of
``cronjob run`` and the framework commands)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import sqlalchemy as sa


def run_until_started(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 30
) -> tuple[int, str]:
    """Start ``argv``; once its log says ``started:``, send SIGTERM; return (status, stderr).

    A process that ends before it starts is returned as it ended, without a signal.
    """
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert process.stderr is not None
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if "started:" in line:
                started.set()
        started.set()  # ended before it started

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(timeout), "".join(lines)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(5)
    return status, "".join(lines)


def lease_names(sqlite_file: Path) -> list[str]:
    """The names in the lease table of a SQLite file, in the table's order."""
    engine = sa.create_engine(f"sqlite:///{sqlite_file}")
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text("SELECT name FROM cronjob_lease")).scalars())
    finally:
        engine.dispose()
