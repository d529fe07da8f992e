"""A TCP proxy in the test process, between one runner and PostgreSQL, that can cut the network.

`pg_terminate_backend` ends a runner's sessions, but the runner reconnects at once: it cannot
keep a runner away from the database for seconds. This proxy can. The runner connects to
`proxy.url(db_url)`; `cut(seconds)` closes every connection it carries, both ways (the server
sees its sessions end, as when a router between them dies and the server's side notices), and
for `seconds` refuses every new one, or with `hang=True` accepts and never answers, as a black
hole would. Afterwards connections pass again.

Plain threads, two per connection: a runner opens a dozen, and the test's own code stays sync.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

_CHUNK = 65536


def _target_of(db_url: str) -> tuple[socket.AddressFamily, Any]:
    """Where the server listens: its Unix socket (a directory as host) or a TCP address."""
    params = conninfo_to_dict(db_url)
    host = str(params.get("host") or "/tmp")
    port = int(params.get("port") or 5432)
    if host.startswith("/"):
        return socket.AF_UNIX, str(Path(host) / f".s.PGSQL.{port}")
    return socket.AF_INET, (host, port)


class PausableProxy:
    """Forwards 127.0.0.1:`port` to the server of `db_url` until `cut` (see the module)."""

    def __init__(self, db_url: str) -> None:
        self._family, self._target = _target_of(db_url)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._held: set[socket.socket] = set()  # accepted during a hanging cut, never answered
        self._cut_until = 0.0
        self._hang = False
        self._closed = False
        self.connections = 0  # accepted and forwarded, for the test to see it was used
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()

    def url(self, db_url: str) -> str:
        """`db_url` through this proxy."""
        params = conninfo_to_dict(db_url)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo(**params)

    @property
    def cutting(self) -> bool:
        return time.monotonic() < self._cut_until

    def cut(self, seconds: float, *, hang: bool = False) -> float:
        """Drop every connection now and refuse (or, with `hang`, swallow) new ones for
        `seconds`; returns the monotonic time the cut ends. Does not block."""
        with self._lock:
            self._hang = hang
            self._cut_until = time.monotonic() + seconds
            victims, self._open = self._open, set()
        for sock in victims:
            _close(sock)
        threading.Timer(seconds, self._heal).start()
        return self._cut_until

    def _heal(self) -> None:
        """End of a cut: connections swallowed meanwhile fail now, and their clients retry."""
        with self._lock:
            held, self._held = self._held, set()
        for sock in held:
            _close(sock)

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            everything = self._open | self._held
            self._open, self._held = set(), set()
        for sock in everything:
            _close(sock)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._admit(client)

    def _admit(self, client: socket.socket) -> None:
        with self._lock:
            if self.cutting:
                if self._hang:
                    self._held.add(client)
                    return
                _close(client)
                return
        try:
            server = socket.socket(self._family, socket.SOCK_STREAM)
            server.connect(self._target)
        except OSError:
            _close(client)
            return
        with self._lock:
            if self.cutting:  # a cut began while connecting
                _close(client)
                _close(server)
                return
            self._open |= {client, server}
            self.connections += 1
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy one direction until either side ends; then end both."""
        try:
            while chunk := source.recv(_CHUNK):
                sink.sendall(chunk)
        except OSError:
            pass
        with self._lock:
            self._open -= {source, sink}
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


__all__ = ["PausableProxy"]
