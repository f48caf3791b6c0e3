"""Peer schedulers run on the same work as ``cronjob``, each in a virtualenv of its own.

Each peer is a module here with ``NAME``, ``REQUIREMENTS`` (pinned, installed from PyPI
into ``benchmarks/.venvs/NAME``) and ``WORKER`` (the script a replica process runs with
that virtualenv's interpreter). :func:`ensure_venv` creates the virtualenv on first use.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

VENVS = Path(__file__).resolve().parent.parent / ".venvs"


def ensure_venv(name: str, requirements: list[str]) -> Path:
    """Return the interpreter of ``benchmarks/.venvs/NAME``, creating it when missing.

    A marker file records the requirements installed; a change reinstalls them.
    """
    home = VENVS / name
    python = home / "bin" / "python"
    marker = home / "requirements.txt"
    wanted = "\n".join(requirements) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    if not python.exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(home)
    print(f"installing {' '.join(requirements)} into {home}", file=sys.stderr, flush=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *requirements,
        ],
        check=True,
    )
    marker.write_text(wanted)
    return python
