"""Plain-text tables for the scenarios' results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.0f}"
    if isinstance(value, list):
        return "/".join(_cell(v) for v in value)
    return str(value)


def render(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """``columns`` are (header, key) pairs; a key ``a.b`` reads ``row['a']['b']``."""

    def get(row: dict[str, Any], key: str) -> Any:
        value: Any = row
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    table = [[header for header, _ in columns]]
    table += [[_cell(get(row, key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = [
        "  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


LATENESS_COLUMNS = [
    ("scheduler", "implementation"),
    ("R", "replicas"),
    ("J", "jobs"),
    ("expected", "expected"),
    ("run", "rounds_run"),
    ("dup", "duplicates"),
    ("missed", "missed"),
    ("p50 ms", "lateness_ms.p50"),
    ("p95 ms", "lateness_ms.p95"),
    ("p99 ms", "lateness_ms.p99"),
    ("max ms", "lateness_ms.max"),
    ("CPU s", "cpu_s"),
    ("stmts/round", "statements_per_round"),
    ("checkouts/round", "pool_checkouts_per_round"),
    ("RSS MB", "rss_max_mb"),
    ("rounds/replica/instant", "rounds_per_instant"),
    ("share % of fair (min/max)", "share_pct"),
    ("instants shared", "instants_shared"),
    ("instants 80-120 %", "instants_fair"),
    ("load", "loadavg.end"),
    ("error", "error"),
]

SCALE_COLUMNS = [
    ("scheduler", "implementation"),
    ("R", "replicas"),
    ("J", "jobs"),
    ("killed at s", "killed_at_s"),
    ("expected", "expected"),
    ("run", "rounds_run"),
    ("dup", "duplicates"),
    ("missed", "missed"),
    ("p50 ms", "lateness_ms.p50"),
    ("p99 ms", "lateness_ms.p99"),
    ("max ms", "lateness_ms.max"),
    ("CPU s", "cpu_s"),
    ("CPU µs/round", "cpu_us_per_round"),
    ("stmts/round", "statements_per_round"),
    ("RSS MB", "rss_max_mb"),
    ("rounds/replica/instant", "rounds_per_instant"),
    ("missed before/at/after kill", "kill.missed"),
    ("rounds/replica/instant before kill", "kill.rounds_per_instant_before"),
    ("after kill", "kill.rounds_per_instant_after"),
    ("load", "loadavg.end"),
    ("error", "error"),
]
