"""Named events that subscribers (plain callables) receive, and the table that fixes them.

A subscriber is called as `handler(event, measurements, metadata)` in the emitting thread. A
subscriber that raises is logged and skipped: telemetry must never break job processing.

| event           | measurements                     | metadata                                 |
|-----------------|----------------------------------|------------------------------------------|
| job.start       | system_time                      | job, node                                |
| job.stop        | duration, queue_time             | job, node, result                        |
| job.exception   | duration, queue_time             | job, node, error, kind (failure|timeout) |
| job.discard     | duration                         | job, node, error                         |
| job.snooze      | duration, snooze                 | job, node                                |
| job.cancel      | duration                         | job, node, reason, source (see below)    |
| producer.claim  | duration, count, requested       | queue, node                              |
| stager.stage    | duration, count                  | queues, node                             |
| pruner.prune    | duration, archived, deleted      | node                                     |
| completer.flush | duration, count, acknowledged    | node                                     |
| completer.error | attempt                          | node, error                              |
| job.insert      | count, conflicts, duration       | source, schema, queues                   |
| cron.enqueue    | count                            | name, job_ids                            |
| rescuer.rescue  | count                            | node, job_ids                            |
| queue.pause     | (none)                           | queue, schema                            |
| queue.resume    | (none)                           | queue, schema                            |
| queue.forward   | (none)                           | queue, schema, forward                   |
| workflow.enqueue | count, levels, duration         | workflow_id, name, job_ids (by step)     |
| batch.seal      | total, completed, discarded,     | batch_id, schema, finished,              |
|                 | cancelled, duration              | callback_ids                             |
| fanout.delivery | (none)                           | job_id, queue, node, outcome             |
| fanout.finish   | count                            | job_ids, node, source (delivery|sweep)   |
| flow.defer      | wait                             | job, node, reason, key                   |
| breaker.transition | calls, failures               | key, worker, partition, from, to, node   |
| shed.change     | latency, target                  | queue, node, shedding, min_priority      |
| workflow.release | (none)                          | id, queue, worker, parent, schema, node  |
| workflow.cancel | (none)                           | id, queue, worker, parent, parent_state, |
|                 |                                  | schema, node                             |
| batch.callback  | total, completed, discarded,     | id, queue, worker, batch_id, when,       |
|                 | cancelled                        | schema, node                             |
| job.forward     | (none)                           | id, queue, worker, from_id, from_queue,  |
|                 |                                  | state, schema, node                      |

`job.cancel` carries `source: "operator"` when the job was cancelled from outside while it
executed (`shigoto cancel`, `cancel_by`; the runner checked the row is cancelled first); a
worker's own `Cancel` outcome has no `source` key.

`batch.seal` comes from the client when a `with shigoto.batch(...)` block seals its batch;
`finished` is true when the seal itself enqueued the callbacks (every job had already finished).
Otherwise the transaction of the last job's final transition enqueues them, in the database.

`workflow.release`, `workflow.cancel`, `batch.callback` and `job.forward` are transitions
that the database's triggers make (a child released or cancelled because of its parent, with
`parent` null when it was released at insert; a batch callback enqueued, `id` being the new
job; a job forwarded, `id` being the copy in `queue`). The triggers announce them at commit and
the leading runner emits them, once for the fleet, with its own `node`: see
`shigoto.relations.events`. They are not emitted while no runner leads.

`flow.defer` (docs/flow-control.md): a claimed job that a rate limit, an open circuit breaker
or its worker's `concurrency` did not admit was handed back without consuming its attempt;
`reason` is `rate_limit`, `circuit_open` or `concurrency`, `wait` the seconds until it may be
claimed again, `key` the limit's or breaker's key. `breaker.transition`: a circuit breaker
moved between `closed`, `open` and `half_open` (`calls`, `failures`: its window then).
`shed.change`: a runner's load shedding on a queue started or stopped, or changed the lowest
priority it still claims (`min_priority`, None when it claims every priority).

`job.insert` comes from the one insert path (`db.inserts`) for every enqueue, bulk enqueue and
cron slot (`source`: `enqueue`, `enqueue_many`, `cron`); `count` is the jobs written,
`conflicts` the unique keys that already had a job. Inside the caller's transaction it is
emitted before that transaction commits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("shigoto.telemetry")

EVENTS = frozenset({
    "job.insert", "job.start", "job.stop", "job.exception", "job.discard", "job.snooze",
    "job.cancel", "producer.claim", "stager.stage", "pruner.prune", "completer.flush",
    "completer.error", "cron.enqueue", "rescuer.rescue", "queue.pause", "queue.resume",
    "queue.forward",
    "batch.seal",
    "workflow.enqueue", "fanout.delivery", "fanout.finish",
    "workflow.release", "workflow.cancel", "batch.callback", "job.forward",
    "flow.defer", "breaker.transition", "shed.change",
})  # fmt: skip

Handler = Callable[[str, dict[str, Any], dict[str, Any]], Any]

_lock = threading.Lock()
_handlers: dict[int, tuple[Handler, frozenset[str]]] = {}
_next_id = 0


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
        return _next_id


def detach(handle: int) -> None:
    with _lock:
        _handlers.pop(handle, None)


def emit(event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
    for handler, wanted in list(_handlers.values()):
        if event not in wanted:
            continue
        try:
            handler(event, measurements, metadata)
        except Exception:
            log.exception("telemetry handler %r failed on %s; ignored", handler, event)
