"""A database server restarted under load, with real ``cronjob run`` replicas on it.

A restart cuts every session on the server, other people's included: these tests are
marked ``restart``, and scripts/test runs them in a pytest run of their own, ``-m
restart``, before every other test, while nothing else uses the servers. Each database's
restart is an xdist group of its own, so the PostgreSQL and the MariaDB restart (and the
Redis stop of test_streams_faults.py) run side by side, each on a server of its own.
"""

from __future__ import annotations

import os
import time

import pytest

from .harness import DATABASES, JobSpec, Scenario, check_invariants, wall_now
from .test_faults import _MARKS, SECOND, _finish, _round, _unreachable

pytestmark = [pytest.mark.faults, pytest.mark.restart]


@pytest.mark.parametrize(
    "db",
    [
        pytest.param(db, id=db, marks=[*_MARKS[db], pytest.mark.xdist_group(f"restart-{db}")])
        for db in ("postgres", "mysql")  # SQLite has no server to restart
    ],
)
def test_server_restart(db):
    """The server restarted under load (one short restart): the replicas reconnect, none
    crashes or restarts, no instant runs twice, and the schedule goes on."""
    database = DATABASES[db]
    reason = database.reachable()
    if reason is not None:
        _unreachable(db, reason)
    why_not = database.restartable()
    if why_not is not None:
        message = f"cannot restart the {db} server here: {why_not}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    jobs = [
        JobSpec("tick", "*/1 * * * * *", "work", 0.3),
        JobSpec("work5", "*/5 * * * * *", "work", 2.0),
        JobSpec("async2", "*/2 * * * * *", "async_work", 0.5),
    ]
    with Scenario("server_restart", jobs, db=db) as s:
        for name in "abc":
            s.replica(name)
        s.start()
        time.sleep(8)
        s.emit("fault", kind=f"{db}-restart")
        began = time.monotonic()
        took = database.restart()
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
