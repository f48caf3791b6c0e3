"""The benchmarks' accounting of a run in which a replica is killed: what is missed
before, at and after the kill's instant, and how the rounds were shared before and
after (benchmarks/_harness.py). Pure functions; no database, no processes."""

from __future__ import annotations

from benchmarks._harness import _analyse, kill_phases

NAMES = [f"job-{i:05d}" for i in range(6)]
INSTANTS = [100, 110, 120, 130]


def _report(rounds: list[tuple[str, int]]) -> dict[str, object]:
    return {
        "rounds": [[name, float(instant), instant + 0.01] for name, instant in rounds],
        "statements": [],
        "checkouts": [],
    }


def test_kill_phases_split_missed_and_shares_around_the_kill_instant() -> None:
    # Three replicas share six jobs two each; the third is killed 0.3 s after instant
    # 120 having started one of its two rounds there; the survivors take its share from
    # 130 on.
    by_instant = {100: [2, 2, 2], 110: [2, 2, 2], 120: [2, 2, 1], 130: [3, 3, 0]}
    seen = {(n, i) for i in (100, 110, 130) for n in NAMES} | {(n, 120) for n in NAMES[:5]}

    phases = kill_phases(
        by_instant, seen, names=NAMES, instants=INSTANTS, replicas=3, kill_time=120.3
    )

    assert phases["kill_instant"] == 120
    assert phases["kill_after_instant_s"] == 0.3
    assert phases["missed"] == [0, 1, 0]
    assert phases["rounds_per_instant_before"] == [2.0, 2.0, 2.0]
    assert phases["rounds_per_instant_at_kill"] == [2.0, 2.0, 1.0]
    assert phases["rounds_per_instant_after"] == [3.0, 3.0, 0.0]


def test_a_kill_before_the_first_instant_leaves_every_instant_after_it() -> None:
    phases = kill_phases({}, set(), names=NAMES[:1], instants=INSTANTS, replicas=2, kill_time=99)

    assert phases["kill_instant"] is None
    assert phases["missed"] == [0, 0, 4]
    assert phases["rounds_per_instant_before"] is None
    assert phases["rounds_per_instant_after"] == [0.0, 0.0]


def test_analyse_counts_rounds_per_replica_per_instant_and_the_kill() -> None:
    survivor = _report([(n, i) for i in INSTANTS for n in NAMES[:3]])
    # The killed replica ran its half at 100 and 110 only; its rounds of 120 are lost
    # and the survivor does not take its share after: 3 pairs missed at 120, 3 after.
    killed = _report([(n, i) for i in (100, 110) for n in NAMES[3:]])

    result = _analyse(
        [survivor, killed],
        window_start=100,
        window_end=140,
        jobs=6,
        period=10,
        kill_time=120.3,
    )

    assert result["expected"] == 24
    assert result["missed"] == 6
    assert result["duplicates"] == 0
    assert result["rounds_per_instant"] == [3.0, 1.5]
    assert result["kill"]["missed"] == [0, 3, 3]
    assert result["kill"]["rounds_per_instant_after"] == [3.0, 0.0]
