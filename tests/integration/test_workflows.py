"""Workflows against a real PostgreSQL and real runners: dependency order, parents' results,
failure policies and their cascade, unknown parents, and the races between a parent finishing
and a child being inserted (or two parents finishing at once)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from rich.console import Console

import shigoto
from shigoto.cli.status_view import render_status
from tests.support.in_process import running
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import count, row, state, until, wait_until

STEP = "tests.workflow.step"
WORKERS = "tests.support.workflow_workers"
WAITING = "state = 'scheduled' AND scheduled_at = '9999-12-31 00:00:00+00'"


def _rows(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM shigoto_jobs WHERE id = ANY(%s)", (ids,))
        return {r["id"]: r for r in cur.fetchall()}


def _all_finished(conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    return count(conn, "id = ANY(%s) AND state IN ('completed', 'discarded', 'cancelled')",
                 ids) == len(ids)  # fmt: skip


def _executing_parent(conn: psycopg.Connection[Any]) -> int:
    """A job claimed as a runner would claim it (executing, attempt 1)."""
    job = shigoto.enqueue(STEP, {"name": "parent"}, conn=conn)
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'executing', attempt = 1, attempted_at = now(), "
        "attempted_by = 'test' WHERE id = %s", (job.id,),
    )  # fmt: skip
    return job.id


def _finish(conn: psycopg.Connection[Any], job_id: int, to: str = "completed") -> None:
    """A parent's final transition, as the completer writes it."""
    conn.execute("UPDATE shigoto_jobs SET state = %s, finished_at = now(), "
                 "result = '{\"name\": \"parent\"}' WHERE id = %s", (to, job_id))  # fmt: skip


@pytest.mark.slow
def test_a_four_level_graph_of_50_jobs_runs_in_order_across_3_runners(
    conn: psycopg.Connection[Any], runner_processes: Callable[..., RunnerProcess]
) -> None:
    rng = random.Random(10)
    sizes = [5, 10, 15, 20]
    wf = shigoto.workflow("fifty")
    levels: list[list[str]] = []
    for depth, size in enumerate(sizes):
        names = [f"L{depth}-{i}" for i in range(size)]
        for name in names:
            after: list[str] = []
            if levels:
                after = rng.sample(levels[-1], k=min(3, len(levels[-1])))
                if len(levels) > 1:
                    after.append(rng.choice(levels[-2]))  # a grandparent too: not a cycle
            wf.add(name, STEP, {"name": name}, after=after)
        levels.append(names)
    jobs = wf.enqueue()
    assert len(jobs) == 50
    assert {jobs[n].state for n in levels[0]} == {shigoto.JobState.AVAILABLE}
    assert all(jobs[n].state == shigoto.JobState.SCHEDULED for lv in levels[1:] for n in lv)

    for _ in range(3):
        runner_processes(workers=WORKERS, queue="default=4")
    ids = [job.id for job in jobs.values()]
    wait_until(lambda: _all_finished(conn, ids), timeout=60, message="all 50 finished")

    rows = _rows(conn, ids)
    assert {r["state"] for r in rows.values()} == {"completed"}
    names = {job.id: name for name, job in jobs.items()}
    for child in rows.values():
        parents = child["depends_on"] or []
        for parent in parents:
            assert child["attempted_at"] >= rows[parent]["finished_at"], (
                f"{names[child['id']]} started before its parent {names[parent]} finished"
            )
        assert child["result"]["seen"] == {str(p): names[p] for p in parents}


async def test_a_diamond_runs_each_step_once_after_its_parents(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    wf = (shigoto.workflow("diamond")
          .add("d", STEP, {"name": "d"}, after=["b", "c"])   # added before its parents
          .add("a", STEP, {"name": "a"})
          .add("b", STEP, {"name": "b"}, after=["a"])
          .add("c", STEP, {"name": "c"}, after=["a"]))  # fmt: skip
    jobs = await wf.aenqueue()
    ids = {name: job.id for name, job in jobs.items()}
    async with running(db_url, imports=[WORKERS]):
        await until(lambda: _all_finished(conn, list(ids.values())), message="diamond done")
    rows = _rows(conn, list(ids.values()))
    assert {r["state"] for r in rows.values()} == {"completed"}
    assert {r["attempt"] for r in rows.values()} == {1}
    assert rows[ids["d"]]["result"]["seen"] == {str(ids["b"]): "b", str(ids["c"]): "c"}
    assert rows[ids["d"]]["attempted_at"] >= max(rows[ids["b"]]["finished_at"],
                                                 rows[ids["c"]]["finished_at"])  # fmt: skip


async def test_a_discarded_parent_cancels_down_the_graph_and_run_policy_runs_anyway(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    a = shigoto.enqueue(STEP, {"name": "a", "fail": True}, max_attempts=1)
    b = shigoto.enqueue(STEP, {"name": "b"}, depends_on=[a.id])  # default: cancel
    c = shigoto.enqueue(STEP, {"name": "c"}, depends_on=[b.id], on_parent_failure="run")
    d = shigoto.enqueue(STEP, {"name": "d"}, depends_on=[a.id], on_parent_failure="run")
    async with running(db_url, imports=[WORKERS]):
        await until(lambda: _all_finished(conn, [a.id, b.id, c.id, d.id]), message="resolved")
    assert state(conn, a.id) == "discarded"
    cancelled = row(conn, b.id)
    assert cancelled["state"] == "cancelled" and cancelled["attempt"] == 0
    assert f"parent job {a.id} was discarded" in cancelled["errors"][-1]["error"]
    # c's parent b was cancelled; c runs anyway ("run"), seeing b's missing result.
    assert state(conn, c.id) == "completed"
    assert row(conn, c.id)["result"]["seen"] == {str(b.id): None}
    assert row(conn, d.id)["result"]["seen"] == {str(a.id): None}


def test_cancelling_a_parent_cascades_to_every_descendant(conn: psycopg.Connection[Any]) -> None:
    jobs = (shigoto.workflow("chain").add("a", STEP, {"name": "a"})
            .add("b", STEP, {"name": "b"}, after=["a"])
            .add("c", STEP, {"name": "c"}, after=["b"])
            .add("d", STEP, {"name": "d"}, after=["c", "a"])
            .enqueue(conn=conn))  # fmt: skip
    assert shigoto.cancel_by(ids=[jobs["a"].id]) == [jobs["a"].id]
    for name, parent in (("b", "a"), ("c", "b"), ("d", "a")):
        found = row(conn, jobs[name].id)
        assert found["state"] == "cancelled", name
        assert found["finished_at"] is not None
        assert f"parent job {jobs[parent].id} was cancelled" in found["errors"][-1]["error"]
    assert count(conn, WAITING) == 0


def test_unknown_parents_are_a_validation_error_and_nothing_is_written(
    conn: psycopg.Connection[Any],
) -> None:
    a = shigoto.enqueue(STEP, {"name": "a"})
    with pytest.raises(shigoto.ValidationError) as raised:
        shigoto.enqueue(STEP, {"name": "b"}, depends_on=[a.id, 987654])
    assert raised.value.field == "depends_on"
    assert "987654" in str(raised.value)
    with pytest.raises(shigoto.ValidationError) as raised:
        shigoto.enqueue_many([{"worker": STEP, "args": {"name": "c"}},
                              {"worker": STEP, "args": {"name": "d"}, "depends_on": [987655]}])
    assert raised.value.field == "depends_on"
    assert count(conn) == 1


async def test_unknown_parents_are_refused_on_an_async_connection_too(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
        with pytest.raises(shigoto.ValidationError, match="987654") as raised:
            await shigoto.aenqueue(STEP, {"name": "b"}, depends_on=[987654], conn=aconn)
        assert raised.value.field == "depends_on"
        with pytest.raises(shigoto.ValidationError, match="does not exist"):
            await shigoto.aenqueue_many([{"worker": STEP, "args": {"name": "c"},
                                          "depends_on": [987655]}] * 2, conn=aconn)  # fmt: skip
        found = await (await aconn.execute("SELECT count(*) FROM shigoto_jobs")).fetchone()
        assert found == (0,)


def test_a_cycle_is_refused_by_name_and_nothing_is_written(conn: psycopg.Connection[Any]) -> None:
    wf = (shigoto.workflow().add("a", STEP, {"name": "a"}, after=["c"])
          .add("b", STEP, {"name": "b"}, after=["a"])
          .add("c", STEP, {"name": "c"}, after=["b"])
          .add("x", STEP, {"name": "x"}))  # fmt: skip
    with pytest.raises(shigoto.ValidationError, match="a → b → c → a") as raised:
        wf.enqueue()
    assert raised.value.field == "after"
    assert count(conn) == 0


def test_a_child_of_finished_parents_is_decided_at_insert(conn: psycopg.Connection[Any]) -> None:
    done = _executing_parent(conn)
    _finish(conn, done)
    failed = _executing_parent(conn)
    _finish(conn, failed, "discarded")

    runs = shigoto.enqueue(STEP, {"name": "x"}, depends_on=[done])
    assert runs.state == "available" and state(conn, runs.id) == "available"
    anyway = shigoto.enqueue(STEP, {"name": "y"}, depends_on=[done, failed],
                             on_parent_failure="run")  # fmt: skip
    assert state(conn, anyway.id) == "available"
    refused = shigoto.enqueue(STEP, {"name": "z"}, depends_on=[done, failed])
    assert state(conn, refused.id) == "cancelled"  # the returned Job is the row as inserted
    assert f"parent job {failed} was discarded" in row(conn, refused.id)["errors"][0]["error"]

    # A parent pruned to the archive still counts as finished (and its result is kept).
    shigoto.prune(prune_after=0)
    archived = shigoto.enqueue(STEP, {"name": "w"}, depends_on=[done])
    assert state(conn, archived.id) == "available"


def _race(*calls: Callable[[psycopg.Connection[Any]], object], db_url: str) -> None:
    """Run each call in its own thread and transaction, all let go at once, then commit."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call: Callable[[psycopg.Connection[Any]], object]) -> None:
        try:
            with psycopg.connect(db_url) as c:
                barrier.wait()
                call(c)
                c.commit()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


def test_a_parent_finishing_while_a_child_is_inserted_is_never_missed(db_url: str) -> None:
    """The child's insert and the parent's completion race in two transactions, both orders,
    many times: the child must never be left waiting for a parent that has finished."""
    with psycopg.connect(db_url, autocommit=True) as setup:
        for attempt in range(40):
            parent = _executing_parent(setup)
            calls = [
                lambda c, p=parent: shigoto.enqueue(STEP, {"name": "c"}, depends_on=[p], conn=c),
                lambda c, p=parent: _finish(c, p),
            ]
            _race(*(calls if attempt % 2 else calls[::-1]), db_url=db_url)
            assert count(setup, WAITING) == 0, f"child stuck waiting (round {attempt})"
        assert count(setup, "state = 'available'") == 40


def test_two_parents_finishing_at_once_release_their_child(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as setup:
        for attempt in range(40):
            b, c = _executing_parent(setup), _executing_parent(setup)
            child = shigoto.enqueue(STEP, {"name": "d"}, depends_on=[b, c], conn=setup)
            assert child.state == "scheduled"
            _race(lambda conn, p=b: _finish(conn, p), lambda conn, p=c: _finish(conn, p),
                  db_url=db_url)  # fmt: skip
            assert state(setup, child.id) == "available", f"round {attempt}"


def test_a_released_child_wakes_its_queue(db_url: str, conn: psycopg.Connection[Any]) -> None:
    parent = _executing_parent(conn)
    child = shigoto.enqueue(STEP, {"name": "c"}, depends_on=[parent], queue="later")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN shigoto_insert")
        _finish(conn, parent)
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == ["public.later"]
    assert state(conn, child.id) == "available"


def test_status_shows_a_workflows_progress(conn: psycopg.Connection[Any]) -> None:
    jobs = (shigoto.workflow("report").add("a", STEP, {"name": "a"})
            .add("b", STEP, {"name": "b"}, after=["a"])
            .add("c", STEP, {"name": "c"}, after=["a"]).enqueue())  # fmt: skip
    _finish(conn, jobs["a"].id)
    st = shigoto.status()
    assert st.workflows == [{"id": jobs["a"].meta["workflow"]["id"], "name": "report",
                             "total": 3, "completed": 1, "failed": 0, "waiting": 0,
                             "executing": 0}]  # fmt: skip
    assert st.as_dict()["workflows"] == st.workflows
    assert st.waiting_on_parents == 0  # a's children were released when it finished
    console = Console(record=True, width=200)
    render_status(st, console)
    shown = console.export_text()
    assert "workflows (0 jobs waiting for parents)" in shown
    assert "report" in shown and "1/3" in shown


def test_a_callers_connection_with_dict_rows_is_fine(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        parent = shigoto.enqueue(STEP, {"name": "p"}, conn=c)
        child = shigoto.enqueue_many(
            [{"worker": STEP, "args": {"name": "c"}, "depends_on": [parent.id]}] * 2, conn=c
        )
        assert [job.state for job in child] == ["scheduled", "scheduled"]
