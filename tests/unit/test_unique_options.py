"""Unique jobs without a database: option validation, the key, and how a batch's duplicates
fold into one job."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import shigoto
from shigoto import jobspec
from shigoto.relations import unique
from shigoto.relations.unique import UniqueOptions


def key(worker: str = "app.w", args: Any = None, **options: Any) -> str:
    """The stored key a job would get (the part of `unique_key` before its options)."""
    spec = jobspec.build(worker, args, **options)
    assert spec.unique_key is not None
    found = unique.split(spec.unique_key)
    assert found is not None
    return found[0]


def field_of(value: Any, **extra: Any) -> str:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build("app.w", {"user_id": 1}, unique=value, **extra)
    return excinfo.value.field


# -- options ---------------------------------------------------------------------------------


def test_defaults_are_worker_queue_args_and_the_live_states_plus_completed() -> None:
    assert unique.parse({}) == UniqueOptions(
        keys=("worker", "queue", "args"),
        states=("scheduled", "available", "executing", "retryable", "completed"),
        period=None, replace=(), debounce=None,
    )  # fmt: skip
    assert unique.parse(True) == unique.parse({})
    assert unique.parse(None) is None and unique.parse(False) is None


def test_options_are_normalised() -> None:
    parsed = unique.parse({
        "keys": ["args.user_id", "worker"], "states": [shigoto.JobState.AVAILABLE, "available"],
        "period": timedelta(minutes=5), "replace": ["args", "args"], "debounce": 2,
    })  # fmt: skip
    assert parsed == UniqueOptions(keys=("args.user_id", "worker"), states=("available",),
                                   period=300.0, replace=("args",), debounce=2.0)  # fmt: skip


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("worker", "unique"),
        ({"keyz": []}, "unique.keyz"),
        ({"keys": "args"}, "unique.keys"),
        ({"keys": []}, "unique.keys"),
        ({"keys": ["worker", "argz"]}, "unique.keys[1]"),
        ({"keys": ["worker", "args."]}, "unique.keys[1]"),
        ({"keys": ["args.a..b"]}, "unique.keys[0]"),
        ({"keys": ["worker", 3]}, "unique.keys[1]"),
        ({"keys": ["worker", "worker"]}, "unique.keys[1]"),
        ({"states": ["available", "running"]}, "unique.states[1]"),
        ({"states": []}, "unique.states"),
        ({"period": 0}, "unique.period"),
        ({"period": -5}, "unique.period"),
        ({"period": float("inf")}, "unique.period"),
        ({"period": "5m"}, "unique.period"),
        ({"period": True}, "unique.period"),
        ({"replace": ["args", "state"]}, "unique.replace[1]"),
        ({"replace": "args"}, "unique.replace"),
        ({"debounce": 0}, "unique.debounce"),
        ({"debounce": float("nan")}, "unique.debounce"),
    ],
)
def test_bad_options_name_the_option(value: Any, field: str) -> None:
    assert field_of(value) == field


def test_the_message_says_how_to_fix_it() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build("app.w", {}, unique={"keys": ["worker", "argz"]})
    assert "args.user_id" in excinfo.value.message and "worker" in excinfo.value.message
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build("app.w", {}, unique={"states": ["done"]})
    assert "completed" in excinfo.value.message


def test_a_dotted_key_missing_from_the_args_is_refused() -> None:
    assert field_of({"keys": ["worker", "args.account_id"]}) == "unique.keys[1]"
    assert field_of({"keys": ["args.user_id.deep"]}) == "unique.keys[0]"


def test_enqueue_many_names_the_entry() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build_many([{"worker": "w"}, {"worker": "w", "unique": {"period": -1}}])
    assert excinfo.value.field == "jobs[1].unique.period"


# -- the key ---------------------------------------------------------------------------------


def test_the_key_is_the_chosen_fields_whatever_their_order() -> None:
    a = key("app.w", {"a": 1, "b": {"x": 1, "y": 2}}, unique=True)
    b = key("app.w", {"b": {"y": 2, "x": 1}, "a": 1}, unique=True)
    assert a == b and a.startswith("unique:")
    assert key("app.w", {"a": 1.0, "b": {"x": 1, "y": 2}}, unique=True) == a  # 1.0 == 1
    assert key("app.w", {"a": 2, "b": {"x": 1, "y": 2}}, unique=True) != a
    assert key("app.other", {"a": 1, "b": {"x": 1, "y": 2}}, unique=True) != a
    assert key("app.w", {"a": 1, "b": {"x": 1, "y": 2}}, queue="q2", unique=True) != a


def test_a_dotted_key_uses_only_that_field() -> None:
    options = {"keys": ["worker", "args.user.id"]}
    a = key("app.w", {"user": {"id": 7}, "n": 1}, unique=options)
    assert key("app.w", {"user": {"id": 7, "name": "x"}, "n": 2}, unique=options) == a
    assert key("app.w", {"user": {"id": 8}, "n": 1}, unique=options) != a
    # Without "worker" in the keys, every worker shares the key.
    assert key("a.one", {"user_id": 1}, unique={"keys": ["args.user_id"]}) == key(
        "a.two", {"user_id": 1}, unique={"keys": ["args.user_id"]}
    )


def test_the_options_travel_with_the_spec_and_unique_false_turns_a_default_off() -> None:
    spec = jobspec.build("app.w", {}, unique={"states": ["available"], "period": 60})
    assert spec.unique_key is not None
    _, options = unique.split(spec.unique_key)  # type: ignore[misc]
    assert options.states == ("available",) and options.period == 60.0
    assert unique.split("cron:nightly:2026-01-01T03:00Z") is None  # cron's keys pass through


def test_debounce_delays_a_new_job_unless_it_has_a_time() -> None:
    assert jobspec.build("app.w", {}, unique={"debounce": 5}).delay == 5.0
    assert jobspec.build("app.w", {}, schedule_in=60, unique={"debounce": 5}).delay == 60.0
    at = datetime(2030, 1, 1, tzinfo=UTC)
    spec = jobspec.build("app.w", {}, scheduled_at=at, unique={"debounce": 5})
    assert (spec.scheduled_at, spec.delay) == (at, 0.0)


# -- worker defaults -------------------------------------------------------------------------


def test_a_worker_default_applies_and_an_enqueue_replaces_or_disables_it() -> None:
    @shigoto.worker(name="tests.unit.unique_default", unique={"keys": ["worker"]})
    def job(n: int = 0) -> None: ...

    assert key(job, {"n": 1}) == key(job, {"n": 2})  # the worker keys on its name only
    assert key(job, {"n": 1}, unique={"keys": ["args"]}) != key(job, {"n": 2}, unique=True)
    assert jobspec.build(job, {"n": 1}, unique=False).unique_key is None
    assert job.defaults()["unique"] == {"keys": ["worker"]}


def test_a_bad_worker_default_is_refused_when_the_worker_is_defined() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        shigoto.worker(name="tests.unit.unique_bad", unique={"states": ["nope"]})(lambda: None)
    assert excinfo.value.field == "unique.states[0]"
    assert "tests.unit.unique_bad" in excinfo.value.message

    with pytest.raises(shigoto.ValidationError, match=r"unique\.period"):

        class Bad(shigoto.Worker):
            name = "tests.unit.unique_bad_class"
            unique = {"period": 0}

            def perform(self, args: dict[str, Any]) -> None: ...


# -- a batch's duplicates --------------------------------------------------------------------


def test_duplicates_in_a_batch_fold_into_the_first_with_later_replacements() -> None:
    replace = {"keys": ["worker"], "replace": ["args", "priority"]}
    specs = [
        jobspec.build("app.w", {"n": 1}, priority=1, unique=replace),
        jobspec.build("app.x", {"n": 9}, unique=True),
        jobspec.build("app.w", {"n": 2}, priority=2, unique=replace),
        jobspec.build("app.w", {"n": 3}, priority=3, unique={"keys": ["worker"]}),
    ]
    work = unique.plan(specs)
    assert work.keys[0] == work.keys[2] == work.keys[3] != work.keys[1]
    folded = work.folded[work.keys[0]]
    # The second replaces args and priority; the third replaces nothing.
    assert (json.loads(folded.args_json), folded.priority) == ({"n": 2}, 2)
    entries = json.loads(work.payload)
    assert [e["key"] for e in entries] == [work.keys[0], work.keys[1]]  # one per key
    assert entries[0]["args"] == {"n": 2} and entries[0]["replace"] == ["args", "priority"]
    assert "args" not in entries[1]  # values travel only for replaced fields

    # No holder: the first is written folded, the rest conflict with it in the write.
    out = work.outcome(specs, {})
    assert json.loads(out[0].args_json) == {"n": 2}
    assert {s.unique_key for s in out} == {work.keys[0], work.keys[1]}
    # A holder: every duplicate gets it back.
    holder = shigoto.Job(id=5, queue="default", worker="app.w", args={}, state="available",  # type: ignore[arg-type]
                         unique_key=work.keys[0])  # fmt: skip
    out = work.outcome(specs, {work.keys[0]: holder})
    assert [getattr(e, "job", None) for e in out] == [holder, None, holder, holder]
