"""A replica of the previous release beside one of this release, on a database migrated
to this release's head (0008 brought schedules made of data): the rolling deploy the issue
asks for.

The previous release is the last landed one, commit `PREVIOUS` (alembic head 0007: it
knows nothing of schedules). It is built once per session from this checkout's own
history (``git archive``) and installed as a wheel into a venv of its own, whose only
other path is this interpreter's site-packages, for the dependencies: no network. Then,
on each database, one real ``cronjob run`` of each release shares a job registered in
code; this release's also registers a task, and schedules of it are added while both run.
The test shows:

- every instant of every schedule runs once, always on this release's replica, and the
  previous release's replica never claims, pauses, rewrites or deletes a schedule's lease
  row, nor does it crash or log a traceback;
- the previous release keeps running its jobs, the shared one once per instant across
  both releases;
- this release's ``cronjob status`` shows the schedules with their task and exits 0; the
  previous release's operator commands refuse the database (exit 2, one line: revision
  0008 is unknown to them), so they neither misreport a schedule nor ``forget`` one.

Real time on purpose, as in ``test_schedules_processes.py``: the replicas are other
processes on the wall clock. The assertions are about which rounds ran, where, and what
the rows hold, never about how long something took.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

import lease
from cronjob import schedules
from tests._process import Watched, watched

REPO = Path(__file__).resolve().parent.parent
#: The last landed release: alembic head 0007, before schedules made of data.
PREVIOUS = "554e712"
#: The revision the previous release's operator commands read.
PREVIOUS_REVISION = "0007"
EVERY_SECOND = "* * * * * *"
#: The bound the contract gives for a committed change to reach every replica.
PROPAGATION = 2.0
#: How long both releases run the schedules before they are looked at.
WINDOW = 8.0

#: Registered in code by both releases: each round appends a line to ``$ROUND_LOG``.
SHARED_JOB = """
import json, os, time
import cronjob


def log(ctx, kind):
    line = {"kind": kind, "id": ctx.name, "instant": ctx.instant.timestamp(),
            "attempt": ctx.attempt, "release": os.environ["RELEASE"], "t": time.time()}
    fd = os.open(os.environ["ROUND_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\\n").encode())
    finally:
        os.close(fd)


@cronjob.job("* * * * * *", name="shared-tick")
def shared_tick(ctx):
    log(ctx, "job")
"""
#: Registered by the previous release alone: it keeps running a job no one else runs.
OLD_ONLY_JOB = """
import cronjob
from shared_job import log


@cronjob.job("* * * * * *", name="old-only-tick")
def old_only_tick(ctx):
    log(ctx, "job")
"""
#: Registered by this release alone: the task whose schedules are rows.
REPORT_TASK = """
import cronjob
from shared_job import log


@cronjob.task(name="report")
def report(ctx):
    log(ctx, "schedule")
"""


def _fail_without(what: str, hint: str) -> None:
    pytest.fail(f"the previous-release test needs {what}: {hint}")


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a venv holding the previous release (commit `PREVIOUS`; see
    `build_release`), built once per session."""
    return build_release(PREVIOUS, PREVIOUS_REVISION, tmp_path_factory)


def build_release(commit: str, revision: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a venv holding the release at ``commit`` (whose operator
    commands read ``revision``), installed from its wheel, built from this checkout's
    history.

    The venv has no pip and no packages but that wheel; a ``.pth`` file gives it this
    interpreter's site-packages for the dependencies (SQLAlchemy, alembic, the drivers).
    A ``.pth`` line adds a directory without processing the ``.pth`` files inside it, so
    this release, installed editable or not, stays out of the venv's imports, and the
    venv's own site-packages comes first on ``sys.path``. A checkout without the commit (a
    shallow clone) fails the test: the deploy it proves cannot be left untested.
    """
    try:
        found = subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        _fail_without("git", "install it; the previous release is built from the history")
    if found.returncode != 0:
        _fail_without(
            f"commit {commit} (the release to run beside this one) in {REPO}",
            "a shallow clone lacks it; clone with full history or `git fetch --unshallow`",
        )
    if importlib.util.find_spec("hatchling") is None:
        _fail_without("hatchling (the test extra)", "pip install -e '.[test]'")
    began = time.monotonic()
    root = tmp_path_factory.mktemp(f"previous-release-{commit}")
    source = root / "src"
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
    )
    tar = root / "src.tar"
    tar.write_bytes(archive.stdout)
    with tarfile.open(tar) as opened:
        opened.extractall(source, filter="data")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site) / "_dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    installed = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"),
            *("--no-build-isolation", "--target", site, str(source)),
        ],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # The venv imports the previous release, not this checkout's.
    probe = subprocess.run(
        [str(python), "-c", "import cronjob, cronjob.admin._base as b; print(b.REVISION)"],
        cwd=root,
        capture_output=True,
        text=True,
        env=_without_pythonpath(),
    )
    assert probe.stdout.strip() == revision, probe.stdout + probe.stderr
    sys.stderr.write(f"previous release {commit} built in {time.monotonic() - began:.1f} s\n")
    return python


def _without_pythonpath() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _rounds(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _holder(run: Watched) -> str:
    found = re.search(r"scheduler (\S+) started:", run.output)
    assert found, run.output
    return found.group(1)


#: How MariaDB's deadlock (error 1213) reads in a failed claim's log line.
_DEADLOCK = "(1213, 'Deadlock found when trying to get lock"


def _deadlocked(output: str, instant: int) -> bool:
    """Whether ``output`` logs a claim of ``instant`` (epoch seconds) that failed in a
    deadlock."""
    when = datetime.fromtimestamp(instant, UTC).isoformat()
    return any(f"claiming {when} " in line and _DEADLOCK in line for line in output.splitlines())


def _wait(seconds: float) -> None:
    time.sleep(seconds)  # real time: the replicas are other processes on the wall clock


def _command(
    python: str | Path, url: str, *args: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``cronjob ARGS --database-url URL`` with ``python``, in ``cwd`` (never this
    checkout: ``python -m`` puts the working directory first on the path)."""
    return subprocess.run(
        [str(python), "-m", "cronjob", *args, "--database-url", url],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=_without_pythonpath(),
    )


@pytest.fixture
def both_releases(
    db_url: str, tmp_path: Path, previous_release: Path
) -> Iterator[tuple[Watched, Watched, Path]]:
    """The database at this release's head, and one ``cronjob run`` of each release on it:
    (previous, this, the log of rounds). Both are stopped with SIGTERM after the test."""
    modules = {"shared_job": SHARED_JOB, "old_only_job": OLD_ONLY_JOB, "report_task": REPORT_TASK}
    with running_beside(
        db_url,
        tmp_path,
        previous_release,
        modules=modules,
        old=["shared_job", "old_only_job"],
        new=["shared_job", "report_task"],
    ) as both:
        yield both


@contextmanager
def running_beside(
    db_url: str,
    tmp_path: Path,
    previous: Path,
    *,
    modules: dict[str, str],
    old: list[str],
    new: list[str],
) -> Iterator[tuple[Watched, Watched, Path]]:
    """The database at this release's head, ``modules`` (name -> source) written, and one
    ``cronjob run`` of each release on it, the interpreter ``previous`` importing ``old``,
    this one ``new``: (previous, this, the log of rounds). Both are stopped with SIGTERM
    at the end."""
    engine = lease.create_engine(db_url)
    lease.migrate(engine)
    engine.dispose()
    folder = tmp_path / "modules"
    folder.mkdir()
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    log = tmp_path / "rounds.jsonl"
    # Only the modules' directory on the path: never this checkout, whose `cronjob`
    # would shadow the previous release's.
    env = {"ROUND_LOG": str(log), "PYTHONPATH": str(folder)}
    run = ["-m", "cronjob", "run", "--database-url", db_url]
    with ExitStack() as stack:
        previous_run = stack.enter_context(
            watched([str(previous), *run, *old], cwd=folder, env={**env, "RELEASE": "previous"})
        )
        this_run = stack.enter_context(
            watched([sys.executable, *run, *new], cwd=folder, env={**env, "RELEASE": "this"})
        )
        for process in (previous_run, this_run):
            assert process.started.wait(60), process.output
            assert process.process.poll() is None, process.output
        yield previous_run, this_run, log
        for process in (previous_run, this_run):
            if process.process.poll() is None:
                process.process.send_signal(signal.SIGTERM)
        for process in (previous_run, this_run):
            process.process.wait(30)


def test_the_previous_release_runs_beside_schedules_and_never_touches_them(
    db_url, both_releases, previous_release, tmp_path
):
    old, new, log = both_releases
    old_holder, new_holder = _holder(old), _holder(new)
    # The previous release knows it runs beside a newer schema, and says so.
    assert "newer than this release's 0007" in old.output, old.output
    engine = lease.create_engine(db_url)
    store = lease.LeaseStore(engine)
    ids = ["every", "once"]
    try:
        # A release may write its jobs' rows after its start line: wait for them. (A
        # schedule added before the previous release wrote the row of a job of the same
        # name would share the row with that job: see docs/operations/deploys.md.)
        deadline = time.monotonic() + 30
        while len(store.read(["old-only-tick", "shared-tick"])) < 2:
            assert time.monotonic() < deadline, old.output
            _wait(0.1)
        schedules.add(engine, "every", task="report", spec=EVERY_SECOND, args={"n": 1})
        added = time.time()
        at = datetime.fromtimestamp(int(added) + 4, UTC)
        schedules.add(engine, "once", task="report", at=at)
        # A schedule may not take the name of the previous release's job: that lease row
        # is the job's, and the previous release would run it as the job.
        with pytest.raises(ValueError, match="the id is the name of a job on record"):
            schedules.add(engine, "old-only-tick", task="report", spec=EVERY_SECOND)
        seen: dict[str, list[lease.LeaseRow]] = {id_: [] for id_ in ids}
        deadline = time.monotonic() + WINDOW
        while time.monotonic() < deadline:
            rows = store.read(ids)
            for id_ in ids:
                assert id_ in rows, f"the lease row of schedule {id_!r} is gone"
                seen[id_].append(rows[id_])
            _wait(0.25)
        stopped = time.time()

        this_status = _command(sys.executable, db_url, "status", "--json", cwd=tmp_path)
        old_status = _command(previous_release, db_url, "status", cwd=tmp_path)
        old_forget = _command(previous_release, db_url, "forget", "every", cwd=tmp_path)
        after = store.read(ids)
        on_record = [record.id for record in schedules.list(engine)]
    finally:
        engine.dispose()

    # Every schedule instant ran once, on this release's replica only.
    rounds = _rounds(log)
    pairs = collections.Counter((r["id"], r["instant"]) for r in rounds)
    assert [pair for pair, n in pairs.items() if n > 1] == [], "an instant ran twice"
    ran = [r for r in rounds if r["kind"] == "schedule"]
    assert {r["release"] for r in ran} == {"this"}, ran
    once = [r["instant"] for r in ran if r["id"] == "once"]
    assert once == [at.timestamp()]
    every = sorted(float(str(r["instant"])) for r in ran if r["id"] == "every")
    assert every and every[0] <= added + PROPAGATION + 1, (added, every)
    assert every == [every[0] + i for i in range(len(every))], "an instant was missed"
    assert every[-1] >= stopped - 2, (stopped, every)

    # The previous release kept running its jobs: its own every second, the shared one
    # once per instant between the two releases, some of them on its replica.
    for name in ("old-only-tick", "shared-tick"):
        instants = sorted(float(str(r["instant"])) for r in rounds if r["id"] == name)
        window = [t for t in instants if added <= t <= stopped - 1]
        assert window, (name, instants, old.output)
        missed = set(range(int(window[0]), int(window[-1]))) - {int(t) for t in window}
        # On MariaDB the previous release's own claim can die in a deadlock (its due write
        # reads the whole table; see lease._mysql_due): it then logs the failed claim and
        # catches up only the latest instant of its jobs. Only an instant so logged may be
        # missing, and only of the job no replica of this release registers.
        excused = (
            {t for t in missed if _deadlocked(old.output, t)} if name == "old-only-tick" else set()
        )
        assert missed == excused, (name, sorted(missed), old.output)
        # Each instant of the window ran or is excused (the first and last may fall
        # outside it by a second each).
        assert len(window) + len(excused) >= WINDOW - 2, (name, instants, old.output)
    assert {r["release"] for r in rounds if r["id"] == "old-only-tick"} == {"previous"}
    shared = collections.Counter(r["release"] for r in rounds if r["id"] == "shared-tick")
    assert shared["previous"] > 0 and shared["this"] > 0, shared

    # The previous release never held, paused or rewrote a schedule's lease row.
    for id_ in ids:
        rows = [*seen[id_], after[id_]]
        assert {row.holder for row in rows} <= {None, new_holder}, (id_, old_holder, rows)
        assert all(row.paused is None for row in rows), rows
        assert {row.spec for row in rows} == {
            EVERY_SECOND if id_ == "every" else f"@at {at:%Y-%m-%dT%H:%M:%SZ}"
        }
    assert sorted(on_record) == ids

    # This release's status shows the schedules with their task, and all is well.
    assert this_status.returncode == 0, this_status.stdout + this_status.stderr
    jobs = {job["name"]: job for job in json.loads(this_status.stdout)["jobs"]}
    assert {jobs[id_]["task"] for id_ in ids} == {"report"}, jobs
    # The previous release's commands refuse a database at a revision they do not know:
    # one line, exit 2, nothing read or deleted (so no schedule shown as retired, and no
    # `forget` of a schedule's row).
    refusal = (
        f"cronjob: error: the cronjob tables are at revision {lease.head_revision()}, which "
        "this release (revision 0007) does not know: use the release that migrated them\n"
    )
    for done in (old_status, old_forget):
        assert (done.returncode, done.stdout, done.stderr) == (2, "", refusal)
    assert "every" in after

    # Neither replica crashed; each drains and exits 0 on SIGTERM, with no traceback. This
    # release logs no error; the previous release none but its deadlocked claims.
    assert stopped_cleanly(old, new) == []


def stopped_cleanly(old: Watched, new: Watched, *allowed: str) -> list[str]:
    """Stop both releases' replicas with SIGTERM, asserting that neither had crashed, that
    each exits 0 with no traceback, and that this release logged no error. Returns the
    previous release's error lines but those of claims that died in a deadlock and those
    holding one of ``allowed``."""
    for process in (old, new):
        assert process.process.poll() is None, process.output
        process.process.send_signal(signal.SIGTERM)
    for process in (old, new):
        assert process.process.wait(30) == 0, process.output
        assert "Traceback" not in process.output, process.output
    assert " ERROR " not in new.output, new.output
    errors = [line for line in old.output.splitlines() if " ERROR " in line]
    return [line for line in errors if not any(s in line for s in (_DEADLOCK, *allowed))]
