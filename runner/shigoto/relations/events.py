"""Telemetry for the transitions that the relation steps make inside PostgreSQL.

A child released or cancelled because of its parent, a batch callback enqueued, a job
forwarded: these happen in whatever transaction finished the job that caused them (a runner's
completer, `cancel_by` from a script, the rescuer), so no Python code sees them happen. The
steps (`relations.steps`; the announcements came with migration 0013) announce each one on
`RELATIONS_CHANNEL`, at commit and only at commit, in the order the steps ran; every runner
listens, and the leader alone re-emits them as telemetry events, so each transition is counted
once in the fleet. A transition committed while no runner leads (a failover, or no runner at
all) goes unannounced: telemetry is a view, never the record, and the job rows and `shigoto
status` stay exact.

This module is the pure half: payload in, (event, measurements, metadata) out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

RELATIONS_CHANNEL = "shigoto_relations"

#: The events a payload may name -> the fields its metadata carries (besides schema, node).
FIELDS: dict[str, tuple[str, ...]] = {
    "workflow.release": ("id", "queue", "worker", "parent"),
    "workflow.cancel": ("id", "queue", "worker", "parent", "parent_state"),
    "batch.callback": ("id", "queue", "worker", "batch_id", "when"),
    "job.forward": ("id", "queue", "worker", "from_id", "from_queue", "state"),
}

#: batch.callback's measurements: the batch's counts when its callbacks were enqueued.
BATCH_COUNTS = ("total", "completed", "discarded", "cancelled")


@dataclass(frozen=True)
class RelationEvent:
    name: str
    measurements: dict[str, Any]
    metadata: dict[str, Any]


def parse(payload: str, *, schema: str, node: str) -> RelationEvent | None:
    """The event a `RELATIONS_CHANNEL` payload announces, or None for one of another schema
    or one that is not ours. Any role that can connect may NOTIFY, so a payload is untrusted:
    only the known events and their known fields come through."""
    prefix, _, body = payload.partition(".")
    if prefix != schema:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    name = data.get("event")
    fields = FIELDS.get(name) if isinstance(name, str) else None
    if fields is None or not isinstance(data.get("queue"), str):
        return None
    metadata = {field: data.get(field) for field in fields}
    metadata.update(schema=schema, node=node)
    measurements: dict[str, Any] = {}
    if name == "batch.callback":
        measurements = {key: data.get(key) for key in BATCH_COUNTS}
    return RelationEvent(name, measurements, metadata)


__all__ = ["FIELDS", "RELATIONS_CHANNEL", "RelationEvent", "parse"]
