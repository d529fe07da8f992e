"""shigoto.testing's manual and inline modes honour the job relations of issue 10: unique keys
(conflict, states, period, replace, debounce), workflows (waiting, release, parent_results,
cancel cascade, the "run" policy, the builder) and refuse batches clearly. No database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import shigoto
from shigoto import testing
from shigoto.job import JobState
from shigoto.relations import workflows
from shigoto.relations.batches import BatchRef

NOWHERE = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=1"

#: What the workers below performed, in order.
CALLS: list[str] = []


@shigoto.worker
def step(name: str) -> str:
    CALLS.append(name)
    return name.upper()


@shigoto.worker
def collect(name: str) -> dict[str, Any]:
    """Returns the parents' results it saw, keyed by parent id (as text: results are JSON)."""
    CALLS.append(name)
    return {str(k): v for k, v in shigoto.current_job().parent_results.items()}


@shigoto.worker
def fail(name: str) -> shigoto.Discard:
    CALLS.append(name)
    return shigoto.Discard(f"{name} gave up")


@shigoto.worker
def spawn(name: str) -> str:
    """Enqueues a child of itself, which must wait until this perform has finished."""
    CALLS.append(name)
    shigoto.enqueue(step, {"name": f"{name}.child"}, depends_on=[shigoto.current_job().id])
    CALLS.append(f"{name} done")
    return name


@shigoto.worker
def batch_done(batch: dict[str, int], name: str) -> None:
    CALLS.append(name)


@pytest.fixture(autouse=True)
def no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to reach a database would fail loudly; every test starts with no calls."""
    monkeypatch.setenv("SHIGOTO_DATABASE_URL", NOWHERE)
    CALLS.clear()


def _step(name: str, **options: Any) -> shigoto.Job:
    return shigoto.enqueue(step, {"name": name}, **options)


# -- unique jobs -----------------------------------------------------------------------------


def test_a_unique_key_returns_its_holder_as_a_conflict() -> None:
    with testing.manual() as recorded:
        first = _step("a", unique=True)
        again = _step("a", unique=True)
        other = _step("b", unique=True)
        assert (again.id, again.conflict, first.conflict) == (first.id, True, False)
        assert other.id != first.id and not other.conflict
        assert [j.id for j in recorded.jobs] == [first.id, other.id]
        assert first.unique_key is not None and first.unique_key.startswith("unique:")


def test_a_holder_outside_the_states_lets_go_of_its_key() -> None:
    waiting_only = {"keys": ["worker", "args"], "states": ["scheduled", "available"]}
    with testing.manual() as recorded:
        first = _step("a", unique=waiting_only)
        assert recorded.drain() == {"completed": 1}
        second = _step("a", unique=waiting_only)
        assert second.id != first.id and not second.conflict
        released = recorded.jobs[0]
        assert (released.state, released.unique_key) == (JobState.COMPLETED, None)
        assert _step("a", unique=waiting_only).id == second.id  # the new holder blocks now


def test_a_holder_older_than_the_period_lets_go_of_its_key() -> None:
    with testing.manual() as recorded:
        first = _step("a", unique={"period": 60})
        assert _step("a", unique={"period": 60}).conflict
        old = datetime.now(UTC) - timedelta(seconds=61)
        recorded.jobs[0] = replace(recorded.jobs[0], inserted_at=old)
        later = _step("a", unique={"period": 60})
        assert later.id != first.id and not later.conflict


def test_replace_overwrites_the_listed_fields_of_a_waiting_holder() -> None:
    options = {"keys": ["worker"], "replace": ["args", "priority"]}
    with testing.manual() as recorded:
        first = _step("a", unique=options, priority=1, tags=["x"])
        again = _step("b", unique=options, priority=7, tags=["y"])
        assert again.conflict and again.id == first.id
        assert (again.args, again.priority, again.tags) == ({"name": "b"}, 7, ["x"])
        assert recorded.jobs[0].args == {"name": "b"}
        recorded.drain()
        done = _step("c", unique=options, priority=9)  # a finished holder stays as it is
        assert (done.conflict, done.args, done.priority) == (True, {"name": "b"}, 7)


def test_replacing_scheduled_at_moves_the_holder_and_its_state() -> None:
    options = {"keys": ["worker"], "replace": ["scheduled_at"]}
    with testing.manual():
        first = _step("a", unique=options, schedule_in=600)
        assert first.state == JobState.SCHEDULED
        now = _step("a", unique=options)
        assert now.conflict and now.state == JobState.AVAILABLE
        assert now.scheduled_at is not None and now.scheduled_at <= datetime.now(UTC)


def test_debounce_delays_the_job_and_each_conflict_pushes_it() -> None:
    options = {"keys": ["worker"], "states": ["scheduled", "available"], "debounce": 30}
    with testing.manual() as recorded:
        first = _step("a", unique=options)
        assert first.state == JobState.SCHEDULED
        assert first.scheduled_at is not None
        assert first.scheduled_at > datetime.now(UTC) + timedelta(seconds=25)
        earlier = datetime.now(UTC) + timedelta(seconds=5)
        recorded.jobs[0] = replace(recorded.jobs[0], scheduled_at=earlier)
        pushed = _step("a", unique=options)
        assert pushed.conflict and pushed.scheduled_at is not None
        assert pushed.scheduled_at > datetime.now(UTC) + timedelta(seconds=25)
        assert len(recorded.jobs) == 1


def test_enqueue_many_folds_one_key_into_one_job() -> None:
    options = {"keys": ["worker"], "replace": ["args"]}
    with testing.manual() as recorded:
        jobs = shigoto.enqueue_many([
            {"worker": step, "args": {"name": "a"}, "unique": options},
            {"worker": step, "args": {"name": "b"}, "unique": options},
            {"worker": step, "args": {"name": "free"}},
        ])  # fmt: skip
        assert [j.conflict for j in jobs] == [False, True, False]
        assert jobs[0].id == jobs[1].id and jobs[0].args == {"name": "b"}
        assert len(recorded.jobs) == 2
        again = shigoto.enqueue_many([{"worker": step, "args": {"name": "c"}, "unique": options}])
        assert again[0].conflict and again[0].args == {"name": "c"}


def test_inline_mode_does_not_run_a_conflict_again() -> None:
    with testing.inline():
        first = _step("a", unique=True)
        again = _step("a", unique=True)
    assert (first.state, again.state, again.conflict) == (JobState.COMPLETED,) * 2 + (True,)
    assert CALLS == ["a"]


# -- workflows -------------------------------------------------------------------------------


def test_an_unknown_parent_is_refused_as_in_production() -> None:
    with testing.manual() as recorded:
        parent = _step("a")
        with pytest.raises(shigoto.ValidationError) as err:
            shigoto.enqueue_many([
                {"worker": step, "args": {"name": "b"}, "depends_on": [parent.id]},
                {"worker": step, "args": {"name": "c"}, "depends_on": [parent.id, 99]},
            ])  # fmt: skip
        assert recorded.jobs == [parent]  # nothing of the call was recorded
    with pytest.raises(shigoto.ValidationError) as production:
        workflows._unknown([99], {parent.id: "available"})
    assert (err.value.field, err.value.message) == ("depends_on", production.value.message)


def _diamond() -> dict[str, shigoto.Job]:
    a = _step("a")
    b = _step("b", depends_on=[a.id])
    c = _step("c", depends_on=[a.id])
    d = shigoto.enqueue(collect, {"name": "d"}, depends_on=[b.id, c.id])
    return {"a": a, "b": b, "c": c, "d": d}


def test_a_diamond_waits_and_drains_in_order_in_manual_mode() -> None:
    with testing.manual() as recorded:
        jobs = _diamond()
        for name in "bcd":
            assert jobs[name].state == JobState.SCHEDULED
            assert jobs[name].scheduled_at == workflows.WAITING_AT
        assert recorded.drain(with_scheduled=True) == {"completed": 4}
        assert CALLS == ["a", "b", "c", "d"]
        d = testing.assert_enqueued(collect, state="completed")
    assert d.result == {str(jobs["b"].id): "B", str(jobs["c"].id): "C"}


def test_drain_leaves_a_child_whose_parent_has_not_run() -> None:
    with testing.manual() as recorded:
        a = _step("a", queue="first")
        _step("b", depends_on=[a.id])
        assert recorded.drain("default", with_scheduled=True) == {}
        assert recorded.drain("first") == {"completed": 1}
        assert recorded.drain("default") == {"completed": 1}
    assert CALLS == ["a", "b"]


def test_a_diamond_runs_in_inline_mode_with_the_parents_results() -> None:
    with testing.inline():
        jobs = _diamond()
    assert [jobs[n].state for n in "abcd"] == [JobState.COMPLETED] * 4
    assert jobs["d"].result == {str(jobs["b"].id): "B", str(jobs["c"].id): "C"}
    assert CALLS == ["a", "b", "c", "d"]


def test_inline_mode_runs_a_released_child_right_after_its_parent() -> None:
    with testing.inline() as recorded:
        parent = shigoto.enqueue(spawn, {"name": "p"})
    assert CALLS == ["p", "p done", "p.child"]
    child = recorded.jobs[1]
    assert (parent.state, child.state, child.depends_on) == (
        JobState.COMPLETED, JobState.COMPLETED, [parent.id])  # fmt: skip


def test_a_failed_parent_cancels_its_children_and_their_descendants() -> None:
    with testing.manual() as recorded:
        a = shigoto.enqueue(fail, {"name": "a"})
        b = _step("b", depends_on=[a.id])
        c = _step("c", depends_on=[b.id])
        rescue = shigoto.enqueue(collect, {"name": "r"}, depends_on=[b.id],
                                 on_parent_failure="run")  # fmt: skip
        assert recorded.drain() == {"discarded": 1, "completed": 1}
        by_id = {j.id: j for j in recorded.jobs}
    assert CALLS == ["a", "r"]
    assert [by_id[j.id].state for j in (b, c)] == [JobState.CANCELLED] * 2
    assert [e["error"] for e in by_id[b.id].errors] == [
        f"parent job {a.id} was discarded, and on_parent_failure is 'cancel'"]  # fmt: skip
    assert by_id[c.id].errors[0]["error"] == (
        f"parent job {b.id} was cancelled, and on_parent_failure is 'cancel'")  # fmt: skip
    assert (by_id[c.id].errors[0]["attempt"], by_id[c.id].errors[0]["traceback"]) == (0, None)
    assert by_id[c.id].finished_at is not None
    assert by_id[rescue.id].result == {str(b.id): None}


def test_the_run_policy_runs_the_child_with_none_for_the_failed_parent() -> None:
    with testing.inline():
        a = shigoto.enqueue(fail, {"name": "a"})
        ok = _step("ok")
        child = shigoto.enqueue(collect, {"name": "c"}, depends_on=[a.id, ok.id],
                                on_parent_failure="run")  # fmt: skip
    assert child.state == JobState.COMPLETED
    assert child.result == {str(a.id): None, str(ok.id): "OK"}


def test_a_child_of_an_already_failed_parent_is_cancelled_at_once() -> None:
    with testing.inline():
        a = shigoto.enqueue(fail, {"name": "a"})
        child = _step("b", depends_on=[a.id])
    assert child.state == JobState.CANCELLED
    assert child.errors[0]["error"].startswith(f"parent job {a.id} was discarded")
    assert CALLS == ["a"]


async def test_async_enqueue_waits_for_parents_too() -> None:
    with testing.manual() as recorded:
        a = await shigoto.aenqueue(step, {"name": "a"})
        b = await shigoto.aenqueue(collect, {"name": "b"}, depends_on=[a.id])
        assert b.state == JobState.SCHEDULED
        assert recorded.drain() == {"completed": 2}
        assert recorded.jobs[1].result == {str(a.id): "A"}


def _builder() -> shigoto.Workflow:
    wf = shigoto.workflow("diamond")
    wf.add("d", collect, {"name": "d"}, after=["b", "c"])
    wf.add("b", step, {"name": "b"}, after=["a"])
    wf.add("c", step, {"name": "c"}, after=["a"])
    wf.add("a", step, {"name": "a"})
    return wf


def test_the_workflow_builder_goes_through_manual_mode() -> None:
    with testing.manual() as recorded:
        jobs = _builder().enqueue()
        assert [jobs[n].state for n in "abcd"] == [JobState.AVAILABLE] + [JobState.SCHEDULED] * 3
        assert recorded.drain() == {"completed": 4}
        assert recorded.jobs[-1].result == {str(jobs["b"].id): "B", str(jobs["c"].id): "C"}
    assert CALLS == ["a", "b", "c", "d"]


async def test_the_workflow_builder_runs_in_inline_mode() -> None:
    with testing.inline():
        jobs = await _builder().aenqueue()
    assert jobs["d"].state == JobState.COMPLETED
    assert jobs["d"].result == {str(jobs["b"].id): "B", str(jobs["c"].id): "C"}


def test_the_workflow_builder_needs_no_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHIGOTO_DATABASE_URL")
    with testing.manual():
        assert len(_builder().enqueue()) == 4


# -- batches ---------------------------------------------------------------------------------


def test_batch_jobs_are_refused_with_a_clear_error() -> None:
    opened = BatchRef("public")  # what an entered shigoto.batch(...) hands to its jobs
    opened.id = 7
    with testing.manual() as recorded:
        with pytest.raises(shigoto.ConfigurationError, match="drain_queue"):
            shigoto.enqueue(step, {"name": "a"}, batch=opened)
        assert recorded.jobs == []


def test_a_batch_without_a_database_url_fails_before_its_block() -> None:
    with (
        pytest.MonkeyPatch.context() as patch,
        testing.manual(),
        pytest.raises(shigoto.ConfigurationError, match="no database configured"),
    ):
        patch.delenv("SHIGOTO_DATABASE_URL")
        shigoto.batch(callback=batch_done, callback_args={"name": "done"})


def test_the_testing_modes_keep_the_partition_key() -> None:
    with testing.manual() as recorded:
        job = shigoto.enqueue(step, {"name": "a"}, partition_key="tenant-7")
    assert job.partition_key == "tenant-7"
    assert recorded.all_enqueued(step)[0].partition_key == "tenant-7"
