"""What the history and the outbox say of the instants of a span of time, for every name
at once: the reads behind the missed-instants count of ``cronjob status`` (see
``cronjob.admin._missed``).

Two reads of the history, each one statement whatever the number of names, both on the
index of ``ended_ms`` (a round of an instant ends after it, so the rounds of the instants
after ``since_ms`` all ended after it):

- `Tally.on_record`: per name, how many distinct instants after ``since_ms`` have a
  round on record that a schedule ran (manual rounds and the pause notes left out). A
  name whose count is its schedule's count of instants missed none: no further read.
- `Tally.spans`: for a few names (those that fall short), each round and note that
  ended after ``since_ms``: its instant, why, and when it ran, so that the instants a
  round overran, or a pause covered, are told from those that nothing accounted for.

Two reads of the outbox (``cronjob_outbox``), for the jobs that hand their instants to a
task queue (a hand-off: each of its instants is accounted for by its outbox row, and an
overrun accounts for none), on the index of ``sent_ms``: a row of an instant after
``since_ms`` was sent after it (less `SENT_SLACK_MS` of clock skew) or is not sent.

- `Tally.recorded`: per name with such rows (the hand-offs), how many distinct whole
  instants after ``since_ms`` have one. One statement.
- `Tally.recorded_instants`: for a few names (those that fall short), those instants.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa

from ._core import _IN_LIST_LIMIT
from ._exceptions import translate_errors
from ._notes import ACK_NOTE, SKIP_NOTE
from ._schema import outbox_table, round_table
from ._store import LeaseStore

__all__ = ["NOT_SCHEDULED", "RoundSpan", "Tally"]

_h = round_table
_o = outbox_table

#: How far before ``since_ms`` (epoch ms) the outbox reads look for rows sent: a row is
#: sent after its instant, on its sender's clock, which may run behind the reader's.
SENT_SLACK_MS: Final = 3_600_000

#: The ``why`` of history rows that are not a scheduled instant's round: a manual round
#: (its instant is its request's moment), the pause and resume notes, and the notes of
#: instants a catch-up policy skipped and of missed instants acknowledged.
NOT_SCHEDULED: Final = ("manual", "pause", "resume", SKIP_NOTE, ACK_NOTE)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundSpan:
    """One row of the history, as the tally reads it (epoch seconds and milliseconds)."""

    name: str
    instant_s: int
    why: str
    started_ms: int
    ended_ms: int


class Tally:
    """The tally's reads, on ``store``'s engine."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def on_record(self, *, since_ms: int) -> dict[str, int]:
        """Per name, the count of distinct instants after ``since_ms`` (epoch ms) with a
        round on record that a schedule ran (any outcome: given up, missed deadline and
        timed out count too). One statement."""
        since_s = since_ms // 1000
        stmt = (
            sa.select(_h.c.name, sa.func.count(sa.distinct(_h.c.instant)))
            .where(
                _h.c.ended_ms >= since_ms,
                _h.c.instant > since_s,
                _h.c.why.not_in(NOT_SCHEDULED),
            )
            .group_by(_h.c.name)
        )
        with (
            translate_errors("count the history's instants"),
            self._store._transaction(read=True) as conn,
        ):
            return {name: int(count) for name, count in conn.execute(stmt)}

    def spans(self, names: Collection[str], *, since_ms: int) -> dict[str, list[RoundSpan]]:
        """Each row of the history of ``names`` that ended at or after ``since_ms``,
        rounds and notes alike, by name, oldest end first. One statement per
        `_IN_LIST_LIMIT` names."""
        wanted = sorted(names)
        found: dict[str, list[RoundSpan]] = {name: [] for name in wanted}
        columns = (_h.c.name, _h.c.instant, _h.c.why, _h.c.started_ms, _h.c.ended_ms)
        with (
            translate_errors("read the history's spans"),
            self._store._transaction(read=True) as conn,
        ):
            for at in range(0, len(wanted), _IN_LIST_LIMIT):
                chunk = wanted[at : at + _IN_LIST_LIMIT]
                stmt = (
                    sa.select(*columns)
                    .where(_h.c.ended_ms >= since_ms, _h.c.name.in_(chunk))
                    .order_by(_h.c.ended_ms, _h.c.id)
                )
                for name, instant, why, started, ended in conn.execute(stmt):
                    found[name].append(
                        RoundSpan(
                            name=name,
                            instant_s=int(instant),
                            why=why,
                            started_ms=int(started),
                            ended_ms=int(ended),
                        )
                    )
        return found

    def recorded(self, *, since_ms: int) -> dict[str, int]:
        """Per name with rows in the outbox sent since ``since_ms`` (epoch ms, less
        `SENT_SLACK_MS`) or not sent (unsent or resolved obsolete) — the names that hand
        their instants to a task queue —, the count of distinct instants after
        ``since_ms`` on whole seconds that have a row (sent, unsent or obsolete; a manual
        round's, whose instant is the moment it was asked for, to the millisecond, left
        out); ``0`` for a name whose rows are all older. One statement."""
        whole = sa.and_(_o.c.instant_ms > since_ms, _o.c.instant_ms % 1000 == 0)
        counted = sa.func.count(sa.distinct(sa.case((whole, _o.c.instant_ms))))
        stmt = sa.select(_o.c.name, counted).where(self._recent(since_ms)).group_by(_o.c.name)
        with (
            translate_errors("count the outbox's instants"),
            self._store._transaction(read=True) as conn,
        ):
            return {name: int(count) for name, count in conn.execute(stmt)}

    def recorded_instants(self, names: Collection[str], *, since_ms: int) -> dict[str, set[int]]:
        """Per name of ``names``, the instants after ``since_ms`` (epoch ms) that have a
        row in the outbox (sent, unsent or obsolete), in epoch milliseconds. One
        statement per `_IN_LIST_LIMIT` names."""
        wanted = sorted(names)
        found: dict[str, set[int]] = {name: set() for name in wanted}
        with (
            translate_errors("read the outbox's instants"),
            self._store._transaction(read=True) as conn,
        ):
            for at in range(0, len(wanted), _IN_LIST_LIMIT):
                chunk = wanted[at : at + _IN_LIST_LIMIT]
                stmt = sa.select(_o.c.name, _o.c.instant_ms).where(
                    self._recent(since_ms), _o.c.instant_ms > since_ms, _o.c.name.in_(chunk)
                )
                for name, instant in conn.execute(stmt):
                    found[name].add(int(instant))
        return found

    @staticmethod
    def _recent(since_ms: int) -> sa.ColumnElement[bool]:
        """The outbox rows sent since ``since_ms`` (less the slack) or not sent: a range
        of the index of ``sent_ms`` each."""
        return sa.or_(_o.c.sent_ms >= since_ms - SENT_SLACK_MS, _o.c.sent_ms.is_(None))
