"""The process-wide map from worker names to worker definitions.

It sits below both the client and the worker module so that enqueueing a worker object can
find its defaults without the client importing the worker layer (which imports the client for
its typed `.enqueue` shortcut). Only definitions register here, never job data: a runner
resolves a job's worker name against this map and imports nothing on a row's say-so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import KeysView, Mapping
from typing import Any, Protocol

log = logging.getLogger("shigoto.worker")


class Definition(Protocol):
    """What enqueueing needs to know about a worker: its name and enqueue defaults."""

    name: str

    def defaults(self) -> Mapping[str, Any]: ...


_definitions: dict[str, Any] = {}
_lock = threading.Lock()


def register(definition: Definition) -> None:
    """Add or replace `definition` under its name; the newest definition wins (a reload)."""
    with _lock:
        previous = _definitions.get(definition.name)
        if previous is not None and previous is not definition:
            log.debug("worker %s registered again; the newest definition wins", definition.name)
        _definitions[definition.name] = definition


def get(name: str) -> Any | None:
    return _definitions.get(name)


def contains(name: str) -> bool:
    return name in _definitions


def forget(name: str) -> None:
    """Drop a definition (tests that define throwaway workers)."""
    with _lock:
        _definitions.pop(name, None)


def names() -> KeysView[str]:
    return _definitions.keys()


def snapshot() -> dict[str, Any]:
    return dict(_definitions)
