"""The operator writes the replicas it sets to `shigoto_queues.operator_replicas` (migration
0020), so readers of the database alone (the dashboard) can show them; a pass that changes
nothing leaves the row alone."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto_operator import k8s
from tests.integration.test_operator_kmock import _value, fast_operator, queue_spec, replicas
from tests.support.operator_harness import eventually, running_operator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

__all__ = ["fast_operator"]  # the autouse fixture, imported so it applies here too


async def test_operator_replicas_follow_the_autoscaler(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    def stored() -> tuple[Any, Any] | None:
        row = conn.execute(
            "SELECT operator_replicas, operator_replicas_at FROM shigoto_queues "
            "WHERE name = 'billing'"
        ).fetchone()
        return None if row is None else (row[0], row[1])

    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, "Queue", "bill", queue_spec(queueName="billing"))
        await eventually(lambda: _value((stored() or (None,))[0] == 0), message="0 recorded")
        first_at = stored()[1]  # type: ignore[index]

        # Several passes later, with nothing changed, the row is untouched.
        await asyncio.sleep(2.5)
        assert stored() == (0, first_at)

        shigoto.enqueue_many(
            [{"worker": "shop.workers.send", "args": {"n": i}, "queue": "billing"}
             for i in range(250)]
        )  # fmt: skip
        await eventually(lambda: _value(replicas(cluster, "bill"), 3), message="scaled to 3")
        await eventually(lambda: _value((stored() or (None,))[0] == 3), message="3 recorded")
        assert stored()[1] > first_at  # type: ignore[index]
