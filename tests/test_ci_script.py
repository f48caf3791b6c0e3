"""A newcomer's two commands: run the demo on the base install, pass the tests.

README's first block is exactly those two: the demo installs the project without any
extra and runs ``examples.app``; the test command is ``bash scripts/test``, which sets up
a fresh machine and runs everything CI runs (``.ci/run`` is that script and nothing
else). The demo's jobs run on what the base install brings: no server driver, no
greenlet, no async driver.
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from pathlib import Path

from tests._process import run_python

ROOT = Path(__file__).resolve().parents[1]

#: What the ``[test]`` extra adds over the base install that the demo might touch.
NOT_IN_THE_BASE_INSTALL = (
    "greenlet",
    "psycopg",
    "pymysql",
    "asyncpg",
    "aiosqlite",
    "aiomysql",
    "django",
    "flask",
)


def commands(block: str) -> list[str]:
    """The command lines of a shell block (comments and blank lines left out)."""
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def first_block() -> str:
    """The first shell block of README.md: the two commands of "Try it from a checkout"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Try it from a checkout", 1)[1]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found is not None
    return found.group(1)


def test_the_readme_gives_two_commands_the_demo_and_the_tests():
    demo, tests = commands(first_block())
    assert tests == "bash scripts/test"
    steps = [shlex.split(step) for step in demo.split("&&")]
    assert steps == [
        ["python3", "-m", "venv", ".venv"],
        [".venv/bin/pip", "install", "-e", "."],  # the base install: no extra
        [".venv/bin/cronjob", "run", "examples.app"],
    ]


def test_ci_runs_the_readme_s_test_command():
    ci = commands((ROOT / ".ci" / "run").read_text())
    assert ci == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "exec bash scripts/test"]


def test_the_test_command_sets_up_and_runs_every_check_in_order():
    script = commands((ROOT / "scripts" / "test").read_text())
    assert script[0] == "set -euo pipefail"
    # The servers and tools when missing, then the project, then the checks.
    setup = "\n".join(script)
    for needed in (
        "apt_install postgresql",
        "apt_install pgbouncer",
        "bash scripts/pgbouncer",
        "apt_install mariadb-server",
        "apt_install redis-server",
        "apt_install rabbitmq-server",
        "apt_install faketime",
        "apt_install chromium",
        "CREATE DATABASE test",
        "CREATE DATABASE IF NOT EXISTS test",
    ):
        assert needed in setup, needed
    checks = [
        line
        for line in script
        if (line.startswith(".venv/bin/") and "pip" not in line)
        or (line.startswith("bash ") and line != "bash scripts/pgbouncer")  # that one: setup
    ]
    assert checks == [
        ".venv/bin/python -m compileall -q -j 0 "
        "cronjob lease execctx alembic examples tests scripts",
        ".venv/bin/ruff check .",
        ".venv/bin/ruff format --check .",
        ".venv/bin/python -m pytest -m restart -n 3 --dist loadgroup",
        ".venv/bin/python scripts/wheel_smoke.py",
        ".venv/bin/python -m pytest -m 'faults and not restart' -n 3 --dist loadgroup",
        ".venv/bin/python -m pytest -m 'not faults and not restart' -n 4 --dist loadgroup",
    ]
    # mypy and the docs build run beside the restart tests, and fail the script if they fail.
    background = script.index('( .venv/bin/mypy && bash scripts/docs ) >"$checks_log" 2>&1 &')
    waited = script.index('if ! wait "$checks"; then cat "$checks_log"; exit 1; fi')
    restarts = script.index(".venv/bin/python -m pytest -m restart -n 3 --dist loadgroup")
    assert background < restarts < waited < script.index(".venv/bin/python scripts/wheel_smoke.py")
    assert "unset PYTHONDONTWRITEBYTECODE" in script
    install = ".venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode"
    assert f"{install} -e '.[test,docs]'" in script
    assert "python3 -m venv .venv" in script  # pip in it, for the tests that use it


def test_the_demo_runs_on_the_base_install(tmp_path):
    """examples.app on a fake clock, in an interpreter that cannot import what extras add."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {NOT_IN_THE_BASE_INSTALL!r}:
            sys.modules[name] = None  # as if not installed
        import json
        from datetime import UTC, datetime

        import cronjob
        import examples.app
        from cronjob.testing import FakeClock, record_rounds

        ran = []
        registry = record_rounds(cronjob.default_registry, ran)
        clock = FakeClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))
        with cronjob.Scheduler(sys.argv[1], registry=registry, clock=clock):
            clock.advance(20)
        print(json.dumps(sorted({{(r.job, r.outcome.value) for r in ran}})))
        """
    )
    done = run_python("-c", code, f"sqlite:///{tmp_path / 'demo.sqlite'}", cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        ["long-export", "cut short"],  # still exporting when the scheduler stops
        ["refresh-cache", "succeeded"],
        ["report", "succeeded"],
    ]


def test_the_demo_report_counts_only_the_applications_jobs(tmp_path):
    """`report` counts the demo's two leased jobs, not cronjob's own pruning chore's row."""
    code = textwrap.dedent(
        """
        import logging
        import sys
        from datetime import UTC, datetime

        import cronjob
        import examples.app
        from cronjob.testing import FakeClock

        lines = []

        class Keep(logging.Handler):
            def emit(self, record):
                lines.append(record.getMessage())

        logging.getLogger("examples.app").addHandler(Keep())
        logging.getLogger("examples.app").setLevel(logging.INFO)
        clock = FakeClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))
        # 20 s: the second report runs after the first end was written, so the chore's
        # row (made on a replica's first batch of ends) is there to be left out.
        with cronjob.Scheduler(sys.argv[1], clock=clock):
            clock.advance(20)
        print("\\n".join(line for line in lines if line.startswith("report for")))
        """
    )
    done = run_python("-c", code, f"sqlite:///{tmp_path / 'demo.sqlite'}", cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "report for 2026-03-02T09:00:10+00:00: 2 job(s) on record",  # report, long-export
        "report for 2026-03-02T09:00:20+00:00: 2 job(s) on record",
    ]
