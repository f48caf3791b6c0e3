"""The fault suite's checker: an instant lost without a fault is a violation, unless a
round of the job still ran at it (an overrun, which the rules skip)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.faults.harness import (
    JobSpec,
    RoundRecord,
    build_rounds,
    check_invariants,
    unrecorded_ends,
)

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
JOB = JobSpec("tick", "* * * * * *", "work", 0.1)


def ran(second: int, *, ended_at: float) -> RoundRecord:
    """A round of ``T0 + second`` that ended when the wall clock read ``T0 + ended_at``."""
    to_mono = time.monotonic() - time.time()
    end = (T0 + timedelta(seconds=ended_at)).timestamp() + to_mono
    return RoundRecord(
        job="tick",
        instant=T0 + timedelta(seconds=second),
        attempt=1,
        replica="a",
        pid=1,
        start=end - 0.1,
        end=end,
        outcome="done",
    )


def violations(rounds: list[RoundRecord]) -> list[str]:
    window = (T0, T0 + timedelta(seconds=2))
    report = check_invariants(rounds, {"tick": JOB}, fault_free=True, window=window)
    return report.violations


def test_an_instant_no_round_ran_at_is_lost():
    assert violations([ran(0, ended_at=0.2), ran(2, ended_at=2.2)]) == [
        f"instant lost without a fault: tick {(T0 + timedelta(seconds=1)).isoformat()}"
    ]


def test_an_instant_a_late_round_overran_is_skipped_by_the_rules():
    assert violations([ran(0, ended_at=1.3), ran(2, ended_at=2.2)]) == []


def test_a_process_that_starts_one_instant_twice_shows_two_rounds_and_a_violation() -> None:
    """After a failover to a standby that lacked a claim, the same replica may run the
    same instant again with the same attempt: both rounds are kept, and the second is
    flagged."""
    instant = T0.isoformat()

    def event(ev: str, mono: float, **fields: object) -> dict[str, object]:
        return {"ev": ev, "job": "tick", "instant": instant, "attempt": 1, "replica": "a",
                "pid": 7, "mono": mono, "trigger": "schedule", **fields}  # fmt: skip

    rounds = build_rounds(
        [
            event("start", 1.0),
            event("end", 1.1, outcome="done"),
            event("start", 5.0),
            event("end", 5.1, outcome="done"),
        ]
    )
    assert [(r.start, r.end) for r in rounds] == [(1.0, 1.1), (5.0, 5.1)]
    report = check_invariants(rounds, {"tick": JOB})
    assert report.violations == [
        f"second run of an instant is not attempt 2: tick {instant} attempt 1 on pid 7 (done)",
        f"re-run of a round that ran to its end (and on record): tick {instant} attempt 1 on "
        f"pid 7 (done) after tick {instant} attempt 1 on pid 7 (done)",
    ]


def test_the_first_runs_a_replica_handed_back_unrun_are_read_from_its_log() -> None:
    """The library's lines for first runs given back before they ran (a claim too late,
    a drain before their instant, no thread): each names its jobs, and the checker lets
    their second runs stand without a first."""
    names = ", ".join(repr(f"job-{i}") for i in range(100))
    output = "\n".join(
        [
            "2026-03-02 09:00:01,000 WARNING cronjob: the claim of 2026-03-02T09:00:01+00:00 "
            "came back 12.0 s after it was sent, when its leases may be lost already: "
            f"given back, not run here: {names}",
            "2026-03-02 09:00:01,500 INFO    cronjob: the claim of 2026-03-02T09:00:02+00:00 "
            "was won ahead of its instant, then a drain began: given back, not run here: 'tick'",
            "2026-03-02 09:00:03,000 ERROR   cronjob: job 'late' : x",
            "2026-03-02 09:00:03,000 ERROR   cronjob: job 'solo': the round of "
            "2026-03-02T09:00:03+00:00 is not started: no worker thread could be started (x)",
            "2026-03-02 09:00:04,000 WARNING cronjob: the claim of 2 second run(s) of "
            "2026-03-02T09:00:04+00:00 came back too late to keep: given back",
        ]
    )
    found = unrecorded_ends([output])
    first = (T0 + timedelta(seconds=1)).isoformat()
    assert {(f"job-{i}", first, 1) for i in range(100)} <= found
    assert ("tick", (T0 + timedelta(seconds=2)).isoformat(), 1) in found
    assert ("solo", (T0 + timedelta(seconds=3)).isoformat(), 1) in found
    assert len(found) == 102
