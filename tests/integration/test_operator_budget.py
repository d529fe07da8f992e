"""A Queue's connection budget (`spec.database.maxConnections`), in-process against kmock.

500 jobs ask for 5 runner pods; a budget of 20 connections at 6 a pod allows 3: the Deployment
stops at 3, the Scaling condition says ConnectionBudget with the numbers, an Event says it
once, `status.connectionBudget` shows them, and every pod gets its share as
SHIGOTO_MAX_CONNECTIONS. A budget below one pod's need is refused naming the field and the
minimum. The arithmetic is the runner's own (`connection_budget`), and the CRD's copy of its
minimum agrees with it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.runtime import connection_budget
from shigoto_operator import budget, crds, k8s
from shigoto_operator.policy import Decision
from shigoto_operator.spec import parse_queue
from tests.integration.test_operator_kmock import QUEUE, fast_operator, queue_spec, replicas
from tests.support.operator_harness import eventually, running_operator

__all__ = ["fast_operator"]  # the autouse fixture, applied here too

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_the_crds_minimum_is_the_runners() -> None:
    """crds.py keeps a copy (it must stay free of the engine): it may not drift."""
    for sessions in (True, False):
        assert crds.min_runner_connections(sessions=sessions) == (
            connection_budget.minimum_connections(sessions=sessions)
        )


def _spec(**database: Any) -> Any:
    body = queue_spec(database={"secretRef": {"name": "pg"}, **database})
    return parse_queue("mail", "shop", body)


def test_each_pod_gets_the_share_that_fits_max_replicas_within_the_runners_bounds() -> None:
    # 20 over 10 replicas would be 2 a pod: below the runner's 6, so 6 a pod, 3 pods
    tight = budget.plan(_spec(maxConnections=20))
    assert tight == budget.Budget(20, 6) and tight.max_pods == 3
    # 100 over 10 is 10 a pod: within bounds, every replica fits
    roomy = budget.plan(_spec(maxConnections=100))
    assert roomy is not None and roomy.per_pod == 10 and roomy.max_pods == 10
    # never more than one pod would use uncapped (queue + pool + sessions + client)
    rich = budget.plan(_spec(maxConnections=10_000))
    uses = connection_budget.runner_connections(queues=1, max_connections=10_000)
    assert rich is not None and rich.per_pod == uses
    # behind a transaction pooler without a direct URL a pod has no sessions: 4 is enough
    pooled = budget.plan(_spec(maxConnections=8, pooler="transaction"))
    assert pooled is not None and (pooled.per_pod, pooled.max_pods) == (4, 2)
    assert budget.plan(_spec()) is None


def test_hold_keeps_a_decision_within_the_budget_and_says_why() -> None:
    want = Decision(5, 5, "ScaledUp", "0 → 5 replicas: 500 available + 0 executing", ())
    held = budget.hold(want, budget.Budget(20, 6), current=0)
    assert (held.desired, held.reason) == (3, budget.CONNECTION_BUDGET)
    assert "not the 5 autoscaling asks for" in held.message
    assert "maxConnections 20 at 6 per runner pod allows 3" in held.message
    assert budget.hold(want, budget.Budget(100, 10), current=0) is want


async def test_max_connections_caps_the_replicas_and_says_so(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        spec = queue_spec(database={"secretRef": {"name": "pg"}, "maxConnections": 20})
        await cluster.create(k8s.QUEUES, QUEUE, "capped", spec)
        await eventually(lambda: cluster.deployment("capped"), message="Deployment")
        shigoto.enqueue_many(
            [{"worker": "shop.workers.send", "args": {"n": i}, "queue": "mail"} for i in range(500)]
        )

        async def held() -> dict[str, Any] | None:
            cond = await cluster.condition(k8s.QUEUES, "capped", "Scaling")
            return cond if cond.get("reason") == budget.CONNECTION_BUDGET else None

        scaling = await eventually(held, message="Scaling reason ConnectionBudget")
        assert scaling["status"] == "True"
        assert "not the 5 autoscaling asks for" in scaling["message"]
        assert "spec.database.maxConnections 20 at 6 per runner pod allows 3" in scaling["message"]
        assert await replicas(cluster, "capped") == 3
        status = await cluster.status(k8s.QUEUES, "capped")
        assert status["desiredReplicas"] == 3
        assert status["connectionBudget"] == {
            "maxConnections": 20,
            "perPod": 6,
            "maxReplicas": 3,
            "connections": 18,
        }
        dep = await cluster.deployment("capped")
        assert dep is not None
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SHIGOTO_MAX_CONNECTIONS"] == "6"

        # more jobs: still 3, and the Event was posted once, not once per poll
        shigoto.enqueue_many(
            [{"worker": "shop.workers.send", "args": {"n": i}, "queue": "mail"} for i in range(300)]
        )
        await eventually(
            lambda: _jobs_seen(cluster, "capped", 800), message="status counts the new jobs"
        )
        assert await replicas(cluster, "capped") == 3
        assert cluster.event_reasons().count(budget.CONNECTION_BUDGET) == 1

        # a bigger budget lets it grow to what autoscaling asks (8 jobs per 100 → 8 pods)
        await cluster.patch_spec(
            k8s.QUEUES,
            "capped",
            {"database": {"secretRef": {"name": "pg"}, "maxConnections": 200}},
        )
        await eventually(lambda: _replicas_are(cluster, "capped", 8), message="grown to 8")
        cond = await cluster.condition(k8s.QUEUES, "capped", "Scaling")
        assert cond["reason"] != budget.CONNECTION_BUDGET


async def test_a_budget_below_one_pods_need_is_refused_naming_the_field_and_minimum(
    kmock: Any, db_url: str
) -> None:
    """The CRD's rule refuses it at `kubectl apply`; an object that got past it anyway (kmock
    validates nothing) gets Ready=False with the same words and the values, and no Deployment."""
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        spec = queue_spec(database={"secretRef": {"name": "pg"}, "maxConnections": 5})
        await cluster.create(k8s.QUEUES, QUEUE, "tiny", spec)

        async def refused() -> dict[str, Any] | None:
            cond = await cluster.condition(k8s.QUEUES, "tiny", "Ready")
            return cond if cond.get("reason") == "InvalidSpec" else None

        cond = await eventually(refused, message="Ready False, InvalidSpec")
        assert cond["status"] == "False"
        assert "spec.database.maxConnections" in cond["message"]
        assert "at least 6" in cond["message"] and "got 5" in cond["message"]
        assert await cluster.deployment("tiny") is None


async def _jobs_seen(cluster: Any, name: str, available: int) -> bool:
    jobs = (await cluster.status(k8s.QUEUES, name)).get("jobs") or {}
    return bool(jobs.get("available") == available)


async def _replicas_are(cluster: Any, name: str, expected: int) -> bool:
    return await replicas(cluster, name) == expected
