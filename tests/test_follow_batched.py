"""`NextRounds.batched`: the follow-up claims of a batch of ends (the finisher's) are made
once per instant for all the jobs they follow, not once per job, and none is dropped.

At 10,000 hand-offs a minute, one claim per job once a period's rounds all ran over kept a
replica behind for good (issue 47, docs/benchmarks.md). The ports are recorded here: what
each claim wins is the claim's own business (tests/test_policies_overlap.py and the
hand-off tests run the whole path on the three databases).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronjob import Registry
from cronjob.engine._overlap import NextRounds
from cronjob.engine._state import Reason
from cronjob.testing import FakeClock
from tests.test_policies_overlap import MINUTELY, Rounds, at, ended

T = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@dataclass
class _Job:
    name: str
    leased: bool = True


@dataclass
class _State:
    job: _Job


@dataclass
class Recorded:
    """The claims made and the jobs taken off the timetable, in order."""

    claims: list[tuple[datetime, list[str], Reason]] = field(default_factory=list)
    taken: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    draining: bool = False

    def claim(self, instant: datetime, states: list[Any], *, reason: Reason) -> None:
        self.claims.append((instant, [s.job.name for s in states], reason))

    def take(self, state: Any) -> None:
        self.taken.append(state.job.name)

    def start_round(self, state: Any, instant: datetime, **_: Any) -> None:
        self.started.append(state.job.name)


@pytest.fixture
def recorded() -> Recorded:
    return Recorded()


@pytest.fixture
def rounds(recorded: Recorded) -> NextRounds:
    return NextRounds(
        timetable=recorded,  # type: ignore[arg-type]
        starter=recorded,  # type: ignore[arg-type]
        claims=recorded,  # type: ignore[arg-type]
        runs=set(),
        cancel=lambda run, exc: None,
        clock=FakeClock(T),
    )


def states(*names: str, leased: bool = True) -> list[Any]:
    return [_State(_Job(name, leased)) for name in names]


def test_outside_a_batch_each_follow_up_is_claimed_at_once(rounds, recorded):
    a, b = states("a", "b")
    rounds._follow(a, T, Reason.OVERLAP)
    assert recorded.claims == [(T, ["a"], Reason.OVERLAP)]
    rounds._follow(b, T, Reason.OVERLAP)
    assert recorded.claims == [(T, ["a"], Reason.OVERLAP), (T, ["b"], Reason.OVERLAP)]


def test_a_batch_claims_each_instant_once_for_its_jobs_in_the_order_they_ended(rounds, recorded):
    a, b, c, d = states("a", "b", "c", "d")
    later = T + timedelta(seconds=1)
    with rounds.batched():
        rounds._follow(a, T, Reason.OVERLAP)
        rounds._follow(b, later, Reason.OVERLAP)
        rounds._follow(c, T, Reason.OVERLAP)
        rounds._follow(d, T, Reason.CATCH_UP)
        assert recorded.claims == []  # put off to the batch's end
        assert recorded.taken == ["a", "b", "c", "d"]  # off the timetable at once
    assert recorded.claims == [
        (T, ["a", "c"], Reason.OVERLAP),
        (later, ["b"], Reason.OVERLAP),
        (T, ["d"], Reason.CATCH_UP),
    ]


def test_a_job_followed_twice_in_a_batch_is_claimed_once(rounds, recorded):
    (a,) = states("a")
    with rounds.batched():
        rounds._follow(a, T, Reason.OVERLAP)
        rounds._follow(a, T, Reason.OVERLAP)
    assert recorded.claims == [(T, ["a"], Reason.OVERLAP)]


def test_a_per_instance_job_starts_at_once_inside_a_batch(rounds, recorded):
    (a,) = states("a", leased=False)
    with rounds.batched():
        rounds._follow(a, T, Reason.OVERLAP)
        assert recorded.started == ["a"]
    assert recorded.claims == []


def test_the_claims_are_made_even_if_handling_an_end_raised(rounds, recorded):
    """A job taken off the timetable is claimed, or it would wait for nothing."""
    a, b = states("a", "b")
    with pytest.raises(RuntimeError, match="an end failed"), rounds.batched():
        rounds._follow(a, T, Reason.OVERLAP)
        rounds._follow(b, T, Reason.OVERLAP)
        raise RuntimeError("an end failed")
    assert recorded.claims == [(T, ["a", "b"], Reason.OVERLAP)]


def test_a_batch_inside_a_batch_claims_at_the_outer_end(rounds, recorded):
    a, b = states("a", "b")
    with rounds.batched():
        rounds._follow(a, T, Reason.OVERLAP)
        with rounds.batched():
            rounds._follow(b, T, Reason.OVERLAP)
        assert recorded.claims == []
    assert recorded.claims == [(T, ["a", "b"], Reason.OVERLAP)]
    # After the batch, follow-ups are claimed at once again.
    rounds._follow(a, T + timedelta(seconds=1), Reason.OVERLAP)
    assert recorded.claims[-1] == (T + timedelta(seconds=1), ["a"], Reason.OVERLAP)


JOBS = ("a", "b", "c")


def start_two_replicas(replicas, clock, *, seconds: float, overlap: str) -> dict[str, Rounds]:
    """Each of `JOBS` every minute, its rounds lasting ``seconds``, with ``overlap``, on
    two replicas; the rounds of each job by name."""
    rounds = {name: Rounds(clock) for name in JOBS}
    registry = Registry()
    for name in JOBS:
        registry.register(rounds[name].job(seconds), MINUTELY, name, overlap=overlap)
    replicas(registry, "r1")
    replicas(registry, "r2")
    return rounds


class TestJobsWhoseRoundsEndTogether:
    """End to end, on each database: rounds of several jobs that end at one time reach the
    dispatcher in one batch; each job's follow-up runs once, as it did claimed alone."""

    def test_buffer_one_each_buffered_instant_runs_once_as_the_rounds_end(
        self, url, replicas, clock
    ):
        rounds = start_two_replicas(replicas, clock, seconds=90, overlap="buffer_one")
        clock.advance(60 + 90 + 31)  # 09:01 runs to 09:02:30; 09:02 waits; 09:03 on time
        for name in JOBS:
            assert rounds[name].instants() == [at(minutes=m) for m in (1, 2, 3)], name
            assert rounds[name].seen[1].started == at(minutes=2, seconds=30)
            rounds[name].assert_never_overlapping()
            assert [(i, why) for i, _a, why, _o in ended(url, name)] == [
                (at(minutes=m), "schedule") for m in (1, 2, 3)
            ]

    def test_cancel_other_each_superseding_instant_runs_once(self, url, replicas, clock):
        rounds = start_two_replicas(replicas, clock, seconds=150, overlap="cancel_other")
        clock.advance(60 + 60 + 30)  # 09:01 superseded at 09:02, which runs (1 s); 09:03 next
        for name in JOBS:
            assert rounds[name].instants() == [at(minutes=1), at(minutes=2)], name
            rounds[name].assert_never_overlapping()
            outcomes = [(i, out) for i, _a, _w, out in ended(url, name)]
            assert outcomes[0][0] == at(minutes=1) and outcomes[0][1] != "succeeded"
            assert outcomes[1:] == [(at(minutes=2), "succeeded")]
