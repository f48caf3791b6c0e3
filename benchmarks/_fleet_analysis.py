"""The fleet benchmark's accounting of one run (``bench_fleet``): which (job, instant) pairs
ran, twice, or not at all, how late, and what the replicas sent to the database to get
there. Pure functions over what the replicas reported; no database, no processes.

A replica's report (:mod:`benchmarks.workers._record`, with the ``fleet`` part of
:mod:`benchmarks.workers._statements`) holds ``rounds`` as ``[name, instant, start]``
(epoch seconds), ``fleet.kinds`` as ``[second, kind, count, bytes]`` and ``fleet.claims``
as ``[instant, sent, seconds, names listed, rows won, bytes]``.

Only what lies in the window ``[start, end)`` counts: rounds by their instant, statements
by the second they were sent, claims by their instant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks._mix import Job, due_in
from benchmarks.workers._statements import KINDS

__all__ = ["analyse", "claims_by_turn", "percentile", "rounds_outcome"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0-1) of ``values`` by the nearest-rank method; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max of ``values`` (seconds) in milliseconds."""

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 1)

    return {
        "p50": ms(percentile(values, 0.50)),
        "p99": ms(percentile(values, 0.99)),
        "max": ms(max(values) if values else None),
    }


def rounds_outcome(
    reports: Sequence[dict[str, Any]], jobs: Iterable[Job], start: int, end: int
) -> dict[str, Any]:
    """The rounds of the window against the instants due in it.

    *expected*: every (job, instant) due in ``[start, end)``; *run*: those started at
    least once; *duplicates*: starts beyond the first of a pair (an instant run twice);
    *missed*: expected pairs no replica started; *unexpected*: pairs started that were
    not due (a round at an instant its spec does not have). Lateness is each start
    minus its instant, over every round of the window (duplicates too).
    """
    expected: set[tuple[str, int]] = set()
    instants: dict[int, int] = {}
    for job in jobs:
        for instant in due_in(job, start, end):
            expected.add((job.name, instant))
            instants[instant] = instants.get(instant, 0) + 1
    seen: dict[tuple[str, int], int] = {}
    lateness: list[float] = []
    per_replica: list[int] = []
    # The latest start of each instant: when its last round started.
    last_start: dict[int, float] = {}
    for report in reports:
        own = 0
        for name, instant, started in report.get("rounds", []):
            if instant != instant:  # NaN: a round without an instant
                continue
            whole = round(instant)
            if not start <= whole < end:
                continue
            own += 1
            seen[(name, whole)] = seen.get((name, whole), 0) + 1
            lateness.append(started - instant)
            last_start[whole] = max(last_start.get(whole, started), started)
        per_replica.append(own)
    return {
        "instants": len(instants),
        "due_per_instant_max": max(instants.values(), default=0),
        "expected": len(expected),
        "rounds_run": sum(1 for pair in seen if pair in expected),
        "rounds_per_replica": per_replica,
        "duplicates": sum(count - 1 for count in seen.values()),
        "missed": len(expected - seen.keys()),
        "unexpected": len(seen.keys() - expected),
        "lateness_ms": _ms(lateness),
        # Per instant: from the instant to the start of its last round.
        "instant_done_ms": _ms([last_start[i] - i for i in last_start]),
    }


def claims_by_turn(claims: Sequence[Sequence[float]]) -> dict[str, list[Sequence[float]]]:
    """One replica's claims, split by turn within their instant: the first claim a
    replica sends for an instant is its ``share`` (or the whole instant, when too small
    to share); any later one of the same instant is ``rest`` (the others' shares after
    the grace, and jobs of its share it did not win ahead). Claims without an instant
    (second runs) are left out."""
    by_instant: dict[int, list[Sequence[float]]] = {}
    for claim in claims:
        instant = claim[0]
        if instant != instant:
            continue
        by_instant.setdefault(int(instant), []).append(claim)
    turns: dict[str, list[Sequence[float]]] = {"share": [], "rest": []}
    for of_instant in by_instant.values():
        of_instant.sort(key=lambda claim: claim[1])
        turns["share"].append(of_instant[0])
        turns["rest"].extend(of_instant[1:])
    return turns


def _claims(
    reports: Sequence[dict[str, Any]], start: int, end: int, instants: int
) -> dict[str, Any]:
    """The claims of the window's instants: how long each took, how many names each
    listed and won, and their bytes, per turn (see :func:`claims_by_turn`)."""
    result: dict[str, Any] = {}
    every: list[Sequence[float]] = []
    turns: dict[str, list[Sequence[float]]] = {"share": [], "rest": []}
    for report in reports:
        claims = [c for c in report.get("fleet", {}).get("claims", []) if start <= c[0] < end]
        for turn, chosen in claims_by_turn(claims).items():
            turns[turn].extend(chosen)
            every.extend(chosen)
    per = max(1, instants)
    for turn, chosen in (("all", every), *turns.items()):
        result[turn] = {
            "count": len(chosen),
            "seconds": _ms([c[2] for c in chosen]),
            "names_per_instant": round(sum(c[3] for c in chosen) / per, 1),
            "won_per_instant": round(sum(max(0, c[4]) for c in chosen) / per, 1),
            "kb_per_instant": round(sum(c[5] for c in chosen) / per / 1024, 2),
        }
    return result


def _statements(
    reports: Sequence[dict[str, Any]], start: int, end: int, instants: int
) -> dict[str, Any]:
    """Statements sent in the window, by kind: per second (all replicas), per replica
    and instant, and their parameters' kilobytes per instant (all replicas)."""
    counts = dict.fromkeys(KINDS, 0)
    sizes = dict.fromkeys(KINDS, 0)
    for report in reports:
        for second, what, n, size in report.get("fleet", {}).get("kinds", []):
            if start <= second < end:
                counts[what] = counts.get(what, 0) + n
                sizes[what] = sizes.get(what, 0) + size
    seconds = max(1, end - start)
    replica_instants = max(1, instants) * max(1, len(reports))
    total = sum(counts.values())
    return {
        "total": total,
        "per_s": round(total / seconds, 1),
        "per_s_by_kind": {k: round(n / seconds, 2) for k, n in counts.items()},
        "per_replica_instant": round(total / replica_instants, 2),
        "per_replica_instant_by_kind": {
            k: round(n / replica_instants, 3) for k, n in counts.items()
        },
        "kb_per_instant_by_kind": {
            k: round(size / max(1, instants) / 1024, 2) for k, size in sizes.items()
        },
    }


def analyse(
    reports: Sequence[dict[str, Any]],
    jobs: Sequence[Job],
    *,
    start: int,
    end: int,
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything counted of one run's window ``[start, end)``.

    ``server``: what was read off the database server over the window, if anything:
    ``xact_commit`` (and the other ``pg_stat_database`` deltas) and ``cpu_s`` (its
    processes' CPU seconds); each is turned into a rate or a cost per row claimed.
    """
    outcome = rounds_outcome(reports, jobs, start, end)
    instants = outcome["instants"]
    result = {
        **outcome,
        "statements": _statements(reports, start, end, instants),
        "claims": _claims(reports, start, end, instants),
    }
    seconds = max(1, end - start)
    if server:
        deltas = server.get("counters") or {}
        claimed = outcome["rounds_run"] + outcome["duplicates"]
        cpu = server.get("cpu_s")
        result["server"] = {
            "xact_per_s": round(deltas["xact_commit"] / seconds, 1)
            if "xact_commit" in deltas
            else None,
            "tup_fetched_per_instant": round(deltas["tup_fetched"] / max(1, instants))
            if "tup_fetched" in deltas
            else None,
            "tup_returned_per_instant": round(deltas["tup_returned"] / max(1, instants))
            if "tup_returned" in deltas
            else None,
            "cpu_s": cpu,
            "cpu_pct": None if cpu is None else round(cpu / seconds * 100, 1),
            "cpu_ms_per_1000_claimed": round(cpu * 1000 / claimed * 1000, 1)
            if cpu is not None and claimed
            else None,
            "counters": deltas,
        }
        table = server.get("lease_table") or {}
        if table:
            # Rows of the lease table read per instant: whole-table reads, index probes.
            result["server"]["lease_rows_read_per_instant"] = {
                "seq": round(table.get("seq_tup_read", 0) / max(1, instants)),
                "index": round(table.get("idx_tup_fetch", 0) / max(1, instants)),
                "seq_scans_per_minute": round(table.get("seq_scan", 0) * 60 / seconds, 1),
            }
            reads = result["server"]["lease_rows_read_per_instant"]
            result["server"]["lease_rows_read"] = [reads["seq"], reads["index"]]
            result["server"]["lease_table"] = table
    return result
