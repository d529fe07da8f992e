"""HTTP probes and metrics for a runner: `/healthz`, `/readyz`, `/metrics`.

The HTTP server runs in a daemon thread of its own, not on the runner's event loop, so it keeps
answering when the loop is blocked (a sync call inside an `async def` worker, a CPU-bound
perform on the loop) — and can therefore say so. Everything it serves is state that tasks on
the loop keep fresh:

- a ticker stamps a monotonic "last tick" every `tick_interval`; `/healthz` is 200 while the
  stamp is younger than `stall_after`, else 503 (the liveness probe restarts a stuck pod);
- a readiness probe checks, every `probe_interval`, that the database answers and the schema is
  at the latest migration, and caches the verdict; `/readyz` is 200 only when the runner is
  ready, that verdict is good, the loop is alive and the runner has not given up on too many
  stuck sync threads (`Runner.stuck_reason`, which stays reported after the runner stopped);
- a depth poller refreshes the queue-depth gauge every `depth_interval`; the job counters
  follow telemetry events (see `shigoto.ops.metrics`; every metric served on `/metrics` is
  listed in docs/telemetry.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST

from shigoto._service import Service
from shigoto.db.migrate import current_version, latest_version
from shigoto.ops.metrics import RunnerMetrics
from shigoto.worker import registered_names

log = logging.getLogger("shigoto.probes")

#: The Python API listens on this machine only; `shigoto run` listens on every interface by
#: default (kubelet probes and Prometheus reach a pod by its IP) unless --health-host says so.
DEFAULT_HOST = "127.0.0.1"
#: Seconds a connection may take to send its request (and to read the answer).
REQUEST_TIMEOUT = 5.0
#: Connections served at once; probes and a scraper need a handful.
MAX_CONNECTIONS = 32


@dataclass(frozen=True, slots=True)
class Readiness:
    """One verdict of the readiness probe; replaced whole, so the HTTP thread reads it safely."""

    ready: bool
    reason: str


NOT_CHECKED = Readiness(False, "the database has not been checked yet")


async def probe_database(
    conn: psycopg.AsyncConnection[Any], schema: str, want: int | None = None
) -> Readiness:
    """Whether the database answers on `conn` and `schema` is at migration `want` (latest).

    A runner on an older schema would fail on the first statement that needs a newer column;
    reporting it here keeps a rollout from sending work to such a pod.
    """
    want = latest_version() if want is None else want
    have = await current_version(conn, schema)
    if have < want:
        return Readiness(
            False,
            f"schema {schema!r} is at migration {have}, this runner needs {want}: "
            "run `shigoto migrate`",
        )
    return Readiness(True, f"database reachable, schema {schema!r} at migration {have}")


class Ticker(Service):
    """Proves the event loop still runs: stamps `last_tick` whenever the loop lets it."""

    name = "health"

    def __init__(self, interval: float) -> None:
        super().__init__(interval)
        self.last_tick = time.monotonic()

    async def run_once(self) -> None:
        self.last_tick = time.monotonic()

    def age(self) -> float:
        return time.monotonic() - self.last_tick


class ReadinessProbe(Service):
    """Checks the database through the runner's pool and caches the verdict in `result`."""

    name = "health"

    def __init__(self, runner: Any, interval: float, timeout: float) -> None:
        super().__init__(interval)
        self.runner = runner
        self.timeout = timeout
        self.want = latest_version()
        self.result = NOT_CHECKED

    async def run_once(self) -> None:
        await self.runner.ready.wait()  # probe the moment the runner is up, not a tick later
        self.result = await self.check()

    async def check(self) -> Readiness:
        pool = self.runner._pool
        if pool is None:
            return Readiness(False, "the runner has no database pool (stopped)")
        try:
            async with asyncio.timeout(self.timeout), pool.connection(timeout=self.timeout) as conn:
                return await probe_database(conn, self.runner.schema, self.want)
        except Exception as exc:
            # /readyz answers anyone who can reach the port: say only what kind of trouble
            # it is. The server's own text (hosts, roles, a conninfo) goes to the log.
            reason = failure_class(exc)
            if reason != self.result.reason:
                log.warning("readiness: %s: %s: %s", reason, type(exc).__name__, exc)
            return Readiness(False, reason)


def failure_class(exc: BaseException) -> str:
    """A short, fixed description of why the database check failed."""
    if isinstance(exc, TimeoutError | psycopg.OperationalError):
        return "database unreachable"  # PoolTimeout is an OperationalError too
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return "database refused access"
    if isinstance(exc, psycopg.Error):
        return "database error"
    return "readiness check failed"


class DepthPoller(Service):
    """Refreshes the queue-depth gauge through the runner's pool while the runner is ready."""

    name = "metrics"

    def __init__(self, runner: Any, metrics: RunnerMetrics, interval: float) -> None:
        super().__init__(interval)
        self.runner = runner
        self.metrics = metrics

    async def run_once(self) -> None:
        await self.runner.ready.wait()
        if self.runner._pool is not None:
            await self.metrics.refresh_depth(self.runner._pool, self.runner.stmts)


class HealthServer:
    """Serves the probes and metrics of `runner` on `host:port` (port 0: any free port).

    `server.port` is the bound port once `start()` returned.
    """

    def __init__(
        self,
        runner: Any,
        port: int,
        host: str = DEFAULT_HOST,
        *,
        stall_after: float = 10.0,
        tick_interval: float = 1.0,
        probe_interval: float = 5.0,
        probe_timeout: float = 5.0,
        depth_interval: float = 5.0,
        request_timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.runner = runner
        self.host = host
        self.port = port
        self.stall_after = stall_after
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        # Labels only for what this runner knows: job rows cannot grow /metrics without bound.
        self.metrics = RunnerMetrics(
            runner.node, queues=lambda: runner.queues, workers=registered_names
        )
        self.ticker = Ticker(tick_interval)
        self.readiness = ReadinessProbe(runner, probe_interval, probe_timeout)
        self.depth = DepthPoller(runner, self.metrics, depth_interval)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Bind, serve in a daemon thread, and start the loop tasks that feed the answers."""
        self._httpd = BoundedHTTPServer(
            (self.host, self.port), _handler_for(self), self.max_connections
        )
        self.metrics.attach()  # after the bind: a port in use must not leave a subscriber behind
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="shigoto-health", daemon=True
        )
        self._thread.start()
        self.ticker.last_tick = time.monotonic()  # the loop is alive now, whenever we were built
        for service in (self.ticker, self.readiness, self.depth):
            self._tasks.append(asyncio.create_task(service.run(), name=f"shigoto-{service.name}"))
        log.info(
            "health server on http://%s:%d (/healthz, /readyz, /metrics)",
            self.host, self.port, extra={"host": self.host, "port": self.port},
        )  # fmt: skip

    async def stop(self) -> None:
        """Stop the loop tasks and the HTTP thread; safe to call twice or without `start()`."""
        for service in (self.ticker, self.readiness, self.depth):
            service.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.metrics.detach()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            await asyncio.to_thread(httpd.shutdown)  # blocks until serve_forever has returned
            httpd.server_close()

    # -- the answers, computed in the HTTP thread from state the loop keeps fresh ----------

    def liveness(self) -> tuple[int, dict[str, Any]]:
        age = round(self.ticker.age(), 3)
        if age < self.stall_after:
            return 200, {"status": "ok", "last_tick_age": age}
        return 503, {
            "status": "stalled",
            "reason": f"event loop has not run for {age:.1f}s (limit {self.stall_after:g}s)",
            "last_tick_age": age,
        }

    def readiness_status(self) -> tuple[int, dict[str, Any]]:
        stuck = getattr(self.runner, "stuck_reason", None)
        if stuck is not None:
            return 503, {"status": "not ready", "reason": stuck,
                         "stuck_threads": self.runner.stuck_threads}  # fmt: skip
        if not self.runner.ready.is_set():
            return 503, {"status": "not ready", "reason": "the runner is not running"}
        code, live = self.liveness()
        if code != 200:
            return 503, {"status": "not ready", "reason": live["reason"]}
        result = self.readiness.result
        if not result.ready:
            return 503, {"status": "not ready", "reason": result.reason}
        return 200, {"status": "ready", "reason": result.reason}


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, but at most `max_connections` at once: past the cap a new
    connection is closed at once instead of getting a thread. With the handler's socket
    timeout, slow or half-sent requests can hold only a bounded number of threads, briefly.
    Serves the health probes and the dashboard (`shigoto.dashboard.server`)."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int,
        *, name: str = "health server",
    ) -> None:  # fmt: skip
        super().__init__(address, handler)
        self.max_connections = max_connections
        self.name = name
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.debug("%s: %d connections open, refusing %s",
                      self.name, self.max_connections, client_address)  # fmt: skip
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _handler_for(server: HealthServer) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to `server` (http.server instantiates it per request)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "shigoto-health"
        timeout = server.request_timeout  # the socket's: a stalled client frees its thread

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._json(*server.liveness())
            elif path == "/readyz":
                self._json(*server.readiness_status())
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, server.metrics.exposition())
            else:
                self._json(404, {"status": "not found", "paths": ["/healthz", "/readyz",
                                                                  "/metrics"]})  # fmt: skip

        def _json(self, code: int, body: dict[str, Any]) -> None:
            self._send(code, "application/json", json.dumps(body).encode())

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(HTTPStatus(code))
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Probes hit every few seconds: keep them out of the INFO log."""
            log.debug("%s %s", self.address_string(), format % args)

    return Handler


__all__ = ["BoundedHTTPServer", "HealthServer", "Readiness", "failure_class", "probe_database"]
