"""The listener: a request for a round now wakes the sweep at once, on PostgreSQL.

``cronjob trigger`` ([lease.Triggers.request][]) sends ``NOTIFY cronjob_trigger`` in
the transaction that writes the request. Each replica on PostgreSQL keeps one connection
of its own (outside the pool, so it never takes a slot from the jobs) that ``LISTEN``\\ s
on that channel, in a daemon thread; a notification asks the dispatcher to sweep now, so
a request is taken in milliseconds instead of at the next sweep (within 15 s). Nothing
depends on it: a lost connection is retried with back-off, a driver without psycopg 3's
``notifies(timeout=...)`` (psycopg2) leaves the sweep to take requests as it always
does. Not used on a fake clock, where the sweep learns of requests written in the
process from the lease writes it watches.

Behind a transaction pooler (PgBouncer's ``pool_mode = transaction``) a ``LISTEN`` lands
on whichever server connection the pooler lends for that one statement, and the
notifications go there, not to us. Declared in the URL (``?pooler=transaction``), the
listener is not started (one INFO line). Undeclared, its first connection proves that
notifications arrive: it sends one to itself and waits `PROBE_WAIT` seconds; if
none comes it gives up for good, with one WARNING that names the URL parameter.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import lease

from .._clock import Clock

__all__ = ["Listener"]

log = logging.getLogger("cronjob")

#: Seconds a ``notifies`` call waits before the thread checks whether it should stop
#: (`Listener.close` wakes it at once; this is only for when that fails).
POLL_STOP = 5.0
#: Seconds `Listener.close` waits for the thread (a daemon: it ends by itself).
CLOSE_WAIT = 1.0
#: Seconds before a lost listening connection is opened again (doubling up to the last).
RETRY = (1.0, 2.0, 4.0, 8.0, 15.0)
#: Seconds the first listening connection waits for the notification it sent itself
#: before it concludes notifications do not reach it (a transaction pooler between).
PROBE_WAIT = 5.0


class Listener:
    """Calls ``wake`` (from its own thread) whenever a request is written to ``engine``'s
    database; `close` stops it within `POLL_STOP` seconds."""

    def __init__(self, engine: sa.Engine, wake: Callable[[], object]) -> None:
        self._engine = engine
        self._wake = wake
        self._stop = threading.Event()
        #: A channel of this listener's own, to wake it when it should stop.
        self._own = f"cronjob_stop_{uuid.uuid4().hex[:16]}"
        self._thread = threading.Thread(target=self._serve, name="cronjob-listener", daemon=True)
        #: Whether a notification has reached this listener (the probe, or a request).
        self._heard = False

    @staticmethod
    def applies(engine: sa.Engine, clock: Clock) -> bool:
        """Whether to listen: PostgreSQL, on a clock that is not a fake one, and not
        behind a transaction pooler ([lease.behind_transaction_pooler][]; said in
        one INFO line)."""
        if engine.dialect.name != "postgresql" or clock.in_process:
            return False
        if lease.behind_transaction_pooler(engine):
            log.info(
                "not listening for requests behind a transaction pooler (pooler=transaction): "
                "the sweep takes requests for a round now, within 15 s"
            )
            return False
        return True

    def start(self) -> None:
        self._thread.start()

    def close(self, send: Callable[[Callable[[], None]], object] | None = None) -> None:
        """Stop listening and wait for the thread, at most `CLOSE_WAIT` seconds: a
        notification on a channel of this listener's own wakes it at once (else it
        notices within `POLL_STOP`, and ends by itself, a daemon).

        Args:
            send: runs the notification's statement (the scheduler's control thread, whose
                wait at stop is bounded); by default this thread sends it. A database that
                hangs (a blackholed path) then holds the statement, never the caller.
        """
        self._stop.set()
        if not self._thread.is_alive():
            return
        engine, own = self._engine, self._own

        def wake() -> None:
            with contextlib.suppress(Exception), engine.connect() as conn:
                conn.execute(sa.select(sa.func.pg_notify(own, "")))
                conn.commit()

        if send is None:
            wake()
        else:
            send(wake)
        self._thread.join(CLOSE_WAIT)

    def _serve(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:  # unreachable now: the sweep still takes requests
                log.debug("listening for requests: cannot connect: %s", exc)
            else:
                try:
                    if not self._listen(conn):
                        return  # for good: _listen said why
                    failures = 0
                except Exception as exc:
                    log.debug("listening for requests: the connection failed: %s", exc)
                finally:
                    with contextlib.suppress(Exception):
                        conn.close()
            failures += 1
            self._stop.wait(RETRY[min(failures, len(RETRY)) - 1])

    def _connect(self) -> Any:
        """A driver connection of our own, outside the engine's pool, in autocommit."""
        dialect = self._engine.dialect
        cargs, cparams = dialect.create_connect_args(self._engine.url)
        conn = dialect.connect(*cargs, **cparams)
        conn.autocommit = True
        return conn

    def _listen(self, conn: Any) -> bool:
        """Listen on ``conn`` until told to stop; ``False`` (said in the log) if this
        driver cannot, or notifications do not reach it."""
        notifies = getattr(conn, "notifies", None)
        if notifies is None:
            log.debug("listening for requests: this driver cannot; sweeps take them")
            return False
        conn.execute(f"LISTEN {lease.TRIGGER_CHANNEL}")
        conn.execute(f"LISTEN {self._own}")
        if not self._heard:
            # Through the engine, as a request's NOTIFY is sent.
            with self._engine.connect() as sender:
                sender.execute(sa.select(sa.func.pg_notify(self._own, "probe")))
                sender.commit()
        while not self._stop.is_set():
            wait = POLL_STOP if self._heard else PROBE_WAIT
            try:
                received = list(notifies(timeout=wait, stop_after=1))
            except TypeError:  # psycopg older than 3.2: no timeout
                log.debug("listening for requests: this driver cannot; sweeps take them")
                return False
            if not received and not self._heard and not self._stop.is_set():
                log.warning(
                    "listening for requests: a notification sent to this replica did not "
                    "arrive within %s s (a transaction pooler in between? then add "
                    "pooler=transaction to the database URL); the sweep takes requests for "
                    "a round now, within 15 s",
                    PROBE_WAIT,
                )
                return False
            self._heard = self._heard or bool(received)
            asked = any(n.channel == lease.TRIGGER_CHANNEL for n in received)
            if asked and not self._stop.is_set():
                self._wake()
        return True
