"""The workflow graph without a database: insertion levels, cycles named, diamonds accepted, and
the validation of `depends_on`, `on_parent_failure` and the builder's steps."""

from __future__ import annotations

from typing import Any

import pytest

import shigoto
from shigoto.client.workflow import workflow
from shigoto.jobspec import build
from shigoto.relations.workflows import levels, parent_ids


def test_a_diamond_is_levelled_not_refused() -> None:
    assert levels({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}) == [
        ["a"], ["b", "c"], ["d"],
    ]  # fmt: skip


def test_a_parent_and_its_parent_as_parents_is_not_a_cycle() -> None:
    """The seed's flaw: listing a parent and that parent's parent was taken for a cycle."""
    assert levels({"a": [], "b": ["a"], "c": ["b", "a"]}) == [["a"], ["b"], ["c"]]


def test_steps_may_name_parents_added_later() -> None:
    assert levels({"d": ["b"], "b": ["a"], "a": []}) == [["a"], ["b"], ["d"]]


@pytest.mark.parametrize(
    ("edges", "named"),
    [
        ({"a": ["c"], "b": ["a"], "c": ["b"]}, "a → b → c → a"),
        ({"x": [], "a": ["x", "b"], "b": ["a"]}, "a → b → a"),
        ({"r": [], "a": ["r", "d"], "b": ["a"], "c": ["b"], "d": ["c"], "e": ["d"]},
         "a → b → c → d → a"),
    ],
)  # fmt: skip
def test_a_cycle_is_refused_naming_it(edges: dict[str, list[str]], named: str) -> None:
    with pytest.raises(shigoto.ValidationError, match=named) as raised:
        levels(edges)
    assert raised.value.field == "after"


def test_an_unknown_step_and_a_step_after_itself_are_refused() -> None:
    with pytest.raises(shigoto.ValidationError, match="'ghost', which is not a step"):
        levels({"a": ["ghost"]})
    with pytest.raises(shigoto.ValidationError, match="cannot run after itself"):
        levels({"a": ["a"]})


def test_depends_on_takes_ids_and_jobs_once_each() -> None:
    job = shigoto.Job(id=7, queue="default", worker="w", args={}, state=shigoto.JobState.COMPLETED)
    assert parent_ids([3, job, 3]) == (3, 7)


@pytest.mark.parametrize("bad", ["12", 12, [0], [-1], [True], [1.5], {"a": 1}, [None]])
def test_bad_depends_on_names_the_field(bad: Any) -> None:
    with pytest.raises(shigoto.ValidationError) as raised:
        build("w", {}, depends_on=bad)
    assert raised.value.field == "depends_on"


def test_options_of_a_dependent_job() -> None:
    spec = build("w", {}, depends_on=[1, 2])
    assert spec.depends_on == (1, 2) and spec.on_parent_failure == "cancel"
    assert build("w", {}, depends_on=[1], on_parent_failure="run").on_parent_failure == "run"
    assert build("w", {}, depends_on=[]).depends_on == ()
    with pytest.raises(shigoto.ValidationError) as raised:
        build("w", {}, depends_on=[1], on_parent_failure="skip")
    assert raised.value.field == "on_parent_failure"
    with pytest.raises(shigoto.ValidationError, match="applies only to a job with parents"):
        build("w", {}, on_parent_failure="run")
    with pytest.raises(shigoto.ValidationError) as raised:
        build("w", {}, depends_on=[1], schedule_in=60)
    assert raised.value.field == "schedule_in"


def test_the_builder_checks_each_step_as_it_is_added() -> None:
    wf = workflow("w").add("a", "w", {})
    with pytest.raises(shigoto.ValidationError, match="already has a step 'a'"):
        wf.add("a", "w", {})
    with pytest.raises(shigoto.ValidationError) as raised:
        wf.add("b", "w", {}, after=["a"], priority="high")
    assert raised.value.field == "priority"
    with pytest.raises(shigoto.ValidationError) as raised:
        wf.add("b", "w", {}, depends_on=[1])
    assert raised.value.field == "depends_on"
    with pytest.raises(shigoto.ValidationError) as raised:
        wf.add("b", "w", {}, on_parent_failure="run")
    assert raised.value.field == "on_parent_failure"
    with pytest.raises(shigoto.ValidationError) as raised:
        wf.add("b", "w", {}, after="a")  # type: ignore[arg-type]
    assert raised.value.field == "after"
    with pytest.raises(shigoto.ValidationError, match="has no steps"):
        workflow().enqueue(database_url="postgresql://nowhere")
