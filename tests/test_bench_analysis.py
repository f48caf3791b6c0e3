"""The benchmarks' accounting of a run: what is missed before, at and after a kill's
instant, how the rounds were shared before and after it, and how evenly the live
replicas shared each instant (benchmarks/_harness.py). Pure functions; no database, no
processes."""

from __future__ import annotations

from benchmarks._harness import _analyse, _shares, kill_phases

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


def test_shares_count_an_idle_replica_at_zero_and_a_killed_one_until_its_kill() -> None:
    # Instant 100: shared evenly. 110: the third replica ran nothing while alive, which
    # is no sharing. 120 is the kill instant (the killed one ran half its share); at 130
    # the two survivors share alone.
    by_instant = {100: [2, 2, 2], 110: [3, 3, 0], 120: [2, 2, 1], 130: [3, 3, 0]}

    shares = _shares(by_instant, killed_after=120)

    assert shares["instants_fair"] == "2/4"  # 100 and 130
    assert shares["instants_shared"] == "4/4"
    assert shares["share_pct"] == [0, 150]  # 110: 0 and 3 of a fair 2


def test_shares_without_a_kill_count_every_replica_at_every_instant() -> None:
    # One replica runs every round: a fair share for it alone would be 100 %.
    shares = _shares({100: [6, 0, 0], 110: [6, 0, 0]})

    assert shares == {"share_pct": [0, 300], "instants_fair": "0/2", "instants_shared": "0/2"}
