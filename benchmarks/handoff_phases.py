"""Where a hand-off round's latency goes: J hand-off jobs every second in this process,
each round's phases timed from its instant.

Run: ``python -m benchmarks.handoff_phases [--jobs 17] [--seconds 20] [--max-workers 64]
[--database-url postgresql+psycopg://postgres@127.0.0.1:5432/test]``.

One :class:`cronjob.Scheduler` on the system clock, on a fresh PostgreSQL schema, with
``--jobs`` jobs ``* * * * * *`` (on ``--max-workers`` round threads, the scheduler's
default unless given) whose function is ``handoff`` of a publisher that accepts
at once (no broker: what is left is the scheduler's and the database's time). After 3 s
of warm-up it notes, for ``--seconds``, when each round started, when its occurrence was
recorded (the fenced transaction committed), when it was sent, and when the round ended,
each in milliseconds after the round's instant, and prints p50 / p90 / p99 of each. The
phases are timed by wrapping `cronjob.contrib.Handoff`'s methods in this process. Not a
test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import cronjob
from cronjob.contrib import Handoff, Occurrence, handoff
from cronjob.engine._options import DEFAULT_MAX_WORKERS

PHASES = ("started", "recorded", "sent", "ended")


class Phases:
    """Milliseconds after each round's instant, by phase."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_phase: dict[str, list[float]] = {phase: [] for phase in PHASES}

    def note(self, phase: str, instant: float) -> None:
        with self._lock:
            self.by_phase[phase].append((time.time() - instant) * 1000)

    def clear(self) -> None:
        with self._lock:
            for values in self.by_phase.values():
                values.clear()


class Accepting:
    """A publisher that accepts every occurrence at once."""

    target = "test"

    def __init__(self, phases: Phases) -> None:
        self.phases = phases

    def describe(self) -> dict[str, object]:
        return {}

    def publish(self, occurrence: Occurrence) -> None:
        self.phases.note("sent", occurrence.instant.timestamp())


def timed(phases: Phases) -> None:
    """Wrap `Handoff.__call__` (started, ended) and `Handoff._publish` (recorded)."""
    call: Callable[..., Any] = Handoff.__call__
    publish: Callable[..., Any] = Handoff._publish

    def round_(self: Handoff, ctx: cronjob.Round) -> None:
        phases.note("started", ctx.instant.timestamp())
        try:
            call(self, ctx)
        finally:
            phases.note("ended", ctx.instant.timestamp())

    def publish_(self: Handoff, ctx: cronjob.Round, *args: Any, **kwargs: Any) -> None:
        phases.note("recorded", ctx.instant.timestamp())
        publish(self, ctx, *args, **kwargs)

    Handoff.__call__ = round_  # type: ignore[method-assign]
    Handoff._publish = publish_  # type: ignore[method-assign]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=17)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--max-workers", type=int, default=DEFAULT_MAX_WORKERS)
    parser.add_argument(
        "--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    args = parser.parse_args()
    phases = Phases()
    timed(phases)
    schema = f"phases_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(args.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    url = sa.make_url(args.database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        registry = cronjob.Registry()
        for n in range(args.jobs):
            registry.register(handoff(Accepting(phases)), "* * * * * *", f"phases-{n}")
        scheduler = cronjob.Scheduler(
            url.render_as_string(hide_password=False),
            registry=registry,
            replica_id="phases",
            max_workers=args.max_workers,
        )
        scheduler.start()
        try:
            time.sleep(3)
            phases.clear()
            time.sleep(args.seconds)
        finally:
            scheduler.stop()
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()
    print(
        f"{args.jobs} hand-off jobs every second on {args.max_workers} round threads, "
        f"{args.seconds:g} s, ms after the instant:"
    )
    for phase in PHASES:
        values = phases.by_phase[phase]
        print(
            f"{phase:9s} n={len(values):6d}  p50={quantile(values, 0.5):8.1f}"
            f"  p90={quantile(values, 0.9):8.1f}  p99={quantile(values, 0.99):8.1f}"
        )


if __name__ == "__main__":
    main()
