"""Notes on missed instants: those a catch-up policy passed over, and those an operator
acknowledged (revision 0016)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from ._core import _h, _StoreCore, _t
from ._exceptions import translate_errors
from ._records import RoundRow, round_values
from ._rows import _EPOCH, _MS, _names
from ._schema import REASON_LENGTH
from ._text import check_holder

__all__ = ["ACK_NOTE", "SKIP_NOTE"]

#: The ``why`` of a history note of instants a catch-up policy passed over.
SKIP_NOTE = "skipped"
#: The ``why`` of a history note of missed instants an operator acknowledged.
ACK_NOTE = "ack"
#: Names noted per transaction: each locks its names' lease rows while it runs.
_NOTE_BATCH = 1000


class _Notes(_StoreCore):
    """The notes on missed instants: a part of [LeaseStore][lease.LeaseStore]."""

    def note_skipped(self, notes: Sequence[RoundRow]) -> int:
        """Put ``notes`` in the history: each says that a catch-up policy passed over the
        instants of its name from ``started`` (the first) through ``instant`` (the last),
        ``why`` `SKIP_NOTE`, the policy in ``outcome``. A note whose name already has one
        through the same instant is left out (replicas that catch up together decide
        alike). Returns how many were written: one transaction per `_NOTE_BATCH` names,
        so that a catch-up of a whole fleet never holds every lease row at once.
        """
        by_name: dict[str, list[RoundRow]] = {}
        for note in notes:
            by_name.setdefault(note.name, []).append(note)
        names = sorted(by_name)
        written = 0
        for first in range(0, len(names), _NOTE_BATCH):
            batch = names[first : first + _NOTE_BATCH]
            written += self._note_batch(batch, [n for name in batch for n in by_name[name]])
        return written

    def _note_batch(self, names: list[str], notes: list[RoundRow]) -> int:
        """`note_skipped` for ``notes``, whose names are ``names`` (sorted): one
        transaction."""
        instants = sorted({int(round_values(note)["instant"]) for note in notes})
        with translate_errors("note skipped instants"), self._transaction() as conn:
            # The names' lease rows locked (in name order, as claims lock them) make
            # replicas noting the same instants wait on each other; the locking read
            # of the notes then sees the one written first.
            conn.execute(
                sa.select(_t.c.name)
                .where(_t.c.name.in_(names))
                .order_by(_t.c.name)
                .with_for_update()
            ).all()
            found = {
                (str(name), int(instant))
                for name, instant in conn.execute(
                    sa.select(_h.c.name, _h.c.instant)
                    .where(
                        _h.c.why == SKIP_NOTE,
                        _h.c.name.in_(names),
                        _h.c.instant.in_(instants),
                    )
                    .with_for_update()
                )
            }
            fresh: dict[tuple[str, int], dict[str, object]] = {}
            for note in notes:
                values = round_values(note)
                key = (note.name, int(values["instant"]))
                if key not in found:
                    fresh.setdefault(key, values)
            if fresh:
                conn.execute(_h.insert(), list(fresh.values()))
        return len(fresh)

    def acknowledge(
        self,
        name: str,
        *,
        through: datetime,
        by: str,
        reason: str | None = None,
        now_ms: int | None = None,
    ) -> datetime | None:
        """Acknowledge the missed instants of ``name`` up to ``through`` (whole seconds,
        rounded down): they stop counting as missed. The row keeps the latest
        acknowledgement — through the later of ``through`` and the one before, so an
        acknowledgement never brings back an alarm another silenced — with when, by whom
        and why, and the history gets a note (``why`` `ACK_NOTE`, outcome ``'acknowledged'``,
        ``holder`` = ``by``, ``instant`` = ``through``). One transaction.

        Returns the instant acknowledged through now, or ``None`` when ``name`` has no
        row (nothing written).

        Raises:
            ValueError: ``by`` is empty or too long, ``reason`` is too long
                (`REASON_LENGTH`), ``name`` is empty or too long, ``through`` is naive.
        """
        (wanted,) = _names([name])
        check_holder(by)
        if reason is not None and len(reason) > REASON_LENGTH:
            raise ValueError(
                f"an acknowledgement's reason is at most {REASON_LENGTH} characters, "
                f"not {len(reason)}"
            )
        if through.tzinfo is None:
            raise ValueError(f"through must be an aware datetime, not {through!r}")
        seconds = int(through.timestamp())
        now = self.now_ms() if now_ms is None else now_ms
        with translate_errors("acknowledge missed instants"), self._transaction() as conn:
            before = conn.execute(
                sa.select(_t.c.acked_s).where(_t.c.name == wanted).with_for_update()
            ).first()
            if before is None:
                return None
            if before[0] is not None and int(before[0]) > seconds:
                seconds = int(before[0])
            conn.execute(
                _t.update()
                .where(_t.c.name == wanted)
                .values(acked_s=seconds, acked_ms=now, acked_by=by, ack_reason=reason)
            )
            at = _EPOCH + now * _MS
            note = RoundRow(
                name=wanted,
                instant=_EPOCH + seconds * 1000 * _MS,
                attempt=1,
                holder=by,
                why=ACK_NOTE,
                started=at,
                ended=at,
                outcome="acknowledged",
            )
            conn.execute(_h.insert(), [round_values(note)])
        return _EPOCH + seconds * 1000 * _MS
