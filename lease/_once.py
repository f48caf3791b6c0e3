"""The once-table (revision 0010): bodies run once per id.

``cronjob_once`` holds one row per id whose body ran or runs: an insert-if-new starts it
(`begin_once`), its end marks it done (`finish_once`) or deletes it (`release_once`, the
body failed: a redelivery runs it again). A row still running past a stale time may be
taken over by a redelivery (the worker that ran it died). Every time is epoch
milliseconds given by the caller; `begin_once` takes an `Engine` (an insert-if-new needs
a transaction of its own), the others the caller's `Connection`.
"""

from __future__ import annotations

import secrets
from typing import Final

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from ._exceptions import translate_errors
from ._schema import once_table

__all__ = ["ONCE_DONE", "ONCE_RUNNING", "begin_once", "finish_once", "release_once"]

#: ``cronjob_once.state`` of a body that runs (or whose worker died running it).
ONCE_RUNNING: Final = "running"
#: ``cronjob_once.state`` of a body that ran to its end: never run again.
ONCE_DONE: Final = "done"

_n = once_table


def begin_once(
    engine: Engine,
    id: str,
    *,
    task: str,
    holder: str,
    now_ms: int,
    stale_ms: int,
) -> tuple[int | None, str]:
    """Start the body of ``id``, unless it ran or runs: an insert-if-new, in a transaction
    of its own.

    A row that has been running since ``now_ms - stale_ms`` or before (its worker died,
    or runs still far longer than it should) is taken over: its token changes, so the
    first worker's end changes nothing.

    Returns:
        A token to end the body with (`finish_once`, `release_once`) and `ONCE_RUNNING`;
        or ``None`` and the state found: `ONCE_DONE` (it ran), `ONCE_RUNNING` (it runs
        elsewhere, not stale yet).
    """
    token = secrets.randbits(63)
    row = {
        "id": id,
        "task": task,
        "state": ONCE_RUNNING,
        "token": token,
        "holder": holder,
        "started_ms": now_ms,
        "ended_ms": None,
    }
    with translate_errors("begin a body run once"):
        try:
            with engine.begin() as conn:
                conn.execute(_n.insert().values(row))
            return token, ONCE_RUNNING
        except sa.exc.IntegrityError:
            pass  # on record: done, running, or stale
        with engine.begin() as conn:
            found = conn.execute(
                sa.select(_n.c.state, _n.c.token, _n.c.started_ms).where(_n.c.id == id)
            ).first()
            if found is None:  # released meanwhile (its body failed): run it
                conn.execute(_n.insert().values(row))
                return token, ONCE_RUNNING
            state, old, started_ms = found
            if state != ONCE_RUNNING or started_ms > now_ms - stale_ms:
                return None, str(state)
            taken = conn.execute(
                _n.update()
                .where(_n.c.id == id, _n.c.token == old, _n.c.state == ONCE_RUNNING)
                .values(token=token, holder=holder, started_ms=now_ms)
            )
            return (token, ONCE_RUNNING) if taken.rowcount == 1 else (None, ONCE_RUNNING)


def finish_once(conn: Connection, id: str, token: int, *, now_ms: int) -> bool:
    """Mark the body of ``id`` done; ``False`` if ``token`` no longer holds it (taken
    over as stale)."""
    with translate_errors("finish a body run once"):
        done = conn.execute(
            _n.update()
            .where(_n.c.id == id, _n.c.token == token, _n.c.state == ONCE_RUNNING)
            .values(state=ONCE_DONE, ended_ms=now_ms)
        )
    return done.rowcount == 1


def release_once(conn: Connection, id: str, token: int) -> bool:
    """Forget the body of ``id`` (it failed), so that a redelivery runs it again;
    ``False`` if ``token`` no longer holds it."""
    with translate_errors("release a body run once"):
        done = conn.execute(
            _n.delete().where(_n.c.id == id, _n.c.token == token, _n.c.state == ONCE_RUNNING)
        )
    return done.rowcount == 1
