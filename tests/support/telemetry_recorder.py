"""A telemetry subscriber for tests: keeps every event (or one node's), safe to read while the
runner's threads and loop still emit."""

from __future__ import annotations

import threading
from typing import Any

Event = tuple[str, dict[str, Any], dict[str, Any]]


class Recorder:
    """Every event it is attached to; with `node`, only those whose metadata names that node
    (client events carry none)."""

    def __init__(self, node: str | None = None) -> None:
        self.node = node
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        if self.node is not None and metadata.get("node") != self.node:
            return
        with self._lock:
            self.events.append((event, dict(measurements), dict(metadata)))

    def named(self, event: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        with self._lock:
            return [(m, md) for e, m, md in self.events if e == event]

    def names(self) -> set[str]:
        with self._lock:
            return {e for e, _, _ in self.events}

    def for_worker(self, event: str, worker: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [(m, md) for m, md in self.named(event) if md["job"].worker == worker.name]
