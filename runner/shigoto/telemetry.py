"""Named events that subscribers (plain callables) receive, and the set that fixes them.

Every event, with when it is emitted, by which process, and its measurements and metadata, is
documented in one table: docs/telemetry.md (a unit test holds that table and `EVENTS` equal).

A subscriber is called as `handler(event, measurements, metadata)` in the emitting thread. A
subscriber that raises is logged and skipped: telemetry must never break job processing.

Emitting must stay cheap on the hot path, where one event per job is emitted: `emit` returns
at once for an event nobody subscribed to, and an emitter that has to build something for
each job (the producer's `job.claim`) asks `enabled` first, so an unobserved runner pays one
set lookup per claim batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("shigoto.telemetry")

EVENTS = frozenset({
    "job.insert", "job.claim", "job.start", "job.stop", "job.exception", "job.discard",
    "job.snooze", "job.cancel", "producer.claim", "stager.stage", "pruner.prune",
    "completer.flush", "completer.error", "cron.enqueue", "rescuer.rescue", "queue.pause",
    "queue.resume", "queue.forward", "queue.add", "queue.remove", "operator.cancel",
    "batch.seal",
    "workflow.enqueue", "fanout.delivery", "fanout.finish",
    "workflow.release", "workflow.cancel", "batch.callback", "job.forward",
    "flow.defer", "breaker.transition", "shed.change", "runner.loop_blocked",
})  # fmt: skip

Handler = Callable[[str, dict[str, Any], dict[str, Any]], Any]

_lock = threading.Lock()
_handlers: dict[int, tuple[Handler, frozenset[str]]] = {}
_next_id = 0
#: The events at least one handler subscribed to: `emit` and `enabled` read only this, so an
#: event nobody follows costs one set lookup. Replaced (never mutated) under `_lock`.
_followed: frozenset[str] = frozenset()


def attach(handler: Handler, events: Iterable[str] | None = None) -> int:
    """Subscribe `handler` to `events` (default: all); returns a handle for `detach`."""
    global _next_id
    wanted = frozenset(events) if events is not None else EVENTS
    unknown = wanted - EVENTS
    if unknown:
        raise ValueError(f"unknown telemetry events {sorted(unknown)}; known: {sorted(EVENTS)}")
    with _lock:
        _next_id += 1
        _handlers[_next_id] = (handler, wanted)
        _refollow()
        return _next_id


def detach(handle: int) -> None:
    with _lock:
        _handlers.pop(handle, None)
        _refollow()


def _refollow() -> None:
    global _followed
    _followed = frozenset().union(*(wanted for _, wanted in _handlers.values()))


def enabled(event: str) -> bool:
    """Whether some handler follows `event`: an emitter that builds something per job (a
    dict, a computed measurement) asks first, and skips the work while nobody listens."""
    return event in _followed


def emit(event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
    if event not in _followed:
        return
    for handler, wanted in list(_handlers.values()):
        if event not in wanted:
            continue
        try:
            handler(event, measurements, metadata)
        except Exception:
            log.exception("telemetry handler %r failed on %s; ignored", handler, event)
