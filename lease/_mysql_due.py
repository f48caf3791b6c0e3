"""MariaDB/MySQL: a claim's ``due_s`` write, and the claim's retry after a deadlock.

A claim there is two statements in one transaction: the claim's single-table UPDATE,
then this UPDATE of the claimed rows' next instants (a multi-table UPDATE does not
promise to assign left to right, which the claim's copies into ``prev_*`` rely on).

**Only the claim's own rows.** The due write joins the lease table with a JSON table of
``[name, epoch seconds]`` pairs. Filtered by the claim's token alone, InnoDB read the
whole lease table for it (a scan: the pairs' table has no index to drive the join), and
a multi-table UPDATE takes a lock on each row it reads, even under READ COMMITTED, and
waits for it: the due write of one replica waited for rows another replica's claim held
while that claim waited for a row the first had claimed, and one of the two died in a
deadlock (error 1213). Replicas that claim different names at one instant do that: the
shares of an instant, and during a rolling deploy the previous release beside this one
(its replicas never claim a schedule's row, this release's do). So the write names its
rows (``name IN (...)``, a range of the primary key): it locks nothing it did not claim.

**The retry.** A replica of release 0007 (and every release since the due column, 0006)
still writes its due with the scan, and so still waits for rows of this release's claim.
When both wait on each other, InnoDB rolls one of the transactions back whole, at once;
the claim of this release that was rolled back runs again (`DEADLOCK_RETRIES` times at
most), so this release loses no instant to it: the other transaction has been allowed
to go on, and the claim finds its rows free or taken. (The previous release, when its own
claim is the one rolled back, logs an outage and catches up, as it does on any failed
claim.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

__all__ = ["DEADLOCK_RETRIES", "is_deadlock", "write_due"]

#: How many times a claim rolled back by a deadlock is run again before its error is
#: raised (MariaDB/MySQL).
DEADLOCK_RETRIES: Final = 3
#: MariaDB/MySQL's ER_LOCK_DEADLOCK: the transaction was rolled back whole.
_ER_LOCK_DEADLOCK: Final = 1213

_DUE: Final = sa.text(
    "UPDATE cronjob_lease JOIN JSON_TABLE(:claim_due, '$[*]' COLUMNS ("
    "due_name VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', "
    "due_at BIGINT PATH '$[1]')) AS due ON cronjob_lease.name = due.due_name "
    "SET cronjob_lease.due_s = due.due_at "
    "WHERE cronjob_lease.name IN :due_names AND cronjob_lease.token = :claim_token"
).bindparams(sa.bindparam("due_names", expanding=True))


def write_due(conn: Connection, claimed: Sequence[Any], due: Mapping[str, int], token: int) -> None:
    """Write, in ``conn``'s transaction, the ``due_s`` of the rows ``claimed`` (rows whose
    first column is the name) under ``token``, from ``due`` (name -> epoch seconds; a name
    it leaves out keeps its row's value). One statement, locking only those rows."""
    pairs = [[row[0], due[row[0]]] for row in claimed if due.get(row[0]) is not None]
    if pairs:
        conn.execute(
            _DUE,
            {
                "claim_due": json.dumps(pairs),
                "due_names": [name for name, _ in pairs],
                "claim_token": token,
            },
        )


def is_deadlock(error: BaseException | None) -> bool:
    """Whether ``error`` (a `translate_errors` error's cause) is MariaDB/MySQL's
    deadlock: the server rolled the whole transaction back, and it may run again."""
    if not isinstance(error, sa.exc.DBAPIError):
        return False
    args: tuple[Any, ...] = getattr(error.orig, "args", ())
    return bool(args) and args[0] == _ER_LOCK_DEADLOCK
