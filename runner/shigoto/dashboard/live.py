"""Live updates: one change poller per database, shared by every open page, and the
server-sent event streams that carry its news.

Each open page holds an EventSource on `/api/events`. Polling the database once per page would
multiply the load by the number of viewers, so there is one poller per database, started when
its first stream opens and stopped when its last one closes. Every `interval` it reads a cheap
mark (`readings.change_mark`: the newest id, the live counts from their partial indexes, the
newest finish, the newest settings change, the nodes) and, when the mark differs from the last
one, bumps a version and wakes the streams, which send `event: change`. The page then re-fetches
what it shows. A stream with nothing to say sends a `: keepalive` comment every `keepalive`
seconds, which also finds a client that left (the write fails) within that time.

The first mark is read in the request thread before the stream says `: connected`, so any
change made after a client has seen that line is reported.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("shigoto.dashboard")

#: Seconds between two reads of a database's change mark.
POLL_INTERVAL = 2.0
#: Seconds a stream stays silent before it sends a keepalive comment.
KEEPALIVE = 15.0
#: Milliseconds the browser waits before reconnecting a dropped stream.
RECONNECT_MS = 5000


class _Poller:
    """Reads one database's change mark every interval while it has subscribers."""

    def __init__(self, read_mark: Callable[[], Any], interval: float, name: str) -> None:
        self.read_mark = read_mark
        self.interval = interval
        self.version = 0
        self.subscribers = 0
        self.changed = threading.Condition()
        self._stop = threading.Event()
        self._mark = read_mark()  # the baseline, before any stream says it is connected
        self._thread = threading.Thread(target=self._run, name=f"shigoto-dashboard-{name}",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                mark = self.read_mark()
            except Exception as exc:  # a database away for a moment: try again next tick
                log.warning("dashboard change poll failed: %s: %s", type(exc).__name__, exc)
                continue
            if mark != self._mark:
                self._mark = mark
                with self.changed:
                    self.version += 1
                    self.changed.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """The version once it differs from `seen`, or after `timeout` seconds, or at stop."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != seen or self._stop.is_set(), timeout)
            return self.version

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        with self.changed:
            self.changed.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5)


class Changes:
    """The pollers of every database, keyed by the caller (a database's url and schema)."""

    def __init__(self, interval: float = POLL_INTERVAL, keepalive: float = KEEPALIVE) -> None:
        self.interval = interval
        self.keepalive = keepalive
        self._lock = threading.Lock()
        self._pollers: dict[Hashable, _Poller] = {}
        self._closed = False

    def _join(self, key: Hashable, read_mark: Callable[[], Any]) -> _Poller:
        with self._lock:
            if self._closed:
                raise RuntimeError("the dashboard is closed")
            poller = self._pollers.get(key)
            if poller is None:
                poller = _Poller(read_mark, self.interval, str(len(self._pollers)))
                self._pollers[key] = poller
            poller.subscribers += 1
            return poller

    def _leave(self, key: Hashable, poller: _Poller) -> None:
        with self._lock:
            poller.subscribers -= 1
            if poller.subscribers > 0 or self._pollers.get(key) is not poller:
                return
            del self._pollers[key]
        poller.stop()

    def stream(self, key: Hashable, read_mark: Callable[[], Any]) -> Iterator[bytes]:
        """The bytes of one event stream. The first `next()` joins (or starts) the poller of
        `key`: a failing first read raises there, before the caller sends any header."""
        poller = self._join(key, read_mark)
        try:
            yield f"retry: {RECONNECT_MS}\n: connected\n\n".encode()
            seen = poller.version
            while not poller.stopped:
                version = poller.wait(seen, self.keepalive)
                if poller.stopped:
                    break
                if version == seen:
                    yield b": keepalive\n\n"
                    continue
                seen = version
                at = datetime.now(UTC).isoformat()
                yield f"event: change\ndata: {json.dumps({'at': at})}\n\n".encode()
        finally:
            self._leave(key, poller)

    def version(self, key: Hashable) -> int | None:
        """How many changes the poller of `key` has seen (None: no stream is open): a value
        cached under one version is stale under the next."""
        with self._lock:
            poller = self._pollers.get(key)
            return None if poller is None else poller.version

    def close(self) -> None:
        """Stop every poller; every open stream ends."""
        with self._lock:
            self._closed = True
            pollers = list(self._pollers.values())
            self._pollers.clear()
        for poller in pollers:
            poller.stop()
