"""A hand-off's recovery under faults (issue 47), with real processes and real brokers,
on each task system: RQ on Redis (on SQLite), Celery on RabbitMQ with publisher confirms
(on PostgreSQL) and Dramatiq on RabbitMQ (on MariaDB). The replicas run
``tests.faults.jobs_outbox`` with the knobs a user gets when they give none
(``OUTBOX_KNOBS=derived``).

- Both replicas SIGKILLed in turn at an instant they hold (+ 30 ms), each restarted at
  once, the second kill once the first is recovered from: every instant of the 2 s
  entry is delivered within 20 s of itself, an id twice only for an instant at a kill.
- The broker cut off for 20 s (a proxy: the broker itself is never stopped): every
  instant delivered within 10 s of the broker's return, none lost nor skipped.
- A row whose payload does not decode and a row whose id is not its name's and
  instant's, due beside good rows: the good ones are sent, the bad ones kept unsent on
  record and never sent, and the replica logs each one's id.
- A removed schedule's unsent row: sent once the broker is back while a replica
  registers its task; resolved obsolete when no live replica does, and ``cronjob
  status`` exits 0 for it.

Delivered means on the task system's queue (read without consuming it, as the targets
of ``tests/faults/_outbox_targets.py`` do); an instant's delivery time is its outbox
row's ``sent_ms`` (the replica's mark after the broker accepted it, at or after the
message's arrival), its instant the row's ``instant_ms``. Run this file alone
(``pytest tests/faults/test_handoff_recovery.py``): it restarts no server.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import cronjob
import cronjob.schedules
import lease
from cronjob.engine._republish import ORPHAN_AFTER
from tests._process import Watched, run_python, watched
from tests._proxy import Proxy
from tests.faults._outbox_targets import RQ, Celery, Dramatiq, Target

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]

#: (target, database) of each run of a scenario.
# One case per task system, the three spanning the three databases: the statements
# under these scenarios are each database's in tests/test_handoff_rounds.py and
# tests/test_outbox_sweep_recovery.py; here the processes, brokers and workers are real.
CASES = [
    pytest.param(("rq", "sqlite"), id="rq-sqlite"),
    pytest.param(("celery", "postgres"), id="celery-postgres", marks=pytest.mark.postgres),
    pytest.param(("dramatiq", "mysql"), id="dramatiq-mysql", marks=pytest.mark.mysql),
]

#: The job of ``tests.faults.jobs_outbox``, and its period in milliseconds.
PERIOD_MS = 2000
#: How long a dead round keeps the job's lease (its ttl), in milliseconds.
DEAD_LEASE_MS = round(lease.DEFAULT_TTL * 1000)
#: The schedule of the removed-schedule scenario (every 2 s too).
EVERY_2S = "*/2 * * * * *"


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def db_url(case: tuple[str, str], request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{case[1]}_url")
    lease.migrate(lease.create_engine(url))
    return url


@pytest.fixture
def target(case: tuple[str, str], request: pytest.FixtureRequest) -> Iterator[Target]:
    """The case's task system, on a queue of the test's own."""
    name = case[0]
    made = (
        RQ(request.getfixturevalue("redis_url"))
        if name == "rq"
        else {"celery": Celery, "dramatiq": Dramatiq}[name]()
    )
    yield made
    made.close()


def now_ms() -> int:
    return round(time.time() * 1000)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, *logs: Watched) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- pid {w.process.pid}:\n{w.output[-6000:]}" for w in logs)
            raise AssertionError(f"timed out waiting for {what}{tails}")
        time.sleep(0.2)


def outbox(url: str) -> dict[str, dict[str, Any]]:
    """The outbox's rows by id."""
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            table = lease.metadata.tables["cronjob_outbox"]
            return {r["id"]: dict(r) for r in conn.execute(sa.select(table)).mappings()}
    finally:
        engine.dispose()


def replica(stack: ExitStack, db_url: str, target: Target, port: int, **env: str) -> Watched:
    """A ``cronjob run`` of ``tests.faults.jobs_outbox``, sending to 127.0.0.1:``port``,
    with the derived knobs; started (its log said so)."""
    argv = [sys.executable, "-m", "cronjob", "run", "--database-url", db_url]
    environ = {**target.env(port), "PYTHONPATH": str(REPO), "OUTBOX_KNOBS": "derived", **env}
    run = stack.enter_context(watched([*argv, "tests.faults.jobs_outbox"], cwd=REPO, env=environ))
    assert run.started.wait(60), run.output
    return run


def instant_id(instant_ms: int, name: str) -> str:
    return cronjob.occurrence_id(name, datetime.fromtimestamp(instant_ms / 1000, UTC))


def grid(first_ms: int, last_ms: int) -> list[int]:
    """The job's instants from ``first_ms`` to ``last_ms``, both included."""
    return list(range(first_ms, last_ms + 1, PERIOD_MS))


def first_delivered(url: str, target: Target) -> int:
    """The instant (epoch ms) of the earliest message of the job on the queue."""
    recorded = outbox(url)
    return min(int(recorded[i]["instant_ms"]) for i in target.ids() if i in recorded)


def undelivered(url: str, target: Target, instants: list[int]) -> list[int]:
    """The instants of ``instants`` not on the queue, or whose row is not marked sent."""
    on_queue, recorded = set(target.ids()), outbox(url)
    return [
        at
        for at in instants
        if (i := instant_id(at, target.job)) not in on_queue
        or not (i in recorded and recorded[i]["sent_ms"])
    ]


def wait_delivered(url: str, target: Target, instants: list[int], until_ms: int) -> None:
    """Wait until each of ``instants`` is delivered, or the clock reads ``until_ms``."""
    while undelivered(url, target, instants) and now_ms() < until_ms:
        time.sleep(0.2)


def late(
    url: str, target: Target, instants: list[int], since: Callable[[int], int], bound_ms: int
) -> dict[str, str]:
    """The instants delivered more than ``bound_ms`` after ``since(instant)`` (their
    row's ``sent_ms`` less it), and the ones not delivered, by the instant's time of
    day: what became of each."""
    missing, recorded, now = set(undelivered(url, target, instants)), outbox(url), now_ms()
    found: dict[str, str] = {}
    for at in instants:
        day = datetime.fromtimestamp(at / 1000, UTC).strftime("%H:%M:%S")
        row = recorded.get(instant_id(at, target.job))
        if row is None:
            found[day] = "not recorded"
        elif at in missing:
            found[day] = (
                f"not delivered (sent_ms {row['sent_ms']}, tries {row['tries']}, "
                f"next try in {int(row['next_try_ms']) - now} ms, error {row['error']!r})"
            )
        elif int(row["sent_ms"]) - since(at) > bound_ms:
            found[day] = f"{int(row['sent_ms']) - since(at)} ms late"
    return found


def holder_pid(url: str, name: str) -> tuple[int, int | None]:
    """(instant in epoch s, the pid of the replica holding its round) of ``name``'s
    lease; ``None`` when no round holds it."""
    engine = lease.create_engine(url)
    try:
        with engine.connect() as conn:
            table = lease.metadata.tables["cronjob_lease"]
            row = conn.execute(sa.select(table).where(table.c.name == name)).mappings().first()
    finally:
        engine.dispose()
    if row is None or row["state"] != "running" or not row["holder"]:
        return -1, None
    return int(row["instant"]), int(str(row["holder"]).rsplit("-", 2)[1])  # host-pid-hex


def sleep_until(at_ms: int) -> None:
    time.sleep(max(0.0, (at_ms - now_ms()) / 1000))


def kill_holding(url: str, run: Watched, job: str, *, instants: int = 15) -> int:
    """SIGKILL ``run`` 30 ms after the first of the next ``instants`` instants whose
    round it holds (read 10 ms after the instant); that instant, in epoch ms."""
    for _ in range(instants):
        instant = (now_ms() // PERIOD_MS + 1) * PERIOD_MS
        sleep_until(instant + 10)
        held = holder_pid(url, job)
        sleep_until(instant + 30)
        if held == (instant // 1000, run.process.pid):
            run.process.send_signal(signal.SIGKILL)
            run.process.wait()
            return instant
    raise AssertionError(f"pid {run.process.pid} held none of {instants} instants\n{run.output}")


def test_both_replicas_killed_in_turn_at_an_instant_deliver_every_instant_within_20s(
    db_url, target, tmp_path
):
    """Each kill leaves the job's lease held by a dead round for the lease's ttl (15 s):
    the instants it kept from the claims are published by the claim that gives it up
    (about 16 s after the kill), or, when a sweep comes between the lease's end and that
    claim, by the dead round's second run, which may run over the next instant: that one
    is claimed as the second run ends (it was lost, skipped as an overrun, before: the
    case that failed under load). The row the dead round held (its send reached the
    broker, its mark did not) is sent again by the sweep as its hold (10 s) ends. The
    second kill comes once the first is recovered from (each instant up to the end of its
    dead lease delivered), so 20 s holds for both. A kill of the round that publishes a
    dead round's instants (not done here) leaves them recorded and held by that round:
    with the default hold, shorter than the lease, the sweep sends them as the hold ends
    (10 s after the second kill, itself 15 s or more after the first), before any claim
    could take them over: 24 to 26 s (tests/test_handoff_rounds.py holds that timing)."""
    # Each round waits 0.2 s between its send and its mark: the kill, 30 ms after the
    # instant, comes while the round holds the lease, its row unsent.
    pause = {"OUTBOX_PAUSE_AFTER_SEND": "0.2"}
    with ExitStack() as stack:
        runs = [replica(stack, db_url, target, target.port, **pause) for _ in range(2)]
        every = [*runs]
        stack.callback(_keep_logs, tmp_path, every)
        wait_for(lambda: target.count() >= 1, 60, "the first send", *runs)
        killed: list[int] = []
        for n in (0, 1):
            killed.append(kill_holding(db_url, runs[n], target.job))
            runs[n] = replica(stack, db_url, target, target.port, **pause)  # at once
            every.append(runs[n])
            # The dead lease's instants, and the first claim after it.
            first = first_delivered(db_url, target)
            instants = grid(first, killed[-1] + DEAD_LEASE_MS + PERIOD_MS)
            wait_delivered(db_url, target, instants, killed[-1] + 24_000)
    assert late(db_url, target, instants, lambda at: at, 20_000) == {}, killed
    counts = Counter(target.ids())
    repeated = {i for i, n in counts.items() if n > 1}
    assert repeated <= {instant_id(at, target.job) for at in killed}, (repeated, killed)


def _keep_logs(tmp_path: Path, runs: list[Watched]) -> None:
    """Write each replica's log to ``tmp_path`` (read them after a failure)."""
    for n, run in enumerate(runs):
        (tmp_path / f"replica-{n}-{run.process.pid}.log").write_text(run.output)


def test_the_broker_cut_off_for_20s_delivers_every_instant_within_10s_of_its_return(
    db_url, target, tmp_path
):
    proxy = Proxy(("127.0.0.1", target.port))
    try:
        with ExitStack() as stack:
            runs = [replica(stack, db_url, target, proxy.port) for _ in range(2)]
            stack.callback(_keep_logs, tmp_path, runs)
            wait_for(lambda: target.count() >= 1, 60, "the first send", *runs)
            proxy.cut()
            time.sleep(20)
            restored = now_ms()
            proxy.restore()
            first = first_delivered(db_url, target)
            instants = grid(first, restored + 4000)
            assert len(instants) >= 12  # 20 s of instants, and the ones around them
            wait_delivered(db_url, target, instants, restored + 15_000)
        # Every instant of the run, 2 s apart, none lost nor skipped.
        assert late(db_url, target, instants, lambda at: max(at, restored), 10_000) == {}
        recorded = outbox(db_url)
        counts = Counter(target.ids())
        # A duplicate only from a send cut in flight (its answer lost): never a clean one.
        tried = {i for i, r in recorded.items() if r["tries"]}
        assert {i for i, n in counts.items() if n > 1} <= tried
    finally:
        proxy.close()


def test_a_poison_row_and_a_mismatched_row_are_kept_unsent_and_the_good_ones_sent(db_url, target):
    """Written straight into the outbox, due a minute ago, the bad ones due first (the
    sweep reads the longest due first): a payload that is not JSON, and a row whose id
    is not ``occurrence_id(name, instant)``."""
    base = (now_ms() // PERIOD_MS) * PERIOD_MS - 60_000
    poison, mismatched = instant_id(base, target.job), str(uuid.uuid4())
    good = [instant_id(base + n * PERIOD_MS, target.job) for n in (2, 3, 4)]

    def row(id: str, instant_ms: int, payload: str) -> dict[str, object]:
        at = instant_ms + 100
        return dict(
            id=id,
            name=target.job,
            instant_ms=instant_ms,
            target=target.name,
            payload=payload,
            created_ms=at,
            next_try_ms=at,
            sent_ms=None,
            tries=0,
            error=None,
            task=None,
            obsolete_ms=None,
        )

    headers = json.dumps({"headers": {}})
    engine = lease.create_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(lease.metadata.tables["cronjob_outbox"]),
                [
                    row(poison, base, "{not json"),
                    row(mismatched, base + PERIOD_MS, headers),
                    *(row(i, base + n * PERIOD_MS, headers) for n, i in enumerate(good, 2)),
                ],
            )
    finally:
        engine.dispose()
    with ExitStack() as stack:
        run = replica(stack, db_url, target, target.port)
        wait_for(lambda: all(outbox(db_url)[i]["sent_ms"] for i in good), 20, "the good rows", run)
        wait_for(
            lambda: poison in run.output and mismatched in run.output,
            20,
            "the bad rows' ids in the log",
            run,
        )
        time.sleep(2)  # a send of the bad ones, had there been one, is on the queue
        on_queue = set(target.ids())
    assert set(good) <= on_queue
    assert not {poison, mismatched} & on_queue
    recorded = outbox(db_url)
    for bad in (poison, mismatched):
        assert recorded[bad]["sent_ms"] is None and recorded[bad]["obsolete_ms"] is None
        assert str(recorded[bad]["error"]).startswith("invalid: "), recorded[bad]


def _unsent_schedule_rows(
    stack: ExitStack, db_url: str, target: Target, proxy: Proxy
) -> tuple[Watched, str, str]:
    """A replica that registers a hand-off task, and a schedule of that task every 2 s
    whose rounds the cut-off broker refused, removed: (the replica, the schedule, the
    task). Its rows are on record, unsent, recorded with the task."""
    task, schedule = f"export-{uuid.uuid4().hex[:8]}", f"tenant-{uuid.uuid4().hex[:8]}"
    run = replica(stack, db_url, target, proxy.port, OUTBOX_TASK=task)
    proxy.cut()
    cronjob.schedules.add(db_url, schedule, task=task, spec=EVERY_2S)
    wait_for(lambda: "not accepted by" in run.output, 30, "a refused round", run)
    assert cronjob.schedules.remove(db_url, schedule)
    time.sleep(3)  # the replica sees the removal (it polls every second): no more rounds
    rows = [r for r in outbox(db_url).values() if r["name"] == schedule]
    assert rows and all(r["sent_ms"] is None and r["task"] == task for r in rows)
    return run, schedule, task


def test_a_removed_schedule_s_unsent_row_is_sent_by_its_task_once_the_broker_is_back(
    db_url, target
):
    proxy = Proxy(("127.0.0.1", target.port))
    try:
        with ExitStack() as stack:
            run, schedule, _ = _unsent_schedule_rows(stack, db_url, target, proxy)
            restored = now_ms()
            proxy.restore()

            def rows() -> list[dict[str, Any]]:
                return [r for r in outbox(db_url).values() if r["name"] == schedule]

            wait_for(lambda: all(r["sent_ms"] for r in rows()), 30, "the rows sent", run)
        on_queue = Counter(target.ids())
        for r in rows():
            assert on_queue[r["id"]] >= 1 and r["obsolete_ms"] is None
            assert int(r["sent_ms"]) <= restored + 10_000, (r, restored)
    finally:
        proxy.close()


def test_a_removed_schedule_s_unsent_row_no_live_replica_can_send_is_resolved_obsolete(
    db_url, target
):
    """The replica that registers the task stops (cleanly: it leaves the live list at
    once); the rows are made due for `ORPHAN_AFTER` (what a minute would do), and a
    replica that registers other jobs, and not the task, resolves them."""
    proxy = Proxy(("127.0.0.1", target.port))
    try:
        with ExitStack() as stack:
            run, schedule, _ = _unsent_schedule_rows(stack, db_url, target, proxy)
            run.process.send_signal(signal.SIGTERM)
            assert run.process.wait(30) == 0, run.output
            proxy.restore()
            engine = lease.create_engine(db_url)
            try:
                aged = now_ms() - round(ORPHAN_AFTER * 1000) - 5000
                table = lease.metadata.tables["cronjob_outbox"]
                with engine.begin() as conn:
                    conn.execute(
                        table.update()
                        .where(table.c.name == schedule)
                        .values(created_ms=aged, next_try_ms=aged)
                    )
            finally:
                engine.dispose()
            status = ["-m", "cronjob", "status", "--database-url", db_url, "--unsent-after", "30"]
            before = run_python(*status, cwd=REPO)
            assert before.returncode == 1 and "outbox:" in before.stderr, before

            def rows() -> list[dict[str, Any]]:
                return [r for r in outbox(db_url).values() if r["name"] == schedule]

            other = replica(stack, db_url, target, proxy.port)
            wait_for(lambda: all(r["obsolete_ms"] for r in rows()), 30, "obsolete", other)
            for r in rows():
                assert r["id"] in other.output  # logged as resolved
            after = run_python(*status, cwd=REPO)
        assert after.returncode == 0, after
        assert not {r["id"] for r in rows()} & set(target.ids())
        assert all(r["sent_ms"] is None for r in rows())
    finally:
        proxy.close()
