"""Validation and normalisation of enqueue input (pure; no database)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

import shigoto
from shigoto import jobspec
from shigoto.config import MAX_QUEUE_NAME
from tests.support import workers


def field_of(excinfo: pytest.ExceptionInfo[shigoto.ValidationError]) -> str:
    return excinfo.value.field


def test_minimal_by_name_leaves_worker_settings_to_run_time() -> None:
    spec = jobspec.build("billing.send", {"invoice_id": 42})
    assert spec.worker == "billing.send"
    assert json.loads(spec.args_json) == {"invoice_id": 42}
    assert spec.queue == "default"
    assert spec.priority == 0
    assert spec.max_attempts is None
    assert spec.timeout is None
    assert spec.scheduled_at is None
    assert spec.delay == 0.0
    assert spec.tags == []
    assert json.loads(spec.meta_json) == {}


def test_args_default_to_an_empty_object() -> None:
    assert json.loads(jobspec.build("w").args_json) == {}


def test_options_are_normalised() -> None:
    spec = jobspec.build(
        "w", {"a": [1, "x", None, True, 1.5]}, queue="emails", priority=-3, max_attempts=9,
        timeout=timedelta(minutes=2), schedule_in=timedelta(seconds=90), tags=("a", "b"),
        meta={"trace": "abc"},
    )  # fmt: skip
    assert spec.queue == "emails"
    assert spec.priority == -3
    assert spec.max_attempts == 9
    assert spec.timeout == 120.0
    assert spec.delay == 90.0
    assert spec.tags == ["a", "b"]
    assert json.loads(spec.meta_json) == {"trace": "abc"}


def test_aware_scheduled_at_is_kept() -> None:
    at = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    spec = jobspec.build("w", scheduled_at=at)
    assert spec.scheduled_at == at
    assert spec.delay == 0.0


def test_worker_object_supplies_its_defaults() -> None:
    spec = jobspec.build(workers.with_defaults, {})
    assert spec.worker == "tests.support.workers.with_defaults"
    assert (spec.queue, spec.priority, spec.max_attempts, spec.timeout, spec.tags) == (
        "defaults-q", 3, 7, 42.0, ["from-worker"],
    )  # fmt: skip


def test_worker_class_supplies_its_defaults() -> None:
    spec = jobspec.build(workers.ClassWithDefaults)
    assert spec.worker == "tests.support.workers.ClassWithDefaults"
    assert (spec.queue, spec.priority, spec.max_attempts, spec.timeout, spec.tags) == (
        "class-q", 4, 6, 24.0, ["class-tag"],
    )  # fmt: skip


def test_explicit_options_win_over_worker_defaults() -> None:
    spec = jobspec.build(
        workers.with_defaults, {}, queue="other", priority=0, max_attempts=1, timeout=1,
        tags=[],
    )  # fmt: skip
    assert (spec.queue, spec.priority, spec.max_attempts, spec.timeout, spec.tags) == (
        "other", 0, 1, 1.0, [],
    )  # fmt: skip


def test_worker_defaults_do_not_apply_by_name() -> None:
    spec = jobspec.build("tests.support.workers.with_defaults", {})
    assert (spec.queue, spec.priority, spec.max_attempts, spec.timeout, spec.tags) == (
        "default", 0, None, None, [],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "options", "field"),
    [
        ({}, {"priorty": 1}, "priorty"),
        ({}, {"unique_by": ["args"]}, "unique_by"),
        ([1, 2], {}, "args"),
        ("{}", {}, "args"),
        ({1: "x"}, {}, "args"),
        ({"x": object()}, {}, "args"),
        ({"x": float("nan")}, {}, "args"),
        ({"x": {1, 2}}, {}, "args"),
        ({"x": "nul\x00"}, {}, "args"),
        ({"x": "lone \ud800"}, {}, "args"),
        ({"\udc80": 1}, {}, "args"),
        ({}, {"queue": ""}, "queue"),
        ({}, {"queue": "q" * (MAX_QUEUE_NAME + 1)}, "queue"),
        ({}, {"queue": 5}, "queue"),
        ({}, {"max_attempts": 0}, "max_attempts"),
        ({}, {"max_attempts": -1}, "max_attempts"),
        ({}, {"max_attempts": 2.5}, "max_attempts"),
        ({}, {"max_attempts": True}, "max_attempts"),
        ({}, {"priority": 2**31}, "priority"),
        ({}, {"priority": "high"}, "priority"),
        ({}, {"timeout": 0}, "timeout"),
        ({}, {"timeout": float("inf")}, "timeout"),
        ({}, {"scheduled_at": datetime(2030, 1, 1)}, "scheduled_at"),
        ({}, {"scheduled_at": "2030-01-01T00:00:00Z"}, "scheduled_at"),
        ({}, {"schedule_in": -1}, "schedule_in"),
        ({}, {"schedule_in": float("nan")}, "schedule_in"),
        ({}, {"schedule_in": "soon"}, "schedule_in"),
        ({}, {"tags": "billing"}, "tags"),
        ({}, {"tags": ["ok", ""]}, "tags"),
        ({}, {"meta": ["not", "a", "dict"]}, "meta"),
    ],
)
def test_bad_input_names_the_field(args: object, options: dict, field: str) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build("w", args, **options)
    assert field_of(excinfo) == field
    assert str(excinfo.value).startswith(f"{field}: ")
    assert isinstance(excinfo.value, shigoto.Error)


def test_queue_of_maximum_length_is_accepted() -> None:
    assert jobspec.build("w", queue="q" * MAX_QUEUE_NAME).queue == "q" * MAX_QUEUE_NAME


def test_scheduled_at_and_schedule_in_together_are_rejected() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build("w", scheduled_at=datetime.now(UTC), schedule_in=5)
    assert field_of(excinfo) in {"scheduled_at", "schedule_in"}
    assert "scheduled_at" in str(excinfo.value)
    assert "schedule_in" in str(excinfo.value)


def test_unknown_option_message_lists_the_known_ones() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build("w", priorty=1)
    assert "priority" in excinfo.value.message


@pytest.mark.parametrize("worker", ["", "   ", "x" * 256, 42, None])
def test_bad_worker_is_rejected(worker: object) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build(worker)
    assert field_of(excinfo) == "worker"


def test_worker_defaults_are_validated_too() -> None:
    """A worker object's default goes through the same checks as an explicit option."""

    class BadQueue(shigoto.Worker, template=True):
        name = "tests.bad_queue"
        queue = ""

        def perform(self, args: dict) -> None: ...

    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build(BadQueue())
    assert field_of(excinfo) == "queue"


def test_build_many_names_index_and_field() -> None:
    entries = [
        {"worker": "w", "args": {"i": 0}},
        {"worker": "w", "args": {"i": 1}},
        {"worker": "w", "args": {"i": 2}, "queue": ""},
    ]
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build_many(entries)
    assert field_of(excinfo) == "jobs[2].queue"


@pytest.mark.parametrize(
    ("entries", "field"),
    [
        ({"worker": "w"}, "jobs"),
        ("w", "jobs"),
        ([{"worker": "w"}, "w"], "jobs[1]"),
        ([{"args": {}}], "jobs[0].worker"),
        ([{"worker": "w", "priorty": 1}], "jobs[0].priorty"),
        ([{"worker": "w", "args": [1]}], "jobs[0].args"),
    ],
)
def test_build_many_rejects_malformed_batches(entries: object, field: str) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build_many(entries)
    assert field_of(excinfo) == field


def test_build_many_keeps_order_and_options() -> None:
    specs = jobspec.build_many(
        [{"worker": "w", "args": {"i": i}, "priority": i, "queue": f"q{i % 2}"} for i in range(5)]
    )
    assert [json.loads(s.args_json)["i"] for s in specs] == [0, 1, 2, 3, 4]
    assert [s.priority for s in specs] == [0, 1, 2, 3, 4]
    assert [s.queue for s in specs] == ["q0", "q1", "q0", "q1", "q0"]


def test_as_params_carries_every_column() -> None:
    params = jobspec.build("w", {"a": 1}, tags=["t"], schedule_in=3).as_params()
    assert params["worker"] == "w"
    assert json.loads(params["args"]) == {"a": 1}
    assert params["tags"] == ["t"]
    assert params["delay"] == 3.0
    assert params["scheduled_at"] is None
