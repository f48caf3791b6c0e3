"""``cronjob stream-worker MODULE... --redis URL --stream S --group G``: a worker process.

The modules are imported first: they register the handlers (`handler`) and, as the
replicas do, the jobs whose names the worker checks entries against. The process then
runs a [Worker][cronjob.contrib.streams.Worker] until SIGTERM or SIGINT, drains and exits
0; a module that cannot be imported exits 2 after one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ._worker import CLAIM_IDLE, Worker

__all__ = ["run_stream_worker"]


def run_stream_worker(args: argparse.Namespace) -> int:
    """Run the ``stream-worker`` command parsed into ``args``; its exit status."""
    sys.path.insert(0, ".")
    for module in args.modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            print(
                f"cronjob: error: cannot import module {module!r}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    worker = Worker(
        args.redis,
        stream=args.stream,
        group=args.group,
        database=args.database_url,
        consumer=args.consumer,
        claim_idle=args.claim_idle if args.claim_idle is not None else CLAIM_IDLE,
    )
    worker.run()
    return 0
