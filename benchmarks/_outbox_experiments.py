"""Experiments of `bench_outbox` (``--experiment``): what a change of the library would
gain, tried from the benchmark alone. Not the library's behaviour; never used elsewhere.

- ``no-ping``: the engine without ``pool_pre_ping`` (one ``SELECT 1`` round trip fewer
  per checkout; a round checks out twice).
- ``batch-marks``: the mark of a sent occurrence (``cronjob.contrib._handoff.mark``,
  a transaction of its own per round) is replaced by a queue that one thread empties in
  one transaction and one ``UPDATE ... WHERE id IN (...)`` for every mark waiting, as the
  finisher batches the ends of rounds; the round's thread is free once the broker
  accepted its message. A crash before the batch leaves rows unsent for the sweep (the
  same as a crash between send and mark today).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from cronjob.contrib import _handoff
from lease._schema import outbox_table

EXPERIMENTS = ("no-ping", "batch-marks")


def engine_options(experiments: list[str]) -> dict[str, Any]:
    """The engine options the experiments change."""
    return {"pool_pre_ping": False} if "no-ping" in experiments else {}


@contextlib.contextmanager
def batched_marks(experiments: list[str]) -> Iterator[None]:
    """Within the block, with ``batch-marks``, marks go through one batching thread."""
    if "batch-marks" not in experiments:
        yield
        return
    pending: queue.SimpleQueue[tuple[sa.Engine, str, int] | None] = queue.SimpleQueue()

    def mark(engine: sa.Engine, id: str, now_ms: int) -> None:
        pending.put((engine, id, now_ms))

    def serve() -> None:
        while True:
            first = pending.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    item = pending.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    pending.put(None)
                    break
                batch.append(item)
            engine, now_ms = batch[0][0], max(m for _, _, m in batch)
            ids = [i for _, i, _ in batch]
            with engine.begin() as conn:
                for start in range(0, len(ids), 500):
                    conn.execute(
                        outbox_table.update()
                        .where(
                            outbox_table.c.id.in_(ids[start : start + 500]),
                            outbox_table.c.sent_ms.is_(None),
                        )
                        .values(sent_ms=now_ms, error=None)
                    )

    original = _handoff.mark
    thread = threading.Thread(target=serve, name="bench-marker", daemon=True)
    thread.start()
    _handoff.mark = mark
    try:
        yield
    finally:
        _handoff.mark = original
        pending.put(None)
        thread.join(10)
