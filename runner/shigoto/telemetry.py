"""Named events that subscribers (plain callables) receive, and the set that fixes them.

Every event, with when it is emitted, by which process, and its measurements and metadata, is
documented in one table: docs/telemetry.md (a unit test holds that table and `EVENTS` equal).

A subscriber is called as `handler(event, measurements, metadata)` in the emitting thread. A
subscriber that raises is logged and skipped: telemetry must never break job processing.
A subscriber attached with `queues=` is a per-queue hook (the seed Gaffer's per-queue
`hooks`): it hears only the events of those queues, so a team owning one queue needs no
filtering of its own and no parallel hook mechanism exists beside this one.

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
    "job.snooze", "job.cancel", "job.progress", "producer.claim", "stager.stage", "pruner.prune",
    "completer.flush", "completer.error", "cron.enqueue", "rescuer.rescue", "queue.pause",
    "queue.resume", "queue.forward", "queue.add", "queue.remove", "operator.cancel",
    "batch.seal",
    "workflow.enqueue", "fanout.delivery", "fanout.finish",
    "workflow.release", "workflow.cancel", "batch.callback", "job.forward",
    "flow.defer", "breaker.transition", "shed.change", "runner.loop_blocked",
})  # fmt: skip

Handler = Callable[[str, dict[str, Any], dict[str, Any]], Any]

_lock = threading.Lock()
#: handle -> (handler, its events, its queues or None for every queue)
_handlers: dict[int, tuple[Handler, frozenset[str], frozenset[str] | None]] = {}
_next_id = 0
#: The events at least one handler subscribed to: `emit` and `enabled` read only this, so an
#: event nobody follows costs one set lookup. Replaced (never mutated) under `_lock`.
_followed: frozenset[str] = frozenset()


def attach(
    handler: Handler, events: Iterable[str] | None = None, *, queues: Iterable[str] | None = None
) -> int:
    """Subscribe `handler` to `events` (default: all); returns a handle for `detach`.

    `queues=["emails"]` makes it a per-queue hook: it receives only events about those queues
    (see `event_queues`); events about no queue (`completer.flush`, `pruner.prune`...) never
    reach it."""
    global _next_id
    wanted = frozenset(events) if events is not None else EVENTS
    unknown = wanted - EVENTS
    if unknown:
        raise ValueError(f"unknown telemetry events {sorted(unknown)}; known: {sorted(EVENTS)}")
    only = _queue_filter(queues)
    with _lock:
        _next_id += 1
        _handlers[_next_id] = (handler, wanted, only)
        _refollow()
        return _next_id


def _queue_filter(queues: Iterable[str] | None) -> frozenset[str] | None:
    """`queues` as a set, refusing a lone string (it would be read as its characters)."""
    if queues is None:
        return None
    if isinstance(queues, str):
        raise ValueError(f"queues must be a list of queue names, such as [{queues!r}], not a "
                         "string")  # fmt: skip
    only = frozenset(queues)
    if not only or not all(isinstance(q, str) and q for q in only):
        raise ValueError(f"queues must name at least one queue, got {sorted(only)!r}")
    return only


def event_queues(metadata: dict[str, Any]) -> frozenset[str]:
    """The queues an event is about, read from its metadata: the `job`'s queue, `queue`,
    `from_queue` (a forward is about the queue it left, too), or every name in `queues`."""
    found: set[str] = set()
    job = metadata.get("job")
    if job is not None and getattr(job, "queue", None):
        found.add(job.queue)
    for key in ("queue", "from_queue"):
        value = metadata.get(key)
        if isinstance(value, str):
            found.add(value)
    many = metadata.get("queues")
    if isinstance(many, list | tuple | set | frozenset):
        found.update(q for q in many if isinstance(q, str))
    return frozenset(found)


def detach(handle: int) -> None:
    with _lock:
        _handlers.pop(handle, None)
        _refollow()


def _refollow() -> None:
    global _followed
    _followed = frozenset().union(*(wanted for _, wanted, _ in _handlers.values()))


def enabled(event: str) -> bool:
    """Whether some handler follows `event`: an emitter that builds something per job (a
    dict, a computed measurement) asks first, and skips the work while nobody listens."""
    return event in _followed


def emit(event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
    if event not in _followed:
        return
    about: frozenset[str] | None = None  # read once, only if a per-queue hook asks
    for handler, wanted, only in list(_handlers.values()):
        if event not in wanted:
            continue
        if only is not None:
            about = event_queues(metadata) if about is None else about
            if only.isdisjoint(about):
                continue
        try:
            handler(event, measurements, metadata)
        except Exception:
            log.exception("telemetry handler %r failed on %s; ignored", handler, event)
