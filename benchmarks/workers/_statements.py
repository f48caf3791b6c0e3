"""What a cronjob replica sends to its database, by kind, for the fleet benchmark.

:func:`kind` sorts a statement's SQL text into one of :data:`KINDS`:

- ``claim``: an UPDATE of ``cronjob_lease`` that claims (it copies the row's instant to
  ``prev_instant``): an instant's share, its rest after the grace, a second run, a chore's
  turn;
- ``check``: a read of the lease rows or the requests (``SELECT`` … ``FROM cronjob_lease``
  or ``cronjob_trigger``): the sweep's survey (which puts the replica on record on its
  way), the peers' read of the holders, start-up's read of the rows — and whatever
  names-free check a later claim design sends instead of a claim;
- ``renew``: an UPDATE of ``cronjob_lease`` that only moves ``expires_ms`` on;
- ``finish``: the end of a round: the UPDATE that marks it done (``skipped_through``),
  a give-back (``SET state``), the history's INSERT into ``cronjob_round``;
- ``other``: the rest (start-up's ``ensure`` and migrations, the replica's record alone,
  pruning, the listener's set-up).

:class:`Recorder` counts them per wall-clock second with the bytes of their parameters
(their text form: what a claim that lists every name sends grows with the names), and
keeps one entry per claim (its instant, when it went out, how long it took, how many
names it listed, how many rows it won). Installed with :meth:`Recorder.install` as a
``before_cursor_execute``/``after_cursor_execute`` listener on every engine of the
process: the lease engine's statements are the only ones (the benchmark's jobs send
none).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from typing import Any

__all__ = ["KINDS", "Recorder", "kind", "param_bytes"]

KINDS = ("claim", "check", "renew", "finish", "other")
#: Distinct statement texts kept per kind, to show what each kind holds.
TEXTS = 30

_COMMENT = re.compile(r"^\s*((/\*.*?\*/|--[^\n]*)\s*)+", re.S)
_WORDS = re.compile(r"\s+")
_UPDATE_LEASE = re.compile(r"\bUPDATE\s+\"?cronjob_lease\b", re.I)
_INSERT_ROUND = re.compile(r"\bINSERT\s+INTO\s+\"?cronjob_round\b", re.I)
_FROM_READ = re.compile(r"\bFROM\s+\"?(cronjob_lease|cronjob_trigger)\b", re.I)
_SET_STATE = re.compile(r"\bSET\b.*\bstate\s*=", re.I | re.S)


def kind(statement: str) -> str:
    """The kind (one of :data:`KINDS`) of a statement, from its SQL text alone."""
    text = _WORDS.sub(" ", _COMMENT.sub("", statement)).strip()
    verb = text.split(" ", 1)[0].upper() if text else ""
    if _UPDATE_LEASE.search(text):
        if "prev_instant" in text:
            return "claim"
        if "skipped_through" in text or _SET_STATE.search(text.split("WHERE", 1)[0]):
            return "finish"
        if "expires_ms" in text:
            return "renew"
        return "other"
    if _INSERT_ROUND.search(text):
        return "finish"
    if verb in ("SELECT", "WITH") and _FROM_READ.search(text):
        return "check"
    return "other"


def param_bytes(parameters: Any) -> int:
    """The size of a statement's parameters in their text form, in bytes (UTF-8): strings
    as they are, numbers as their digits, ``None`` as nothing, sequences and mappings
    (``executemany``'s rows too) summed."""
    if parameters is None:
        return 0
    if isinstance(parameters, str):
        return len(parameters.encode())
    if isinstance(parameters, bytes | bytearray | memoryview):
        return len(parameters)
    if isinstance(parameters, dict):
        return sum(param_bytes(value) for value in parameters.values())
    if isinstance(parameters, list | tuple):
        return sum(param_bytes(value) for value in parameters)
    return len(str(parameters))


def _claim_epoch(parameters: Any) -> int | None:
    if isinstance(parameters, dict):
        for key, value in parameters.items():
            if key.endswith("epoch") and isinstance(value, int):
                return value
    return None


def _listed_names(parameters: Any) -> int:
    """How many names a claim lists: its JSON array of names (PostgreSQL), its JSON map
    of each name's next instant (``claim_due``, revision 0006: the names are its keys),
    or its expanded ``IN`` (one parameter per name)."""
    if not isinstance(parameters, dict):
        return 0
    for key, value in parameters.items():
        if key.endswith("claim_due") and isinstance(value, str):
            return len(json.loads(value))
        if "names" in key and isinstance(value, str) and value.startswith("["):
            return 0 if value == "[]" else value.count('", "') + 1
    return sum(1 for key in parameters if key.startswith("claim_names"))


class Recorder:
    """Counts the statements of this process by (second, kind), with their parameters'
    bytes, and records each claim. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[tuple[int, str]] = Counter()
        self.bytes: Counter[tuple[int, str]] = Counter()
        #: One entry per claim: [instant, sent (epoch s), seconds it took, names, won, bytes]
        self.claims: list[list[float]] = []
        self._local = threading.local()
        #: The first :data:`TEXTS` distinct statements of each kind, cut at 160 characters.
        self.texts: dict[str, set[str]] = {k: set() for k in KINDS}

    def before(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        what = kind(statement)
        size = param_bytes(parameters)
        now = time.time()
        self._local.started = (what, now, time.perf_counter(), size, parameters)
        key = (int(now), what)
        with self._lock:
            self.counts[key] += 1
            self.bytes[key] += size
            if len(self.texts[what]) < TEXTS:
                self.texts[what].add(_WORDS.sub(" ", statement).strip()[:160])

    def after(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        started = getattr(self._local, "started", None)
        self._local.started = None
        if started is None or started[0] != "claim":
            return
        _, sent, t0, size, parameters = started
        took = time.perf_counter() - t0
        epoch = _claim_epoch(parameters)
        won = getattr(cursor, "rowcount", -1)
        entry = [
            float("nan") if epoch is None else epoch,
            sent,
            took,
            _listed_names(parameters),
            won,
            size,
        ]
        with self._lock:
            self.claims.append(entry)

    def install(self) -> None:
        """Listen on every SQLAlchemy engine of the process."""
        import sqlalchemy as sa
        from sqlalchemy import event

        event.listen(sa.engine.Engine, "before_cursor_execute", self.before)
        event.listen(sa.engine.Engine, "after_cursor_execute", self.after)

    def report(self) -> dict[str, Any]:
        """What was recorded, JSON-ready: ``statements`` as [second, kind, count, bytes]."""
        with self._lock:
            return {
                "kinds": [
                    [second, what, n, self.bytes[(second, what)]]
                    for (second, what), n in sorted(self.counts.items())
                ],
                "claims": list(self.claims),
                "texts": {k: sorted(texts) for k, texts in self.texts.items()},
            }
