"""The dashboard over HTTP: a standard-library threaded server around `Dashboard.handle`.

A thread per connection, at most `max_connections` at once (past the cap a connection is
closed at once), and a socket timeout, so slow or half-sent requests hold a bounded number of
threads, briefly. Event streams hold their thread while open; they end when the client leaves
(a keepalive write fails) or when the server stops. Request bodies are read and dropped (the
actions take none), and one larger than `MAX_BODY` is refused.

`stop()` stops accepting, ends every event stream, waits for the serving thread, and closes the
dashboard's pools.
"""

from __future__ import annotations

import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from shigoto.dashboard.app import Dashboard, Request, Response, json_response
from shigoto.dashboard.auth import SECURITY_HEADERS
from shigoto.ops.probes import BoundedHTTPServer

log = logging.getLogger("shigoto.dashboard")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: Connections served at once: pages, their event streams, a few API calls each.
MAX_CONNECTIONS = 64
#: Seconds a connection may take to send its request.
REQUEST_TIMEOUT = 10.0
#: Largest request body read (actions have none).
MAX_BODY = 64 * 1024


class _BoundedServer(BoundedHTTPServer):
    """The probes' bounded server, which may rebind a port just left (a restarted dashboard)."""

    allow_reuse_address = True


class DashboardServer:
    """Serves `dashboard` on `host:port` (port 0: any free port; `port` is the bound one once
    `start()` returned)."""

    def __init__(self, dashboard: Dashboard, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 *, max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT) -> None:  # fmt: skip
        self.dashboard = dashboard
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self._httpd: _BoundedServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> None:
        """Bind and serve in a thread of its own; OSError if the address cannot be bound."""
        self._httpd = _BoundedServer((self.host, self.port), _handler_for(self),
                                     self.max_connections, name="dashboard")  # fmt: skip
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="shigoto-dashboard-http", daemon=True)  # fmt: skip
        self._thread.start()
        log.info("dashboard on %s", self.url, extra={"host": self.host, "port": self.port})

    def stop(self) -> None:
        """Stop serving, end the event streams, close the pools; safe to call twice."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()  # returns once serve_forever has
            httpd.server_close()
        self.dashboard.close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> DashboardServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler_for(server: DashboardServer) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to `server` (http.server instantiates it per request)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "shigoto-dashboard"
        timeout = server.request_timeout

        def version_string(self) -> str:
            """No Python version in the Server header: nothing for a scanner to match."""
            return self.server_version

        def do_GET(self) -> None:
            self._serve("GET")

        def do_HEAD(self) -> None:
            self._serve("HEAD")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_OPTIONS(self) -> None:
            self._serve("OPTIONS")

        def _serve(self, method: str) -> None:
            if not self._drain_body():
                response = json_response(413, {"error": f"request body over {MAX_BODY} bytes"})
                response.headers.update(SECURITY_HEADERS)
            else:
                request = Request(method, self.path, dict(self.headers.items()))
                response = server.dashboard.handle(request)
            if response.stream is not None and method != "HEAD":
                self._stream(response)
            else:
                self._send(response, with_body=method != "HEAD")

        def _drain_body(self) -> bool:
            length = self.headers.get("Content-Length")
            if not length:
                return True
            try:
                size = int(length)
            except ValueError:
                return False
            if size < 0 or size > MAX_BODY:
                self.close_connection = True
                return False
            self.rfile.read(size)
            return True

        def _head(self, response: Response) -> None:
            self.send_response(HTTPStatus(response.status))
            for name, value in response.headers.items():
                self.send_header(name, value)

        def _send(self, response: Response, with_body: bool = True) -> None:
            self._head(response)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if with_body:
                self.wfile.write(response.body)

        def _stream(self, response: Response) -> None:
            assert response.stream is not None
            chunks = response.stream
            try:
                first = next(chunks)  # joins the poller: a database error is still a 503 here
            except Exception as exc:
                failed = server.dashboard.error_response(exc)
                failed.headers.update(SECURITY_HEADERS)
                self._send(failed)
                return
            self._head(response)
            self.end_headers()
            self.close_connection = True
            try:
                self.wfile.write(first)
                self.wfile.flush()
                for chunk in chunks:
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except OSError:
                pass  # the client went away
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()

        def log_message(self, format: str, *args: Any) -> None:
            """Pages poll and stream: keep requests out of the INFO log."""
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
