"""Where a round's scheduler CPU goes: J jobs ``@every 10s`` in this process, profiled.

Run: ``python -m benchmarks.profile_handoff [--jobs 10000] [--instants 3] [--profile]
[--no-freeze] [--log FILE]``.

One :class:`cronjob.Scheduler` on the system clock, on a fresh PostgreSQL schema of the
benchmark server (``$CRONJOB_BENCH_POSTGRES_URL``, default ``postgres@127.0.0.1:5432``,
database ``test``), or with ``--server mysql+pymysql://...`` a fresh database on that
MariaDB/MySQL server, logging as ``cronjob run`` does (to ``/dev/null``). Jobs do nothing.
After a warm-up instant, it counts the process's CPU (``time.process_time``, every
thread) over ``--instants`` whole instants and divides by the rounds run: the scheduler's
CPU per round, from claim to end recorded. ``--profile`` runs every thread under
:mod:`cProfile` on each thread's CPU clock (slower: the figure is then only for where
the time goes, not for its size) and prints the top functions by their own time. The
objects start-up built are frozen out of the garbage collector, as ``cronjob run`` does
(``--no-freeze``: left to it). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import logging
import os
import pstats
import threading
import time
import uuid
from typing import Any

import sqlalchemy as sa

import cronjob
import execctx
from benchmarks._rounds import RoundCounter
from cronjob._logging import RoundFormatter
from cronjob.admin._run import freeze_start_up

SERVER = os.environ.get(
    "CRONJOB_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432"
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--instants", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--workers", type=int, default=None, help="max_workers (default 64)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--dump", help="also write the merged profile to this file (pstats)")
    parser.add_argument(
        "--sort", default="tottime", help="pstats sort key: tottime, ncalls, cumtime ..."
    )
    parser.add_argument("--log", default=os.devnull, help="where the log goes (default nowhere)")
    parser.add_argument(
        "--no-freeze", action="store_true", help="leave start-up's objects to the collector"
    )
    parser.add_argument(
        "--threads", action="store_true", help="also the CPU per round of each kind of thread"
    )
    parser.add_argument(
        "--server",
        default=SERVER,
        help="the server's URL, without a database (default $CRONJOB_BENCH_POSTGRES_URL's)",
    )
    args = parser.parse_args(argv)

    schema = f"handoff_{uuid.uuid4().hex[:8]}"
    server = sa.make_url(args.server)
    mariadb = server.get_backend_name() in ("mysql", "mariadb")
    admin = sa.create_engine(server.set(database="test"))
    with admin.begin() as conn:
        if mariadb:  # a database of its own: MariaDB's schemas are databases
            conn.execute(sa.text(f"CREATE DATABASE `{schema}` CHARACTER SET utf8mb4"))
        else:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    if mariadb:
        url = server.set(database=schema).render_as_string(hide_password=False)
    else:
        url = f"{args.server}/test?options=-csearch_path%3D{schema}"

    handler = logging.StreamHandler(open(args.log, "w"))  # noqa: SIM115 - lives with the run
    handler.setFormatter(RoundFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    execctx.install_log_filter(handler)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(os.environ.get("CRONJOB_LOG_LEVEL", "INFO").upper())

    counter = RoundCounter()
    job = counter.job
    registry = cronjob.Registry()
    for i in range(args.jobs):
        registry.register(job, "@every 10s", f"job-{i:05d}")

    profiles: list[cProfile.Profile] = []
    if args.profile:
        original = threading.Thread.run

        def profiled(self: threading.Thread) -> None:
            # Each thread's own CPU time, not wall time: waiting for a lock costs nothing.
            profile = cProfile.Profile(time.thread_time)
            profiles.append(profile)
            profile.runcall(original, self)

        threading.Thread.run = profiled  # type: ignore[method-assign]

    try:
        options: dict[str, Any] = {} if args.workers is None else {"max_workers": args.workers}
        if not args.no_freeze:
            gc.collect()  # as `cronjob run` does, before the scheduler's threads start
        with cronjob.Scheduler(url, registry=registry, replica_id="profile", **options):
            if not args.no_freeze:
                freeze_start_up()
            # Warm up through one instant, then measure whole instants.
            time.sleep(10 - time.time() % 10 + 10 + 1)
            start_cpu, start_rounds = time.process_time(), counter.rounds
            start_threads = _thread_cpu() if args.threads else {}
            time.sleep(10 * args.instants)
            cpu, run = time.process_time() - start_cpu, counter.rounds - start_rounds
            threads = _thread_cpu() if args.threads else {}
            if profiles:
                for profile in profiles:
                    profile.disable()
    finally:
        with admin.begin() as conn:
            if mariadb:
                conn.execute(sa.text(f"DROP DATABASE `{schema}`"))
            else:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    result = {
        "jobs": args.jobs,
        "rounds": run,
        "cpu_s": round(cpu, 3),
        "us_per_round": round(cpu / run * 1e6, 1) if run else None,
        "load": os.getloadavg(),
        "server": server.get_backend_name(),
        "profiled": args.profile,
    }
    if args.threads and run:
        result["threads_us_per_round"] = {
            kind: round((seconds - start_threads.get(kind, 0.0)) / run * 1e6, 1)
            for kind, seconds in sorted(threads.items())
        }
    print(result)
    if profiles:
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        if args.dump:
            stats.dump_stats(args.dump)
        stats.sort_stats(args.sort).print_stats(args.top)
    return result


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's live threads, summed by kind: the
    thread's name without its number (``cronjob-round-17`` is a ``cronjob-round``)."""
    tick = os.sysconf("SC_CLK_TCK")
    by_kind: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        kind = thread.name.rstrip("0123456789").rstrip("-")
        by_kind[kind] = by_kind.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return by_kind


if __name__ == "__main__":
    main()
