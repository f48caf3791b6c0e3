"""The fault suite's checker: an instant lost without a fault is a violation, unless a
round of the job still ran at it (an overrun, which the rules skip)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.faults.harness import JobSpec, RoundRecord, check_invariants

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
