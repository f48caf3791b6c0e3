"""Install the wheel as a user would and run ``cronjob run`` from it, on each database.

The test suite runs from an editable install with the ``test`` extra, which brings every
driver and greenlet; a user's production install brings neither. So this builds the
wheel, installs it into fresh virtualenvs without the test extra -- bare (SQLite), with
``[postgres]``, with ``[mysql]`` -- and in each runs ``cronjob run`` on a module with a
per-second job for a few seconds, then SIGTERM. It fails unless the job ran at least
twice and the process drained and exited 0, and prints each run's output.

Run it with the project's development interpreter (``build`` and ``hatchling`` come
with the ``test`` extra, SQLAlchemy and the drivers make the scratch databases):

    .venv/bin/python scripts/wheel_smoke.py            # all three
    .venv/bin/python scripts/wheel_smoke.py bare       # or some of: bare postgres mysql

The servers are the suite's (``$CRONJOB_TEST_POSTGRES_URL``, ``$CRONJOB_TEST_MYSQL_URL``);
each run gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' process watcher, shared

from tests._process import watched  # noqa: E402

POSTGRES_URL = os.environ.get(
    "CRONJOB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("CRONJOB_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
#: Case name -> the extra installed with the wheel ("" for none).
CASES = {"bare": "", "postgres": "postgres", "mysql": "mysql"}
#: How long each scheduler runs before SIGTERM, in seconds.
RUN_SECONDS = 5.0
#: The fewest rounds of the per-second job that count as running.
MIN_ROUNDS = 2
#: How long a start or a drain may take before the case fails, in seconds.
PATIENCE = 60.0

JOBS = '''\
"""The smoke test's job: one line per round in $SMOKE_OUT."""

import os

import cronjob


def tick(ctx: cronjob.Round) -> None:
    with open(os.environ["SMOKE_OUT"], "a") as out:
        out.write(f"{ctx.instant.isoformat()}\\n")


cronjob.register(tick, "* * * * * *", "smoke-tick")


@cronjob.task(name="smoke-task")
def task(ctx: cronjob.Round) -> None:
    with open(os.environ["SMOKE_OUT"], "a") as out:
        out.write(f"task {ctx.name} {ctx.args['n']}\\n")
'''

#: Run in the venv once the scheduler started: a schedule made of data of its task, added
#: while it runs (the replica follows the change), given the database's URL.
ADD_SCHEDULE = """
import sys
from cronjob import schedules
schedules.add(sys.argv[1], "smoke:1", task="smoke-task", spec="* * * * * *", args={"n": 7})
"""
#: The fewest rounds of that schedule that count as followed (it is seen within 2 s).
MIN_TASK_ROUNDS = 1


class SmokeFailed(Exception):
    """A case did not install, start, run its rounds or drain."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"of {', '.join(CASES)}")
    args = parser.parse_args()
    cases = args.cases or list(CASES)
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cronjob-wheel-smoke-") as scratch:
        work = Path(scratch)
        wheel = build_wheel(work)
        print(f"wheel: {wheel.name}", flush=True)
        # The installs wait mostly on pip's cache and the disk, and each case then runs on a
        # database of its own for seconds of real time: all side by side (each case prints
        # its report in one piece when its run ends).
        with ThreadPoolExecutor(len(cases)) as pool:
            installs = {case: pool.submit(install, case, wheel, work / case) for case in cases}
            runs = {
                case: pool.submit(run_installed, case, installs[case], work / case)
                for case in cases
            }
        failed = []
        for case in cases:
            try:
                runs[case].result()
            except SmokeFailed as exc:
                print(f"[{case}] FAILED: {exc}", flush=True)
                failed.append(case)
    took = time.monotonic() - started
    if failed:
        print(f"wheel smoke: FAILED ({', '.join(failed)}) in {took:.0f} s", flush=True)
        return 1
    print(f"wheel smoke: passed ({', '.join(cases)}) in {took:.0f} s", flush=True)
    return 0


def run_installed(case: str, installed: Future[Path], where: Path) -> None:
    """`run_on` the venv ``installed`` makes, once it is made."""
    run_on(case, installed.result(), where)


def build_wheel(work: Path) -> Path:
    """Build the project's wheel into ``work`` with this interpreter's build and hatchling."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(work), "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"wheel smoke: the wheel did not build:\n{done.stdout}{done.stderr}")
    (wheel,) = work.glob("*.whl")
    return wheel


def install(case: str, wheel: Path, where: Path) -> Path:
    """Install ``wheel`` (with the case's extra) into a new venv; return the venv."""
    return install_wheel(wheel, where, CASES[case])


def install_wheel(wheel: Path, where: Path, extras: str = "", *others: str) -> Path:
    """Install ``wheel`` with ``extras`` ("" for none, "flask,postgres" for two) and the
    requirements ``others`` into a new venv in the new folder ``where``; return the venv.

    The documentation's tests (tests/test_docs_integrations.py) install an integration
    page's extras this way, with the framework the page's example imports."""
    where.mkdir()
    venv = where / "venv"
    # No pip of its own (ensurepip takes seconds): this interpreter's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    done = subprocess.run([*pip, target, *others], capture_output=True, text=True)
    if done.returncode != 0:
        raise SmokeFailed(f"pip install {target} failed:\n{done.stdout}{done.stderr}")
    return venv


def run_on(case: str, venv: Path, where: Path) -> None:
    """Run the installed ``cronjob run`` on the case's database."""
    greenlet = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import greenlet"], capture_output=True
    )
    extra = CASES[case]
    installed = "pip install " + (f"'cronjob-lease[{extra}]'" if extra else "cronjob-lease")
    print(
        f"[{case}] {installed} (the wheel, in a new venv); greenlet "
        f"{'installed' if greenlet.returncode == 0 else 'not installed'}",
        flush=True,
    )
    (where / "smoke_jobs.py").write_text(JOBS)
    with scratch_database(case, where) as url:
        command = [str(venv / "bin" / "cronjob"), "run", "--database-url", url, "smoke_jobs"]

        def add_schedule() -> None:
            python = str(venv / "bin" / "python")
            done = subprocess.run([python, "-c", ADD_SCHEDULE, url], capture_output=True, text=True)
            if done.returncode != 0:
                raise SmokeFailed(f"schedules.add failed:\n{done.stdout}{done.stderr}")

        run(case, command, where, after_start=add_schedule)


@contextmanager
def scratch_database(case: str, where: Path) -> Iterator[str]:
    """A database of this run's own on the case's server (a SQLite file for ``bare``)."""
    if case == "bare":
        yield f"sqlite:///{where / 'smoke.sqlite'}"
        return
    server = sa.make_url(POSTGRES_URL if case == "postgres" else MYSQL_URL)
    name = f"cronjob_smoke_{os.getpid()}"
    engine = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            force = " WITH (FORCE)" if case == "postgres" else ""
            with engine.connect() as conn:
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}{force}"))
    except sa.exc.OperationalError as exc:
        raise SmokeFailed(f"the {case} server: {exc}") from exc
    finally:
        engine.dispose()


def run(
    case: str,
    argv: list[str],
    where: Path,
    env: dict[str, str] | None = None,
    after_start: Callable[[], None] | None = None,
) -> None:
    """Run the scheduler (``argv``: a ``cronjob run`` that imports ``smoke_jobs``, in
    ``where``) for `RUN_SECONDS` after it starts (``after_start`` called then), SIGTERM
    it, check it: the per-second job's rounds, and with ``after_start`` the rounds of the
    schedule it adds."""
    out = where / "rounds.txt"
    env = {**(env or {}), "SMOKE_OUT": str(out)}
    with watched(argv, cwd=where, env=env, stdout_too=True) as smoke:
        try:
            if not smoke.started.wait(PATIENCE) or smoke.process.poll() is not None:
                raise SmokeFailed(f"cronjob run did not start:\n{smoke.output}")
            if after_start is not None:
                after_start()
            time.sleep(RUN_SECONDS)
            smoke.process.send_signal(signal.SIGTERM)
            status = smoke.process.wait(PATIENCE)
        except subprocess.TimeoutExpired as exc:
            raise SmokeFailed(f"cronjob run did not drain:\n{smoke.output}") from exc
    lines = smoke.lines
    written = out.read_text().splitlines() if out.exists() else []
    tasks = [line for line in written if line.startswith("task ")]
    rounds = len(written) - len(tasks)
    output = "".join(f"[{case}]   {line}" for line in lines)
    print(
        f"[{case}] cronjob run: {rounds} round(s) and {len(tasks)} of the schedule added "
        f"in {RUN_SECONDS:.0f} s, exit status "
        f"{status}; its output:\n{output}",
        end="",
        flush=True,
    )
    if status != 0:
        raise SmokeFailed(f"exit status {status}, not 0")
    if rounds < MIN_ROUNDS:
        raise SmokeFailed(f"{rounds} round(s), fewer than {MIN_ROUNDS}")
    if after_start is not None and (
        len(tasks) < MIN_TASK_ROUNDS or any(line != "task smoke:1 7" for line in tasks)
    ):
        raise SmokeFailed(f"the schedule added while it ran: {tasks}, not followed")


if __name__ == "__main__":
    sys.exit(main())
