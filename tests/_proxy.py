"""A TCP proxy a test can cut and restore: the broker's network goes away, the broker
itself (Redis, shared with other runs) is never stopped."""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """Forwards 127.0.0.1:``port`` to ``target``; `cut` closes every connection and
    refuses new ones until `restore`; `stall` keeps every connection open and forwards
    nothing more (a broker that accepts TCP and does not answer) until `restore`
    forwards what it held back (the answer comes, late)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._stalled = False
        self._held: list[tuple[socket.socket, bytes]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(self._target, timeout=5)
                except OSError:
                    client.close()
                    continue
                # The 5 s bounds the connect only: a stalled connection stays open (a read
                # that timed out would close both ends, a broker that hung up).
                upstream.settimeout(None)
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                with self._lock:
                    if self._stalled:
                        self._held.append((sink, chunk))
                        continue
                sink.sendall(chunk)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Close every connection, and refuse new ones."""
        with self._lock:
            self._cut = True
            for end in self._open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()
            self._open.clear()
            self._held.clear()

    def stall(self) -> None:
        """Forward nothing more, on open connections and new ones, closing none."""
        with self._lock:
            self._stalled = True

    def restore(self) -> None:
        """Accept connections again (after `cut`); forward, in order, what the open
        connections sent while stalled, and all from now on (after `stall`)."""
        with self._lock:
            self._cut = False
            self._stalled = False
            for sink, chunk in self._held:
                with contextlib.suppress(OSError):
                    sink.sendall(chunk)
            self._held.clear()

    def close(self) -> None:
        self.cut()
        self._closed = True
        self._listener.close()
