"""A promoted standby: what asynchronous replication loses, and the setting that keeps it.

Each test builds a private PostgreSQL primary and its streaming standby
(:class:`~tests.faults._standby.StandbyPair`, on free ports, never the shared server),
runs ``cronjob run`` replicas as OS processes against it, kills the primary as its
machine would die, promotes the standby and points replicas at it.

- Asynchronous replication (PostgreSQL's default): a claim the primary acknowledged, and
  whose round runs, can be missing on the standby; a replica pointed at the promoted
  standby claims that instant again, and it runs twice, at the same time. The loss is
  made certain, not waited for by luck: the standby is cut off the primary's stream
  before the claim (on a healthy network the window is the replication lag, a fraction
  of a millisecond here).
- ``synchronous_commit = remote_apply`` with the standby named in
  ``synchronous_standby_names``: the claim is on the standby before the primary
  acknowledges it, so after the promotion nobody claims that instant again, and the
  round's own replica, on libpq's multi-host URL (``target_session_attrs=read-write``),
  renews its lease and records its end on the new primary without a restart.

See guarantees.md, "A promoted standby", and ``benchmarks/bench_standby.py`` for the
counts under load and the cost on claims.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import pytest

import lease

from ._standby import StandbyPair
from .harness import JobSpec, Scenario, schema_url, wait_until

pytestmark = pytest.mark.faults

#: A round long enough to outlive the failover: the primary dies while it runs.
LONG = JobSpec("long", "*/10 * * * * *", "work", 12.0)
#: A job every second, to see the replicas go on after the failover.
TICK = JobSpec("tick", "*/1 * * * * *", "work", 0.1)


def _report(scenario: Scenario, **figures: Any) -> None:
    """Write what the test measured to the scenario's ``result.json``; print it (``-s``)."""
    figures["dir"] = str(scenario.dir)
    (scenario.dir / "result.json").write_text(json.dumps(figures, indent=2, default=str))
    print(f"\n[{scenario.name}] {json.dumps(figures, default=str)}")


def _row(url: str, name: str) -> lease.LeaseRow:
    """The lease row of ``name`` as the server at ``url`` has it (a standby can be read)."""
    engine = lease.create_engine(url)
    try:
        return lease.LeaseStore(engine).read([name])[name]
    finally:
        engine.dispose()


def _prepare(url: str, names: list[str], specs: dict[str, str]) -> None:
    """Migrate the lease tables at ``url`` and write the jobs' rows (their first
    deployment), as a replica's start would."""
    engine = lease.create_engine(url)
    try:
        lease.migrate(engine)
        lease.LeaseStore(engine).ensure(names, specs=specs)
    finally:
        engine.dispose()


def test_async_replication_loses_a_claim_and_the_instant_runs_twice() -> None:
    """The primary acknowledged a claim the standby never got: after the promotion a
    replica on the standby claims the same instant, and its round runs a second time
    while the first still runs."""
    with StandbyPair() as pair, Scenario("standby-async", [LONG], db=pair.database) as s:
        on_standby = schema_url(s.schema, base=pair.standby_url)
        # The job's row (its first deployment) is on both servers; then the standby is
        # cut off, so the claim to come is the primary's alone.
        _prepare(s.url, [LONG.name], {LONG.name: LONG.spec})
        pair.caught_up()
        pair.detach()
        detached = time.monotonic()
        a = s.replica("a")  # on the primary alone
        s.start("a")
        first = s.wait_start(LONG.name, 20, pid=a.pid, after=detached)
        instant = datetime.fromisoformat(first["instant"])
        claimed = _row(s.url, LONG.name)
        assert (claimed.instant, claimed.state) == (instant, lease.LeaseState.RUNNING)

        s.emit("fault", kind="kill-primary")
        killed = time.monotonic()
        pair.kill_primary()
        pair.promote()
        promoted = _row(on_standby, LONG.name)
        assert promoted.instant is None, "the claim reached the standby after all"

        b = s.replica("b", url=on_standby)
        s.start("b")
        second = s.wait_start(LONG.name, 30, pid=b.pid)
        assert datetime.fromisoformat(second["instant"]) == instant
        assert second["attempt"] == 1
        rounds = [r for r in s.rounds() if r.job == LONG.name and r.instant == instant]
        assert [r.pid for r in rounds] == [a.pid, b.pid]
        # The first round had not ended when the second began: two at once.
        assert rounds[0].end is None or rounds[0].end > rounds[1].start
        report = s.check()
        assert any("overlap" in v for v in report.violations), report.violations
        assert any("not attempt 2" in v for v in report.violations), report.violations
        s.stop()
        _report(
            s,
            second_start_after_kill=round(rounds[1].start - killed, 2),
            first_round=rounds[0].outcome,
            first_round_end_after_second_start=(
                round(rounds[0].end - rounds[1].start, 2) if rounds[0].end else None
            ),
            violations=report.violations,
        )


def test_remote_apply_keeps_the_claim_and_the_round_ends_on_the_new_primary() -> None:
    """With ``remote_apply`` the claim is on the standby before the round starts; after
    the promotion no replica claims the instant again, and the round's replica, on the
    multi-host URL, keeps its lease and records the round's end on the new primary,
    without a restart."""
    with (
        StandbyPair(synchronous=True) as pair,
        Scenario("standby-sync", [LONG, TICK], db=pair.database) as s,
    ):
        either = schema_url(s.schema, base=pair.url)
        on_standby = schema_url(s.schema, base=pair.standby_url)
        a = s.replica("a", url=either)
        s.start("a")
        first = s.wait_start(LONG.name, 20, pid=a.pid)
        instant = datetime.fromisoformat(first["instant"])
        seen = _row(on_standby, LONG.name)  # read on the standby, the primary still up
        assert (seen.instant, seen.state) == (instant, lease.LeaseState.RUNNING)

        s.emit("fault", kind="kill-primary")
        killed = time.monotonic()
        pair.kill_primary()
        promotion = pair.promote()
        b = s.replica("b", url=either)
        s.start("b")

        end = s.wait_event(
            lambda e: e["ev"] == "end" and e["job"] == LONG.name and e["pid"] == a.pid,
            LONG.duration + 20,
            "the first round's end",
        )
        assert end["outcome"] == "done", end
        row = wait_until(
            lambda: (r := _row(on_standby, LONG.name)).state == lease.LeaseState.DONE and r,
            20,
            "the round's end on record on the new primary",
        )
        assert (row.instant, row.attempt, row.last_outcome) == (instant, 1, "succeeded")
        # Both replicas go on with the new primary, the first without a restart.
        resumed = s.wait_start(TICK.name, 20, pid=a.pid, after=killed + promotion)
        s.wait_start(TICK.name, 20, pid=b.pid, after=killed + promotion)
        assert len(a.processes) == 1 and a.alive
        statuses = s.stop()
        assert statuses == {"a": 0, "b": 0}
        starts = [r for r in s.rounds() if r.job == LONG.name and r.instant == instant]
        assert [(r.pid, r.attempt) for r in starts] == [(a.pid, 1)]
        s.check().assert_clean()
        _report(
            s,
            promotion=round(promotion, 2),
            first_tick_on_a_after_kill=round(resumed["mono"] - killed, 2),
            long_round_end_after_kill=round(end["mono"] - killed, 2),
        )
