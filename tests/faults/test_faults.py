"""The short fault profile: real ``cronjob run`` processes against a real PostgreSQL.

Each scenario is its own test, in a schema of its own. To keep the profile within a few
minutes, the first test that needs PostgreSQL starts every selected scenario at once, each
in a thread of its own, and each test then waits for its scenario's outcome. The one
scenario that restarts the PostgreSQL server runs alone, after all the others (it cuts
every session on the server, other people's included, so it is kept short and last).

Each scenario returns the figures it measured; they are written to ``result.json`` in
the scenario's folder (see ``harness.RUNS_DIR``) and printed with ``pytest -s``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from .harness import (
    DRAIN_LIMIT,
    EXIT_AFTER_LOST,
    EXIT_LEASE_LOST,
    LEASE_TTL,
    LOST_AFTER,
    POSTGRES_URL,
    REPO,
    SWEEP_EVERY,
    JobSpec,
    Scenario,
    check_invariants,
    expected_instants,
    libfaketime,
    postgres_cluster,
    postgres_reachable,
    restart_postgres,
    wall_now,
)

pytestmark = pytest.mark.faults

#: A password that must never appear in any output.
SECRET = "S3cretPassw0rd-faults"
SECOND = timedelta(seconds=1)

Figures = dict[str, Any]


def _round(value: float) -> float:
    return round(value, 2)


def _finish(scenario: Scenario, figures: Figures) -> Figures:
    figures["dir"] = str(scenario.dir)
    (scenario.dir / "result.json").write_text(json.dumps(figures, indent=2, default=str))
    print(f"\n[{scenario.name}] {json.dumps(figures, default=str)}")
    return figures


def _pid_replica(scenario: Scenario, pid: int) -> str:
    for replica in scenario.replicas.values():
        if any(p.pid == pid for p in replica.processes):
            return replica.name
    raise KeyError(pid)


def _assert_no_password(text: str) -> None:
    assert SECRET not in text, "the database password was printed"


# -- scenarios run together -----------------------------------------------------------------


def scenario_steady() -> Figures:
    """No fault: every instant of every job runs exactly once across three replicas."""
    jobs = [
        JobSpec("tick", "*/1 * * * * *", "work", 0.2),
        JobSpec("every2", "*/2 * * * * *", "async_work", 0.5),
        JobSpec("work5", "*/5 * * * * *", "work", 2.0),
        JobSpec("local", "*/2 * * * * *", "work", 0.1, per_instance=True),
    ]
    with Scenario("steady", jobs) as s:
        for name in "abc":
            s.replica(name)
        s.start()
        first = wall_now() + 2 * SECOND
        time.sleep(25)
        last = wall_now() - 3 * SECOND
        statuses = s.stop()
        assert statuses == {"a": 0, "b": 0, "c": 0}
        report = s.check(fault_free=True, window=(first, last))
        report.assert_clean()
        assert not report.reruns and not report.given_up
        # The per-instance job ran on every replica for every instant of the window.
        local = [r for r in s.rounds() if r.job == "local" and first <= r.instant <= last]
        expected = set(expected_instants(jobs[3].spec, first, last))
        for replica in s.replicas.values():
            ran = sorted(r.instant for r in local if r.pid == replica.pid)
            assert len(ran) == len(set(ran)) and set(ran) == expected, (replica.name, ran)
        leased = [r for r in s.rounds() if r.job != "local"]
        return _finish(
            s,
            {
                "rounds": report.rounds,
                "leased_rounds": len(leased),
                "by_replica": {
                    name: sum(1 for r in leased if r.pid == rep.pid)
                    for name, rep in s.replicas.items()
                },
                "violations": len(report.violations),
            },
        )


def scenario_clock_ahead() -> Figures:
    """One replica's wall clock runs 2 s ahead (libfaketime), less than the 5 s
    granularity of the schedules: it claims instants early, nobody runs one twice."""
    assert libfaketime() is not None, "libfaketime is missing: apt-get install faketime"
    jobs = [
        JobSpec("five", "*/5 * * * * *", "work", 1.0),
        JobSpec("five-async", "2/5 * * * * *", "async_work", 0.5),
    ]
    with Scenario("clock_ahead", jobs) as s:
        s.replica("a")
        s.replica("fast", faketime="+2s")
        s.replica("c")
        s.start()
        # A replica joining ahead of the others may take the next instant before the
        # others ran the ones in between: the window starts once all run.
        first = wall_now() + 3 * SECOND
        time.sleep(30)
        last = wall_now() - 3 * SECOND
        assert s.stop() == {"a": 0, "fast": 0, "c": 0}
        report = s.check(fault_free=True, window=(first, last))
        report.assert_clean()
        # Proof that the clock ran ahead: rounds started before their instant, real time.
        offset = time.time() - time.monotonic()
        early = [
            r.instant.timestamp() - (r.start + offset)
            for r in s.rounds()
            if r.pid == s.replicas["fast"].pid
        ]
        assert early and max(early) > 1.0, f"the fast replica did not run ahead: {early}"
        return _finish(
            s,
            {
                "rounds": report.rounds,
                "on_fast_replica": len(early),
                "fast_replica_early_by_s": _round(max(early)),
                "violations": 0,
            },
        )


def scenario_kill9() -> Figures:
    """``kill -9`` of the replica running a round: attempt 2 runs on another replica once
    the lease expired and a sweep found it, within ~30 s."""
    jobs = [
        JobSpec("slow", "@every 40s", "work", 8.0),
        JobSpec("tick", "*/1 * * * * *", "work", 0.2),
    ]
    with Scenario("kill9", jobs) as s:
        for name in "abc":
            s.replica(name)
        s.start()
        first = s.wait_start("slow", 60, attempt=1)
        victim = s.replicas[_pid_replica(s, first["pid"])]
        time.sleep(1.0)
        killed = victim.kill9()
        killed.wait(5)
        assert killed.rc == -9
        killed_at = killed.exited
        assert killed_at is not None
        second = s.wait_start("slow", LEASE_TTL + SWEEP_EVERY + 10, attempt=2)
        assert second["instant"] == first["instant"]
        assert second["pid"] != first["pid"]
        delay = second["mono"] - killed_at
        since_claim = second["mono"] - first["mono"]
        # Not before the lease expired (15 s after the claim), within ~30 s of the claim.
        assert since_claim >= LEASE_TTL - 0.5, f"re-run {since_claim:.1f}s after the claim"
        assert since_claim <= LEASE_TTL + SWEEP_EVERY + 3, f"re-run {since_claim:.1f}s late"
        s.wait_event(
            lambda e: e["ev"] == "end" and e["job"] == "slow" and e["attempt"] == 2, 15, "end"
        )
        after = time.monotonic()
        statuses = s.stop()
        assert all(rc == 0 for rc in statuses.values()), statuses
        report = s.check()
        report.assert_clean()
        assert any(b.attempt == 2 and b.job == "slow" for _a, b, _d in report.reruns)
        tick_after = [r for r in s.rounds() if r.job == "tick" and r.start > killed_at]
        assert tick_after, "the other jobs stopped"
        assert max(r.start for r in tick_after) > after - 5
        return _finish(
            s,
            {
                "rerun_after_kill_s": _round(delay),
                "rerun_after_claim_s": _round(since_claim),
                "rounds": report.rounds,
                "violations": 0,
            },
        )


def scenario_sigterm() -> Figures:
    """SIGTERM in the middle of a round: the drain ends in under 5 s, the lease is given
    back, and the round runs a second time elsewhere within ~15 s."""
    jobs = [
        JobSpec("slow", "@every 40s", "work", 8.0),
        JobSpec("tick", "*/1 * * * * *", "work", 0.2),
    ]
    with Scenario("sigterm", jobs) as s:
        for name in "abc":
            s.replica(name)
        s.start()
        first = s.wait_start("slow", 60, attempt=1)
        victim = s.replicas[_pid_replica(s, first["pid"])]
        time.sleep(1.0)
        process = victim.term()
        signalled = time.monotonic()
        rc = process.wait(DRAIN_LIMIT + 5)
        assert process.exited is not None
        drain = process.exited - signalled
        assert rc == 0
        assert drain < DRAIN_LIMIT, f"drain took {drain:.1f}s"
        row = s.lease_row("slow")
        assert row is not None
        given_back = row["state"] == "cut" and row["expires_ms"] is None
        assert given_back or row["attempt"] == 2, f"lease not given back: {row}"
        ended = [
            e
            for e in s.events()
            if e["ev"] == "end" and e["job"] == "slow" and e["pid"] == first["pid"]
        ]
        assert ended and ended[0]["outcome"] == "cut" and ended[0]["cause"] == "Shutdown"
        second = s.wait_start("slow", SWEEP_EVERY + 10, attempt=2)
        assert second["instant"] == first["instant"] and second["pid"] != first["pid"]
        delay = second["mono"] - ended[0]["mono"]  # from the round's end, as given back
        assert delay <= SWEEP_EVERY + 2, f"re-run {delay:.1f}s after the drain"
        s.wait_event(
            lambda e: e["ev"] == "end" and e["job"] == "slow" and e["attempt"] == 2, 15, "end"
        )
        assert all(rc == 0 for rc in s.stop().values())
        report = s.check()
        report.assert_clean()
        return _finish(
            s,
            {
                "drain_s": _round(drain),
                "rerun_after_give_back_s": _round(delay),
                "rounds": report.rounds,
                "violations": 0,
            },
        )


def scenario_proxy_cut() -> Figures:
    """One replica's database connection cut (a blackhole in its proxy) while it runs two
    rounds: one job stops on the cancellation, one ignores it. Both are cancelled as
    lease lost within 10 s; 5 s later the process exits with status 70, before any other
    replica claims either job; the other replicas keep going."""
    jobs = [
        JobSpec("stubborn", "*/5 * * * * *", "stubborn", 60.0),
        JobSpec("polite", "*/5 * * * * *", "work", 60.0),
        JobSpec("tick", "*/1 * * * * *", "work", 0.2),
    ]
    with Scenario("proxy_cut", jobs) as s:
        cut_off = s.replica("a", proxy=True)
        s.replica("b")
        s.replica("c")
        s.start("a")
        stubborn = s.wait_start("stubborn", 15, pid=cut_off.pid)
        s.wait_start("polite", 5, pid=cut_off.pid)
        s.start("b", "c")
        time.sleep(1.0)
        cut_off.cut("blackhole")
        cut_at = time.monotonic()
        process = cut_off.current
        rc = process.wait(LOST_AFTER + EXIT_AFTER_LOST + 10)
        assert process.exited is not None
        exited = process.exited - cut_at
        assert rc == EXIT_LEASE_LOST, f"exit status {rc}"
        output = process.output()
        assert "CRITICAL" in output and "after its lease was lost" in output
        events = s.events()
        polite_end = next(
            e
            for e in events
            if e["ev"] == "end" and e["job"] == "polite" and e["pid"] == process.pid
        )
        assert polite_end["outcome"] == "cut" and polite_end["cause"] == "LeaseLost"
        noticed = next(
            e
            for e in events
            if e["ev"] == "cancelled" and e["job"] == "stubborn" and e["pid"] == process.pid
        )
        assert noticed["cause"] == "LeaseLost"
        lost = noticed["mono"] - cut_at
        assert lost <= LOST_AFTER + 0.5, f"lease lost {lost:.1f}s after the cut"
        exit_after_lost = process.exited - noticed["mono"]
        # 5 s after the loss, and at least half a second before the lease can expire.
        assert EXIT_AFTER_LOST - 0.8 <= exit_after_lost <= EXIT_AFTER_LOST + 1.0
        # Another replica takes the job over, and only after the process is gone.
        taken = s.wait_start(
            "stubborn", LEASE_TTL + 10, after=stubborn["mono"], exclude_pid=process.pid
        )
        margin = taken["mono"] - process.exited
        assert margin > 0, f"another replica claimed the job {-margin:.3f}s before the exit"
        # The other replicas go on: a round of tick whose end the cut-off replica could
        # not record keeps the tick lease until it expires (15 s), not longer.
        tick = s.wait_start("tick", LEASE_TTL + 5, after=cut_at, exclude_pid=process.pid)
        tick_gap = tick["mono"] - cut_at
        # b and c now run stubborn rounds that ignore their cancellation: kill them.
        for name in "bc":
            s.replicas[name].kill9()
        report = s.check()
        report.assert_clean()
        return _finish(
            s,
            {
                "lease_lost_after_cut_s": _round(lost),
                "exit_after_lost_s": _round(exit_after_lost),
                "exit_after_cut_s": _round(exited),
                "next_claim_after_exit_s": _round(margin),
                "tick_resumed_after_cut_s": _round(tick_gap),
                "taken_over_as": f"attempt {taken['attempt']} of {taken['instant']}",
                "rounds": report.rounds,
                "violations": 0,
            },
        )


def scenario_catch_up() -> Figures:
    """All replicas down across three instants: on restart exactly one catch-up round,
    for the latest missed instant."""
    jobs = [JobSpec("five", "*/5 * * * * *", "work", 0.5)]
    with Scenario("catch_up", jobs) as s:
        s.replica("a")
        s.replica("b")
        s.start()
        first = s.wait_start("five", 15)
        s.wait_event(
            lambda e: e["ev"] == "end" and e["job"] == "five" and e["instant"] == first["instant"],
            5,
            "the first round's end",
        )
        assert all(rc == 0 for rc in s.stop().values())
        last = datetime.fromisoformat(first["instant"])
        restart_at = last + timedelta(seconds=16.3)  # instants +5, +10, +15 missed
        time.sleep(max(0.0, (restart_at - wall_now()).total_seconds()))
        s.start()
        # The catch-up: the first round after the restart, for the latest instant that
        # passed before the replicas were up (last + 15 s unless they took long to start).
        caught = s.wait_event(
            lambda e: e["ev"] == "end" and e["job"] == "five" and e["instant"] > first["instant"],
            15,
            "the catch-up round",
        )
        owed = datetime.fromisoformat(caught["instant"])
        assert owed >= last + timedelta(seconds=15)
        s.wait_start("five", 10, after=time.monotonic())  # the schedule goes on
        assert all(rc == 0 for rc in s.stop().values())
        rounds = [r for r in s.rounds() if r.job == "five"]
        missed = [r for r in rounds if last < r.instant <= owed]
        assert [r.instant for r in missed] == [owed], [r.describe() for r in missed]
        assert missed[0].attempt == 1
        assert f"catching up instant {owed.isoformat()}" in "".join(s.outputs().values())
        report = s.check()
        report.assert_clean()
        return _finish(
            s,
            {
                "missed_instants": int((owed - last).total_seconds() // 5),
                "catch_up_rounds": len(missed),
                "caught_up": owed.isoformat(),
                "violations": 0,
            },
        )


def scenario_garbage_row() -> Figures:
    """Lease rows edited by hand to garbage: logged and skipped; the other jobs go on,
    and the sweep still finds the other jobs' rounds cut short."""
    jobs = [
        JobSpec("victim", "*/2 * * * * *", "work", 0.1),
        JobSpec("poison", "*/2 * * * * *", "work", 0.1),
        JobSpec("healthy", "*/1 * * * * *", "work", 0.1),
        JobSpec("other", "@every 3600s", "work", 0.5),
    ]
    with Scenario("garbage_row", jobs) as s:
        s.replica("a")
        s.replica("b")
        s.start()
        s.wait_start("poison", 10)
        s.wait_start("victim", 10)
        time.sleep(1.0)
        edited = time.monotonic()
        edited_wall = wall_now()
        # A state and attempt the package never writes, a negative token.
        s.sql(
            "UPDATE cronjob_lease SET state = 'zombie', attempt = 9, token = -5, "
            "prev_state = '??' WHERE name = 'victim'"
        )
        # A round "cut short" at an instant past the end of time.
        s.sql(
            "UPDATE cronjob_lease SET instant = 9000000000000000000, state = 'running', "
            "attempt = 1, expires_ms = NULL WHERE name = 'poison'"
        )
        # A genuine round cut short (given back) for the sweep to find.
        cut_instant = int(time.time()) - 30
        s.sql(
            "UPDATE cronjob_lease SET instant = :i, state = 'cut', attempt = 1, "
            "expires_ms = NULL, token = 123 WHERE name = 'other'",
            i=cut_instant,
        )
        late = s.replica("late")
        late.start()
        late.wait_started()
        rerun = s.wait_start("other", SWEEP_EVERY + 10, attempt=2)
        rerun_delay = rerun["mono"] - edited
        time.sleep(max(0.0, edited + 12 - time.monotonic()))
        last = wall_now() - 2 * SECOND
        assert all(rc == 0 for rc in s.stop().values())
        outputs = "".join(s.outputs().values())
        assert "'poison'" in outputs and "malformed" in outputs
        assert "sweep for rounds cut short failed" not in outputs
        healthy = {
            name: spec for name, spec in {j.name: j for j in jobs}.items() if name == "healthy"
        }
        report = check_invariants(
            [r for r in s.rounds() if r.job == "healthy"],
            healthy,
            fault_free=True,
            window=(edited_wall + SECOND, last),
        )
        report.assert_clean()
        return _finish(
            s,
            {
                "other_rerun_after_edit_s": _round(rerun_delay),
                "healthy_rounds": report.rounds,
                "violations": 0,
            },
        )


def scenario_hung_job() -> Figures:
    """A job that never returns and ignores its cancellation: it keeps its lease (the
    job's next instants are skipped), the other jobs go on, and SIGTERM still ends the
    process within the drain limit; once the lease expired another replica takes over
    (a second run, or the next instant giving the round up)."""
    jobs = [
        JobSpec("hung", "*/5 * * * * *", "forever"),
        JobSpec("tick", "*/1 * * * * *", "work", 0.2),
    ]
    with Scenario("hung_job", jobs) as s:
        s.replica("a")
        s.replica("b")
        s.start()
        first = s.wait_start("hung", 10)
        holder = s.replicas[_pid_replica(s, first["pid"])]
        other = s.replicas["b" if holder.name == "a" else "a"]
        time.sleep(12)
        hung = [r for r in s.rounds() if r.job == "hung"]
        assert len(hung) == 1, [r.describe() for r in hung]
        assert "lease lost" not in holder.output()
        process = holder.term()
        signalled = time.monotonic()
        rc = process.wait(DRAIN_LIMIT + 10)
        assert process.exited is not None
        stopped = process.exited - signalled
        assert rc == 0 and stopped < DRAIN_LIMIT + 1.5, f"status {rc} after {stopped:.1f}s"
        assert "still running after 5s" in process.output()
        first_exit = process.exited
        # The lease, renewed until the process ended, expires on its own; then the round
        # runs a second time (a sweep found it) or a later instant gives it up.
        taken = s.wait_start("hung", LEASE_TTL + SWEEP_EVERY + 5, after=first["mono"] + 0.1)
        assert taken["pid"] == other.pid
        if taken["attempt"] == 2:
            assert taken["instant"] == first["instant"]
        takeover = taken["mono"] - first_exit
        assert takeover > 3, f"taken over {takeover:.1f}s after the exit, lease still held"
        process = other.term()
        rc = process.wait(DRAIN_LIMIT + 10)
        assert rc == 0
        report = s.check()
        report.assert_clean()
        return _finish(
            s,
            {
                "sigterm_to_exit_s": _round(stopped),
                "taken_over_after_exit_s": _round(takeover),
                "taken_over_as": f"attempt {taken['attempt']} of {taken['instant']}",
                "violations": 0,
            },
        )


def scenario_base_exception() -> Figures:
    """Jobs raising ``SystemExit`` and ``KeyboardInterrupt`` (sync and async): each round
    is logged as failed and counts as run to its end; the process and the other jobs are
    unaffected."""
    jobs = [
        JobSpec("exit", "*/2 * * * * *", "system_exit"),
        JobSpec("interrupt", "*/2 * * * * *", "keyboard_interrupt"),
        JobSpec("async-exit", "1/2 * * * * *", "async_system_exit"),
        JobSpec("fails", "*/2 * * * * *", "fail"),
        JobSpec("tick", "*/1 * * * * *", "work", 0.2),
    ]
    with Scenario("base_exception", jobs) as s:
        s.replica("a")
        s.replica("b")
        s.start()
        first = wall_now() + 2 * SECOND
        time.sleep(14)
        last = wall_now() - 2 * SECOND
        assert all(r.alive for r in s.replicas.values()), "a replica died"
        assert s.stop() == {"a": 0, "b": 0}
        report = s.check(fault_free=True, window=(first, last))
        report.assert_clean()
        assert not report.reruns
        outputs = "".join(s.outputs().values())
        for name in ("exit", "interrupt", "async-exit"):
            assert f"round of job '{name}'" in outputs and "failed" in outputs
        assert "SystemExit" in outputs and "KeyboardInterrupt" in outputs
        return _finish(s, {"rounds": report.rounds, "violations": 0})


def scenario_thousand_jobs() -> Figures:
    """1,000 jobs in one module, every 5 s, two replicas: every instant of every job runs
    exactly once."""
    jobs = [JobSpec(f"bulk-{i:04d}", "*/5 * * * * *", "work", 0.0) for i in range(1000)]
    with Scenario("thousand_jobs", jobs, modules=("tests.faults.jobs_thousand",)) as s:
        s.replica("a")
        s.replica("b")
        s.start()
        first = wall_now() + 2 * SECOND
        time.sleep(22)
        last = wall_now() - 4 * SECOND
        assert s.stop(timeout=30) == {"a": 0, "b": 0}
        report = s.check(fault_free=True, window=(first, last))
        report.assert_clean()
        rounds = s.rounds()
        lags = [r.start + time.time() - time.monotonic() - r.instant.timestamp() for r in rounds]
        return _finish(
            s,
            {
                "rounds": len(rounds),
                "start_lag_p50_s": _round(sorted(lags)[len(lags) // 2]),
                "start_lag_max_s": _round(max(lags)),
                "violations": 0,
            },
        )


def scenario_bad_url() -> Figures:
    """Wrong or unreachable database URLs carrying a password: a clear message, the
    password never printed; a server that is down is retried with back-off, no crash."""
    jobs = [JobSpec("tick", "*/1 * * * * *", "work", 0.1)]
    figures: Figures = {}
    with Scenario("bad_url", jobs) as s:
        unreachable = f"postgresql+psycopg://cron:{SECRET}@127.0.0.1:1/test"
        no_database = f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:5432/no_such_db_faults"
        no_driver = f"nosuchdb://cron:{SECRET}@db.invalid/app"
        bad_port = f"postgresql+psycopg://cron:{SECRET}@127.0.0.1:notaport/app"
        down = [s.replica("down", url=unreachable), s.replica("nodb", url=no_database)]
        refused = [s.replica("nodriver", url=no_driver), s.replica("badport", url=bad_port)]
        for replica in down + refused:
            replica.start()
        for replica in refused:
            assert replica.current.wait(30) == 2
            output = replica.output()
            _assert_no_password(output)
            assert "cronjob: error:" in output and "***" in output, output
            assert "Traceback" not in output
            figures[replica.name] = output.strip().splitlines()[-1]
        time.sleep(8)
        for replica in down:
            assert replica.alive, f"{replica.name} exited: {replica.output()}"
            output = replica.output()
            _assert_no_password(output)
            assert "unavailable at start" in output and "***" in output, output
            assert "next attempt in" in output  # retried, with back-off
        statuses = s.stop()
        assert statuses == {"down": 0, "nodb": 0}, statuses
        for replica in down:
            _assert_no_password(replica.output())
            figures[replica.name] = next(
                line for line in replica.output().splitlines() if "unavailable at start" in line
            )
        return _finish(s, figures)


PARALLEL: dict[str, Callable[[], Figures]] = {
    "steady": scenario_steady,
    "clock_ahead": scenario_clock_ahead,
    "kill9": scenario_kill9,
    "sigterm": scenario_sigterm,
    "proxy_cut": scenario_proxy_cut,
    "catch_up": scenario_catch_up,
    "garbage_row": scenario_garbage_row,
    "hung_job": scenario_hung_job,
    "base_exception": scenario_base_exception,
    "thousand_jobs": scenario_thousand_jobs,
    "bad_url": scenario_bad_url,
}


def _need_postgres() -> None:
    reason = postgres_reachable()
    if reason is not None:
        message = f"PostgreSQL at {POSTGRES_URL} is unreachable ({reason})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; under CI the server must run (.ci/run starts it)")
        pytest.skip(message)


@pytest.fixture(scope="module")
def launched(
    request: pytest.FixtureRequest,
) -> Iterator[dict[str, concurrent.futures.Future[Figures]]]:
    """Start every selected scenario of :data:`PARALLEL` at once, each in a thread."""
    _need_postgres()
    module = sys.modules[__name__]
    wanted = [
        item.originalname.removeprefix("test_")  # type: ignore[attr-defined]
        for item in request.session.items
        if getattr(item, "module", None) is module
    ]
    names = [name for name in wanted if name in PARALLEL]
    pool = concurrent.futures.ThreadPoolExecutor(max(1, len(names)), "scenario")
    futures = {name: pool.submit(PARALLEL[name]) for name in names}
    try:
        yield futures
    finally:
        pool.shutdown(wait=True)


def _outcome(launched: dict[str, concurrent.futures.Future[Figures]], name: str) -> Figures:
    return launched[name].result(timeout=600)


def test_steady(launched):
    _outcome(launched, "steady")


def test_clock_ahead(launched):
    _outcome(launched, "clock_ahead")


def test_kill9(launched):
    _outcome(launched, "kill9")


def test_sigterm(launched):
    _outcome(launched, "sigterm")


def test_proxy_cut(launched):
    _outcome(launched, "proxy_cut")


def test_catch_up(launched):
    _outcome(launched, "catch_up")


def test_garbage_row(launched):
    _outcome(launched, "garbage_row")


def test_hung_job(launched):
    _outcome(launched, "hung_job")


def test_base_exception(launched):
    _outcome(launched, "base_exception")


def test_thousand_jobs(launched):
    _outcome(launched, "thousand_jobs")


def test_bad_url(launched):
    _outcome(launched, "bad_url")


# -- bad job modules: no database needed -----------------------------------------------------


def _cronjob_run(*modules: str) -> subprocess.CompletedProcess[str]:
    url = f"postgresql+psycopg://cron:{SECRET}@127.0.0.1:1/test"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAULTS_", "CRONJOB_"))}
    return subprocess.run(
        [sys.executable, "-m", "cronjob", "run", "--database-url", url, *modules],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_module_that_fails_to_import():
    result = _cronjob_run("tests.faults.jobs_broken")
    assert result.returncode == 2
    assert "cronjob: error: cannot import job module 'tests.faults.jobs_broken'" in result.stderr
    assert "fails on purpose" in result.stderr
    _assert_no_password(result.stdout + result.stderr)


def test_module_with_a_bad_registration():
    result = _cronjob_run("tests.faults.jobs_badspec")
    assert result.returncode == 2
    assert "five-fields" in result.stderr and "0 */5 * * * *" in result.stderr
    assert "Traceback" not in result.stderr
    _assert_no_password(result.stdout + result.stderr)


def test_missing_module():
    result = _cronjob_run("tests.faults.jobs_nowhere")
    assert result.returncode == 2
    assert "no module named 'tests.faults.jobs_nowhere'" in result.stderr


# -- last, alone: the PostgreSQL server restarted under load --------------------------------


def test_postgres_restart(launched):
    """PostgreSQL restarted under load (one short restart, after every other scenario):
    the replicas reconnect, none crashes or restarts, no instant runs twice, and the
    schedule goes on."""
    concurrent.futures.wait(launched.values())
    if postgres_cluster() is None:
        message = "no local PostgreSQL cluster to restart (pg_ctlcluster)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    jobs = [
        JobSpec("tick", "*/1 * * * * *", "work", 0.3),
        JobSpec("work5", "*/5 * * * * *", "work", 2.0),
        JobSpec("async2", "*/2 * * * * *", "async_work", 0.5),
    ]
    with Scenario("postgres_restart", jobs) as s:
        for name in "abc":
            s.replica(name)
        s.start()
        time.sleep(8)
        s.emit("fault", kind="postgres-restart")
        began = time.monotonic()
        took = restart_postgres()
        back = time.monotonic()
        resumed = s.wait_start("tick", 30, after=back)
        recovery = resumed["mono"] - back
        steady_from = wall_now() + 5 * SECOND
        time.sleep(15)
        last = wall_now() - 2 * SECOND
        for replica in s.replicas.values():
            assert len(replica.processes) == 1 and replica.alive, f"{replica.name} died"
        assert all(rc == 0 for rc in s.stop().values())
        report = s.check()
        report.assert_clean()
        # Once back, no instant is lost.
        after = check_invariants(
            [r for r in s.rounds() if r.job == "tick"],
            {"tick": jobs[0]},
            fault_free=True,
            window=(steady_from, last),
        )
        after.assert_clean()
        _finish(
            s,
            {
                "restart_s": _round(took),
                "restart_began_after_s": _round(began - s.began),
                "first_round_after_restart_s": _round(recovery),
                "rounds": report.rounds,
                "reruns": len(report.reruns),
                "given_up": len(report.given_up),
                "violations": 0,
            },
        )
