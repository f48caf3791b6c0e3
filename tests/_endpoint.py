"""A local HTTP endpoint for heartbeat pings, and its fixture (``endpoint``, in
conftest): real HTTP on 127.0.0.1, each request's path and query noted."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

#: Real seconds a test waits for pings to come (they are sent on the hooks thread).
WAIT = 10.0


class Endpoint:
    """A local HTTP server that notes each request's path and query, and answers 200;
    or, while ``hang`` is set, holds each request until ``release`` is set."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.cond = threading.Condition()
        self.hang = False
        self.release = threading.Event()
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with endpoint.cond:
                    endpoint.requests.append(self.path)
                    endpoint.cond.notify_all()
                if endpoint.hang:
                    endpoint.release.wait(60)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def wait_for(self, count: int) -> list[str]:
        """The first ``count`` requests, once they came (bounded real-time poll)."""
        with self.cond:
            came = self.cond.wait_for(lambda: len(self.requests) >= count, timeout=WAIT)
            assert came, f"only {self.requests} of {count} pings came"
            return list(self.requests[:count])

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[Endpoint]:
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    served = Endpoint()
    yield served
    served.close()
