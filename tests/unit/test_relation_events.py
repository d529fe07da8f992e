"""Parsing the relation triggers' NOTIFY payloads: anyone who can connect may NOTIFY, so only
known events of this schema, with their known fields, become telemetry."""

from __future__ import annotations

import json

import pytest

from shigoto import telemetry
from shigoto.relations import events


def payload(schema: str = "public", **fields: object) -> str:
    return f"{schema}.{json.dumps(fields)}"


def test_a_release_becomes_its_event_with_the_leader_node() -> None:
    event = events.parse(
        payload(event="workflow.release", id=3, queue="q", worker="w", parent=1, extra="x"),
        schema="public", node="n1",
    )  # fmt: skip
    assert event == events.RelationEvent(
        "workflow.release", {},
        {"id": 3, "queue": "q", "worker": "w", "parent": 1, "schema": "public", "node": "n1"},
    )  # fmt: skip


def test_a_batch_callback_carries_the_counts_as_measurements() -> None:
    event = events.parse(
        payload(event="batch.callback", id=9, queue="q", worker="w", batch_id=2,
                when="finished", total=3, completed=2, discarded=1, cancelled=0),
        schema="public", node="n1",
    )  # fmt: skip
    assert event is not None
    assert event.measurements == {"total": 3, "completed": 2, "discarded": 1, "cancelled": 0}
    assert event.metadata["batch_id"] == 2


@pytest.mark.parametrize("raw", [
    "other." + json.dumps({"event": "job.forward", "queue": "q"}),  # another schema
    "public.not json",
    "public." + json.dumps(["job.forward"]),
    "public." + json.dumps({"event": "job.stop", "queue": "q"}),  # not a relation event
    "public." + json.dumps({"event": "job.forward", "queue": 7}),
    "public." + json.dumps({"event": "job.forward"}),
    "",
])  # fmt: skip
def test_anything_else_is_ignored(raw: str) -> None:
    assert events.parse(raw, schema="public", node="n1") is None


def test_every_relation_event_is_a_known_telemetry_event() -> None:
    assert set(events.FIELDS) <= telemetry.EVENTS
