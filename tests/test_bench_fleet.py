"""The fleet benchmark's own logic (benchmarks/_mix.py, benchmarks/_fleet_analysis.py,
benchmarks/workers/_statements.py): the instants each job of a mix is due, and from the
replicas' reports the rounds run, run twice, missed or late, the claims split into each
replica's share and the rest, the statements by kind. Pure functions; no database, no
processes, no timing."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import _mix
from benchmarks._fleet_analysis import analyse, claims_by_turn, percentile, rounds_outcome
from benchmarks.workers._statements import _listed_names, kind, param_bytes

START, END = 1_800_000_000, 1_800_000_120  # two whole minutes (START is one: % 60 == 0)


def _report(
    rounds: list[tuple[str, int, float]],
    *,
    kinds: list[list[Any]] | None = None,
    claims: list[list[float]] | None = None,
) -> dict[str, Any]:
    """A replica's report: rounds as (name, instant, seconds late)."""
    return {
        "rounds": [[name, float(instant), instant + late] for name, instant, late in rounds],
        "fleet": {"kinds": kinds or [], "claims": claims or []},
    }


def test_realistic_mix_has_its_shares_and_spreads_them_over_the_seconds() -> None:
    jobs = _mix.mix("realistic", 1000)

    periods = [job.period for job in jobs]
    assert (periods.count(60), periods.count(300), periods.count(3600)) == (700, 200, 80)
    assert periods.count(86_400) == 20
    assert len({job.name for job in jobs}) == 1000
    # Every second of a minute holds 11 or 12 of the 700 every-minute jobs.
    due = _mix.due_per_instant([j for j in jobs if j.period == 60], START, START + 60)
    assert len(due) == 60
    assert set(due.values()) == {11, 12}


@pytest.mark.parametrize(
    ("mix", "instants", "due_max"),
    [("every-minute", 60, 2), ("same-second", 1, 120)],
)
def test_every_minute_mixes_in_one_minute(mix: str, instants: int, due_max: int) -> None:
    due = _mix.due_per_instant(_mix.mix(mix, 120), START, START + 60)

    assert len(due) == instants
    assert max(due.values()) == due_max
    assert sum(due.values()) == 120  # each job once a minute


def test_a_jobs_instants_follow_its_period_and_offset() -> None:
    five = _mix.Job("j", "7 2-59/5 * * * *", 300, 127)

    assert _mix.due_in(five, START, START + 600) == [START + 127, START + 427]
    assert _mix.due_in(five, START + 128, START + 427) == []
    assert _mix.due_in(five, START + 427, START + 428) == [START + 427]


def test_rounds_outcome_counts_duplicates_misses_and_strays() -> None:
    jobs = _mix.mix("same-second", 3)  # job-000000..2, due at START and START + 60
    first = _report(
        [
            ("job-000000", START, 0.010),
            ("job-000001", START, 0.020),
            ("job-000000", START + 60, 0.030),
            ("job-000001", START + 60, 0.040),
            ("job-000002", START + 60, 0.050),
            ("job-000002", START + 7, 0.001),  # an instant its spec does not have
            ("job-000000", START + 120, 0.0),  # after the window: not counted
        ]
    )
    # The second replica runs job-000001 at START again; nobody runs job-000002 at START.
    second = _report([("job-000001", START, 0.900)])

    outcome = rounds_outcome([first, second], jobs, START, END)

    assert outcome["instants"] == 2
    assert outcome["expected"] == 6
    assert outcome["rounds_run"] == 5
    assert outcome["duplicates"] == 1
    assert outcome["missed"] == 1
    assert outcome["unexpected"] == 1
    assert outcome["rounds_per_replica"] == [6, 1]
    assert outcome["lateness_ms"]["max"] == 900.0
    # START's last round started 0.9 s after it, START + 60's 0.05 s after.
    assert outcome["instant_done_ms"] == {"p50": 50.0, "p99": 900.0, "max": 900.0}


def test_lateness_percentiles_are_nearest_rank() -> None:
    assert percentile([], 0.99) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0


def test_claims_split_into_the_share_and_the_rest_by_their_order_in_an_instant() -> None:
    # [instant, sent, seconds, names, won, bytes]; the rest's claim is listed first.
    claims = [
        [START, START + 0.1, 0.004, 6, 0, 120],
        [START, START - 0.2, 0.002, 3, 3, 60],
        [START + 1, START + 0.8, 0.002, 3, 3, 60],
        [float("nan"), START + 3, 0.001, 0, 1, 20],  # a second run: no instant
    ]

    turns = claims_by_turn(claims)

    assert [c[1] for c in turns["share"]] == [START - 0.2, START + 0.8]
    assert [c[1] for c in turns["rest"]] == [START + 0.1]


def test_analyse_counts_statements_per_kind_and_names_listed_per_instant() -> None:
    jobs = _mix.mix("same-second", 4)
    rounds = [(f"job-00000{i}", instant, 0.01) for i in range(4) for instant in (START, START + 60)]
    kinds = [
        [START, "claim", 2, 300],
        [START, "finish", 2, 900],
        [START + 60, "claim", 2, 300],
        [START + 61, "check", 1, 5000],
        [END, "claim", 5, 1],  # after the window
    ]
    claims = [
        [START, START, 0.003, 2, 2, 100],
        [START, START + 0.1, 0.005, 2, 0, 200],
        [START + 60, START + 60, 0.003, 2, 2, 100],
        [START + 60, START + 60.1, 0.005, 2, 0, 200],
    ]
    one = _report(rounds[:4], kinds=kinds, claims=claims)
    two = _report(rounds[4:], kinds=kinds, claims=claims)

    result = analyse(
        [one, two],
        jobs,
        start=START,
        end=END,
        server={
            "counters": {"xact_commit": 240, "tup_fetched": 20},
            "cpu_s": 0.6,
            "lease_table": {"seq_scan": 6, "seq_tup_read": 24, "idx_tup_fetch": 10},
        },
    )

    assert (result["rounds_run"], result["missed"], result["duplicates"]) == (8, 0, 0)
    statements = result["statements"]
    assert statements["total"] == 14
    assert statements["per_s_by_kind"]["claim"] == round(8 / 120, 2)
    assert statements["per_replica_instant_by_kind"]["claim"] == 2.0
    assert statements["per_replica_instant"] == 3.5
    assert statements["kb_per_instant_by_kind"]["check"] == round(10_000 / 2 / 1024, 2)
    # Each replica lists 4 names per instant (2 in its share, 2 in the rest): 8 in all.
    assert result["claims"]["all"]["names_per_instant"] == 8.0
    assert result["claims"]["share"]["won_per_instant"] == 4.0
    assert result["claims"]["rest"]["count"] == 4
    assert result["server"]["xact_per_s"] == 2.0
    assert result["server"]["cpu_pct"] == 0.5
    # 0.6 s of the server's CPU for 8 rounds claimed: 75 ms per 1,000.
    assert result["server"]["cpu_ms_per_1000_claimed"] == 75_000.0
    # Six whole-table reads of 4 rows in two minutes; two instants.
    assert result["server"]["lease_rows_read"] == [12, 5]
    assert result["server"]["lease_rows_read_per_instant"]["seq_scans_per_minute"] == 3.0


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        (
            "UPDATE cronjob_lease SET prev_instant=cronjob_lease.instant, instant=%(claim_epoch)s",
            "claim",
        ),
        (
            "WITH locked AS MATERIALIZED (SELECT cronjob_lease.name AS name FROM cronjob_lease "
            "WHERE x ORDER BY name FOR UPDATE) UPDATE cronjob_lease SET expires_ms=(now + 1) "
            "FROM locked WHERE cronjob_lease.name = locked.name",
            "renew",
        ),
        (
            "WITH locked AS MATERIALIZED (SELECT cronjob_lease.name FROM cronjob_lease) "
            "UPDATE cronjob_lease SET state=%(state)s, expires_ms=NULL, skipped_through=1",
            "finish",
        ),
        ("UPDATE cronjob_lease SET state=%(state)s, expires_ms=NULL WHERE name = 1", "finish"),
        ("INSERT INTO cronjob_round (name, instant) SELECT anon_1.name", "finish"),
        ("SELECT cronjob_lease.holder, max(cronjob_lease.instant) FROM cronjob_lease", "check"),
        (
            "WITH seen AS (INSERT INTO cronjob_replica (holder) VALUES (1)) SELECT a FROM "
            "cronjob_lease WHERE x",
            "check",
        ),
        ("/* trace */ SELECT cronjob_trigger.id FROM cronjob_trigger", "check"),
        ("INSERT INTO cronjob_lease (name, instant) VALUES (%(name)s, 0)", "other"),
        ("SELECT pg_advisory_lock(%(key)s)", "other"),
    ],
)
def test_statement_kinds(statement: str, expected: str) -> None:
    assert kind(statement) == expected


def test_parameter_bytes_count_the_text_sent() -> None:
    names = '["job-000001", "job-000002"]'
    assert param_bytes({"claim_names": names, "claim_epoch": 1_800_000_000, "x": None}) == (
        len(names) + 10
    )
    assert param_bytes([{"a": "é"}, {"a": b"xy"}]) == 4


def test_the_names_a_claim_lists_are_counted_in_each_of_its_forms() -> None:
    listed = '["job-1", "job-2", "job-3"]'
    assert _listed_names({"claim_names": listed, "claim_epoch": 1}) == 3
    assert _listed_names({"claim_names": "[]"}) == 0
    # Revision 0006: the names are the keys of each one's next instant.
    assert _listed_names({"claim_due": '{"job-1": 60, "job-2": null}', "claim_epoch": 1}) == 2
    assert _listed_names({"claim_names_1": "a", "claim_names_2": "b", "claim_epoch": 1}) == 2
