"""One Queue resource per queue and database (`ownership`), in-process against kmock.

A second Queue naming a queue the first owns gets Ready=False, QueueNameConflict, naming the
owner, and changes nothing: no settings written, no Deployment. The record is in the database,
so it holds across an operator restart; deleting the owner lets go, and the second one takes
over. A record left by a Queue that is gone is taken over, not obeyed forever.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from shigoto_operator import k8s
from tests.integration.test_operator_kmock import (
    QUEUE,
    _absent,
    fast_operator,
    queue_spec,
)
from tests.support.operator_harness import NAMESPACE, Cluster, eventually, running_operator

__all__ = ["fast_operator"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def owner(conn: psycopg.Connection[Any], queue: str = "mail") -> str | None:
    row = conn.execute("SELECT owner FROM shigoto_queues WHERE name = %s", (queue,)).fetchone()
    return None if row is None else row[0]


def settings(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT paused, global_concurrency FROM shigoto_queues WHERE name = 'mail'"
    ).fetchone()


async def ready_reason(cluster: Cluster, name: str) -> str | None:
    return (await cluster.condition(k8s.QUEUES, name, "Ready")).get("reason")


async def conflicted(cluster: Cluster, name: str) -> dict[str, Any] | None:
    cond = await cluster.condition(k8s.QUEUES, name, "Ready")
    return cond if cond.get("reason") == "QueueNameConflict" else None


async def test_a_second_queue_on_an_owned_queue_changes_nothing(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "first", queue_spec(globalConcurrency=7))
        await eventually(lambda: _reason_is(cluster, "first", "ScaledToZero"), message="first")
        first = await cluster.get(k8s.QUEUES, "first")
        assert first is not None
        assert owner(conn) == f"shop/first/{first['metadata']['uid']}"
        assert settings(conn) == (False, 7)

        # the same queue, other settings: refused, and nothing of it is applied
        await cluster.create(
            k8s.QUEUES, QUEUE, "second", queue_spec(paused=True, globalConcurrency=3)
        )
        cond = await eventually(lambda: conflicted(cluster, "second"), message="conflict")
        assert cond["status"] == "False"
        assert "Queue shop/first" in cond["message"]
        scaling = await cluster.condition(k8s.QUEUES, "second", "Scaling")
        assert (scaling["status"], scaling["reason"]) == ("False", "QueueNameConflict")
        reachable = await cluster.condition(k8s.QUEUES, "second", "DatabaseReachable")
        assert reachable["status"] == "True"
        assert "QueueNameConflict" in cluster.event_reasons()
        # several of the second one's passes later (poll 1 s): still nothing written
        await eventually(
            lambda: _observed_passes(cluster, "second"), message="the second Queue polled"
        )
        assert settings(conn) == (False, 7)
        assert await cluster.deployment("second") is None
        assert owner(conn) == f"shop/first/{first['metadata']['uid']}"

    # a new operator (a restart, or the other replica) finds the record in the database
    async with running_operator(kmock) as cluster:
        await eventually(lambda: conflicted(cluster, "second"), message="conflict after restart")
        assert settings(conn) == (False, 7)
        assert await cluster.deployment("second") is None

        # the owner goes: it lets go, and the second Queue takes the queue over
        await cluster.delete(k8s.QUEUES, "first")
        await eventually(lambda: _absent(cluster.get(k8s.QUEUES, "first")), message="deleted")
        await eventually(lambda: _reason_is(cluster, "second", "ScaledToZero"), message="owned")
        second = await cluster.get(k8s.QUEUES, "second")
        assert second is not None
        assert owner(conn) == f"shop/second/{second['metadata']['uid']}"
        assert settings(conn) == (True, 3)
        assert await cluster.deployment("second") is not None


async def test_a_record_left_by_a_gone_queue_is_taken_over(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """A Queue deleted past its finalizer (or while its database was away) leaves its record;
    the next Queue naming the queue takes it over with an Event instead of waiting forever.
    A record naming a Queue that exists is obeyed."""
    conn.execute("INSERT INTO shigoto_queues (name, owner) VALUES ('mail', 'shop/gone/u-1')")
    conn.execute("INSERT INTO shigoto_queues (name, owner) VALUES ('kept', 'shop/alive/u-2')")
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        # `alive` exists, with the uid of the record, and names queue `kept`
        await cluster.create(k8s.QUEUES, QUEUE, "alive", queue_spec(queueName="other"))
        kmock.objects[k8s_key("alive")].patch(
            {"metadata": {"uid": "u-2"}, "spec": {"queueName": "kept"}}
        )
        await cluster.create(k8s.QUEUES, QUEUE, "heir", queue_spec())
        await eventually(lambda: _reason_is(cluster, "heir", "ScaledToZero"), message="took over")
        heir = await cluster.get(k8s.QUEUES, "heir")
        assert heir is not None
        assert owner(conn) == f"shop/heir/{heir['metadata']['uid']}"
        assert "QueueOwned" in cluster.event_reasons()

        await cluster.create(k8s.QUEUES, QUEUE, "rival", queue_spec(queueName="kept"))
        cond = await eventually(lambda: conflicted(cluster, "rival"), message="conflict")
        assert "Queue shop/alive" in cond["message"]
        assert owner(conn, "kept") == "shop/alive/u-2"


async def test_renaming_the_queue_lets_go_of_the_old_one(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "mover", queue_spec())
        await eventually(lambda: owner_is_set(conn, "mail"), message="owns mail")
        await cluster.patch_spec(k8s.QUEUES, "mover", {"queueName": "post"})
        await eventually(lambda: owner_is_set(conn, "post"), message="owns post")
        await eventually(lambda: _value(owner(conn, "mail") is None), message="mail let go")


def k8s_key(name: str) -> Any:
    return (f"{k8s.QUEUES.group}/{k8s.QUEUES.version}/{k8s.QUEUES.plural}", NAMESPACE, name)


async def owner_is_set(conn: psycopg.Connection[Any], queue: str) -> bool:
    return owner(conn, queue) is not None


async def _value(value: bool) -> bool:
    return value


async def _reason_is(cluster: Cluster, name: str, reason: str) -> bool:
    return await ready_reason(cluster, name) == reason


async def _observed_passes(cluster: Cluster, name: str) -> bool:
    """Three passes of the Queue went by (each reads its Deployment by name)."""
    path = f"/deployments/shigoto-runner-{name}"
    reads = [r for r in list(cluster.kmock) if r.method == "GET" and r.url.path.endswith(path)]
    return len(reads) >= 3
