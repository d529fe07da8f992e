"""Relation transitions made by the database's triggers reach telemetry and metrics.

A waiting child released or cancelled because of its parent, a batch callback enqueued and a
job forwarded all happen inside a trigger; the leading runner re-emits each one, once for the
fleet, as a telemetry event (and its RunnerMetrics counts it). A runner that does not lead
emits none of them. Real PostgreSQL, real runners in this event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from shigoto.ops.metrics import RunnerMetrics
from tests.support.in_process import running
from tests.support.telemetry_recorder import Recorder as Seen
from tests.support.waiting import until

RELATION_EVENTS = ("workflow.release", "workflow.cancel", "batch.callback", "job.forward")


@shigoto.worker
def parent_ok() -> dict[str, str]:
    return {"made": "it"}


@shigoto.worker(max_attempts=1)
def parent_fails() -> None:
    raise ValueError("the parent fails on purpose")


@shigoto.worker
def child() -> None:
    return None


@shigoto.worker
def batch_done(**args: Any) -> None:
    return None


@pytest.fixture
def seen() -> Iterator[Seen]:
    recorder = Seen()
    handle = telemetry.attach(recorder, RELATION_EVENTS)
    yield recorder
    telemetry.detach(handle)


def _sample(metrics: RunnerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_the_leader_reports_each_trigger_transition_once(
    db_url: str, conn: psycopg.Connection[Any], seen: Seen
) -> None:
    conn.autocommit = True
    shigoto.set_queue("default", forward={"discarded": "relations-dead"})
    async with running(db_url, leader_interval=0.2) as leader, \
            running(db_url, leader_interval=0.2) as follower:  # fmt: skip
        await until(lambda: leader.elector.is_leader or follower.elector.is_leader,
                    message="one runner leads")  # fmt: skip
        lead = leader if leader.elector.is_leader else follower
        metrics = RunnerMetrics(lead.node, process_metrics=False)
        metrics.attach()
        try:
            # Parents and children in one transaction: each child waits, whatever the runners do.
            with conn.transaction():
                ok = shigoto.enqueue(parent_ok, conn=conn)
                bad = shigoto.enqueue(parent_fails, conn=conn)
                released = shigoto.enqueue(child, depends_on=[ok.id], conn=conn)
                cancelled = shigoto.enqueue(child, depends_on=[bad.id], conn=conn)
            async with shigoto.abatch(callback=batch_done, callback_args={"tag": "t"}) as b:
                await b.enqueue(child)
                await b.enqueue(child)
            await until(lambda: all(seen.named(e) for e in RELATION_EVENTS),
                        message="every relation event")  # fmt: skip
        finally:
            metrics.detach()

    # Exactly once each, from the leader, with the fields the table documents.
    [(_, release)] = seen.named("workflow.release")
    assert release == {"id": released.id, "queue": "default", "worker": child.name,
                       "parent": ok.id, "schema": "public", "node": lead.node}  # fmt: skip
    [(_, cancel)] = seen.named("workflow.cancel")
    assert cancel["id"] == cancelled.id and cancel["parent"] == bad.id
    assert cancel["parent_state"] == "discarded" and cancel["node"] == lead.node
    [(counts, callback)] = seen.named("batch.callback")
    assert counts == {"total": 2, "completed": 2, "discarded": 0, "cancelled": 0}
    assert callback["batch_id"] == b.id and callback["worker"] == batch_done.name
    assert callback["when"] == "finished"
    stored = conn.execute("SELECT callback_ids FROM shigoto_batches WHERE id = %s",
                          (b.id,)).fetchone()  # fmt: skip
    assert stored == ([callback["id"]],)
    [(_, forward)] = seen.named("job.forward")
    assert forward["from_id"] == bad.id and forward["from_queue"] == "default"
    assert forward["queue"] == "relations-dead" and forward["state"] == "discarded"
    copy = conn.execute("SELECT meta->'forwarded_from'->>'id' FROM shigoto_jobs WHERE id = %s",
                        (forward["id"],)).fetchone()  # fmt: skip
    assert copy == (str(bad.id),)

    # The leader's metrics count them under the queue they happened in.
    def counted(name: str, worker: str) -> float:
        return _sample(metrics, name, queue="default", worker=worker)

    assert counted("shigoto_workflow_released_total", child.name) == 1
    assert counted("shigoto_workflow_cancelled_total", child.name) == 1
    assert counted("shigoto_batch_callbacks_total", batch_done.name) == 1
    assert counted("shigoto_jobs_forwarded_total", parent_fails.name) == 1


async def test_a_rolled_back_transition_announces_nothing(
    db_url: str, conn: psycopg.Connection[Any], seen: Seen
) -> None:
    conn.autocommit = True
    # A queue no runner serves: only this test changes the parent's state.
    parent = shigoto.enqueue(parent_ok, queue="relations-idle")
    waiting = shigoto.enqueue(child, depends_on=[parent.id], queue="relations-idle")
    async with running(db_url, leader_interval=0.2) as runner:
        await until(lambda: runner.elector.is_leader, message="the runner leads")
        # The parent completes in a transaction that is rolled back: its trigger released the
        # child inside it, and NOTIFY is only delivered at commit.
        with conn.transaction():
            conn.execute("UPDATE shigoto_jobs SET state = 'completed', finished_at = now() "
                         "WHERE id = %s", (parent.id,))  # fmt: skip
            raise_rollback(conn)
        # A committed transition after it shows the channel works and orders the check.
        with psycopg.connect(db_url, autocommit=True) as other:
            other.execute("UPDATE shigoto_jobs SET state = 'cancelled', finished_at = now() "
                          "WHERE id = %s", (parent.id,))  # fmt: skip
        await until(lambda: seen.named("workflow.cancel"), message="the committed cancel")
    assert seen.named("workflow.release") == []
    [(_, cancel)] = seen.named("workflow.cancel")
    assert cancel["id"] == waiting.id


def raise_rollback(conn: psycopg.Connection[Any]) -> None:
    raise psycopg.Rollback()


@shigoto.worker
def refresh_cache() -> None:
    return None


async def test_fanout_deliveries_and_finishes_are_reported_and_counted(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.autocommit = True
    shigoto.set_queue("relations-broadcast", fanout=True)
    recorder = Seen()
    handle = telemetry.attach(recorder, ["fanout.delivery", "fanout.finish"])
    try:
        async with running(db_url, {"relations-broadcast": 2}) as runner:
            metrics = RunnerMetrics(runner.node, process_metrics=False)
            metrics.attach()
            try:
                job = await shigoto.aenqueue(refresh_cache, queue="relations-broadcast")
                await until(lambda: recorder.named("fanout.finish"), message="fanout.finish")
            finally:
                metrics.detach()
    finally:
        telemetry.detach(handle)
    [(_, delivery)] = recorder.named("fanout.delivery")
    assert delivery == {"job_id": job.id, "queue": "relations-broadcast", "node": runner.node,
                        "outcome": "completed"}  # fmt: skip
    [(finish_m, finish)] = recorder.named("fanout.finish")
    assert finish_m == {"count": 1}
    assert finish == {"job_ids": [job.id], "node": runner.node, "source": "delivery"}
    assert _sample(metrics, "shigoto_fanout_deliveries_total", queue="relations-broadcast",
                   outcome="completed") == 1  # fmt: skip
    assert _sample(metrics, "shigoto_fanout_finished_total", source="delivery") == 1
