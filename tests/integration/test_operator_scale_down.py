"""Scale-down spares busy pods (`deletion_cost`), and the optional PodDisruptionBudget
(`disruption`), in-process against kmock and the real PostgreSQL.

kmock runs no ReplicaSet controller and no kubelet, so the test plays them: it keeps pod objects
for the runner Deployment, and runner nodes with executing jobs in the database (a runner
records its pod's name as its node's hostname). The operator marks each pod with
`controller.kubernetes.io/pod-deletion-cost` = its executing jobs, patches a pod only when its
cost changes, and has the marks in place before it lowers the replicas, so a ReplicaSet that
deletes the cheapest pods first removes the idle ones and keeps the one still working.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import shigoto
from shigoto_operator import builders, deletion_cost, k8s
from shigoto_operator.spec import parse_queue
from tests.integration.test_operator_kmock import (
    QUEUE,
    _absent,
    fast_operator,
    queue_spec,
    replicas,
)
from tests.support.operator_harness import NAMESPACE, Cluster, eventually, running_operator

__all__ = ["fast_operator"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

COST = deletion_cost.ANNOTATION
PODS = [f"shigoto-runner-busy-5d9c7-{suffix}" for suffix in ("aaaaa", "bbbbb", "ccccc")]


def add_pods(cluster: Cluster, names: list[str]) -> None:
    spec = parse_queue("busy", NAMESPACE, queue_spec())
    for name in names:
        cluster.kmock.objects["v1/pods", NAMESPACE, name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "labels": builders.labels(spec),
            },
            "spec": {},
        }


def costs(cluster: Cluster) -> dict[str, str | None]:
    out = {}
    for name in PODS:
        pod = cluster.kmock.objects["v1/pods", NAMESPACE, name]
        out[name] = ((pod.get("metadata") or {}).get("annotations") or {}).get(COST)
    return out


def pod_patches(cluster: Cluster) -> int:
    return sum(1 for r in list(cluster.kmock) if r.method == "PATCH" and "/pods/" in r.url.path)


def run_jobs(conn: psycopg.Connection[Any], pod: str, jobs: int) -> list[int]:
    """A runner node in `pod` executing `jobs` of the queue `mail`."""
    node = f"{pod}-1-abcdef"
    conn.execute(
        "INSERT INTO shigoto_nodes (id, hostname, pid, queues) VALUES (%s, %s, 1, %s)",
        (node, pod, '{"mail": 1}'),
    )
    ids = [shigoto.enqueue("shop.workers.long", {"n": i}, queue="mail").id for i in range(jobs)]
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'executing', attempt = 1, attempted_at = now(), "
        "attempted_by = %s WHERE id = ANY(%s)",
        (node, ids),
    )
    return ids


def finish(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'completed', completed_at = now(), finished_at = now() "
        "WHERE id = ANY(%s)",
        (ids,),
    )


async def test_pods_are_marked_with_their_running_jobs_so_idle_ones_go_first(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        first = run_jobs(conn, PODS[0], 2)
        run_jobs(conn, PODS[1], 1)
        spec = queue_spec(
            concurrency=1,
            autoscaling={
                "minReplicas": 0,
                "maxReplicas": 5,
                "targetJobsPerReplica": 1,
                "scaleDownStabilizationSeconds": 1,
                "pollIntervalSeconds": 1,
            },
        )
        await cluster.create(k8s.QUEUES, QUEUE, "busy", spec)
        await eventually(lambda: _replicas_are(cluster, "busy", 3), message="3 executing, 3 pods")
        add_pods(cluster, PODS)  # the ReplicaSet's pods, one idle

        marked = {PODS[0]: "2", PODS[1]: "1", PODS[2]: "0"}
        await eventually(lambda: _costs_are(cluster, marked), message="pods marked")
        patched = pod_patches(cluster)
        assert patched == 3
        # passes go by (poll 1 s) and nothing changed: no pod is patched again
        await eventually(lambda: _passes(cluster, "busy", 4), message="more passes")
        assert pod_patches(cluster) == patched

        # the first pod's jobs finish: only its cost changes, before the replicas drop to 1
        finish(conn, first)
        await eventually(lambda: _replicas_are(cluster, "busy", 1), message="scaled down to 1")
        assert costs(cluster) == {PODS[0]: "0", PODS[1]: "1", PODS[2]: "0"}
        assert pod_patches(cluster) == patched + 1
        # what the ReplicaSet does with 3 pods and 1 replica: keep the most expensive
        ranked = sorted(PODS, key=lambda name: int(costs(cluster)[name] or 0))
        assert ranked[-1] == PODS[1], "the pod still running a job is the one that stays"


def test_a_hostname_finds_its_pod_by_name_or_by_the_63_characters_kubernetes_kept() -> None:
    long_pod = "shigoto-runner-" + "x" * 45 + "-7f9c8d6b5-q2w3e"
    other = "shigoto-runner-" + "x" * 45 + "-7f9c8d6b5-a1s2d"
    assert deletion_cost.pod_for_host("short-pod", ["short-pod", long_pod]) == "short-pod"
    assert deletion_cost.pod_for_host(long_pod[:63], ["short-pod", long_pod]) == long_pod
    # two pods sharing their first 63 characters: a hostname cannot tell them apart
    assert deletion_cost.pod_for_host(long_pod[:63], [long_pod, other]) is None
    assert deletion_cost.pod_for_host("elsewhere", ["short-pod"]) is None
    assert deletion_cost.costs(["a", "b"], {"a": 3, "zzz": 9}) == {"a": 3, "b": 0}
    assert deletion_cost.patches({"a": "3", "b": None}, {"a": 3, "b": 0}) == {
        "b": {"metadata": {"annotations": {COST: "0"}}}
    }


async def test_disruption_budget_exists_while_the_spec_asks_for_it(kmock: Any, db_url: str) -> None:
    pdb = ("policy/v1/poddisruptionbudgets", NAMESPACE, "shigoto-runner-safe")
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(
            k8s.QUEUES, QUEUE, "safe", queue_spec(disruption={"maxUnavailable": 1})
        )
        await eventually(lambda: _exists(cluster, pdb), message="PodDisruptionBudget")
        budget = cluster.kmock.objects[pdb]
        queue = await cluster.get(k8s.QUEUES, "safe")
        assert queue is not None
        assert budget["metadata"]["ownerReferences"][0]["uid"] == queue["metadata"]["uid"]
        assert budget["spec"] == {
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "shigoto-runner",
                    "app.kubernetes.io/instance": "safe",
                }
            },
            "maxUnavailable": 1,
        }
        await cluster.patch_spec(k8s.QUEUES, "safe", {"disruption": {"maxUnavailable": "50%"}})
        await eventually(
            lambda: _value(cluster.kmock.objects[pdb]["spec"]["maxUnavailable"] == "50%"),
            message="PodDisruptionBudget follows the spec",
        )
        await cluster.patch_spec(k8s.QUEUES, "safe", {"disruption": None})
        await eventually(lambda: _gone(cluster, pdb), message="removed with the field")
        # The Event is posted after the deletion it reports.
        await eventually(lambda: _value("DisruptionBudgetDeleted" in cluster.event_reasons()),
                         message="a DisruptionBudgetDeleted Event")  # fmt: skip

        await cluster.patch_spec(k8s.QUEUES, "safe", {"disruption": {"maxUnavailable": 2}})
        await eventually(lambda: _exists(cluster, pdb), message="back")
        await cluster.delete(k8s.QUEUES, "safe")
        await eventually(lambda: _absent(cluster.get(k8s.QUEUES, "safe")), message="deleted")
        assert await _gone(cluster, pdb), "deleted with its Queue"


async def _value(value: bool) -> bool:
    return value


async def _exists(cluster: Cluster, key: Any) -> bool:
    try:  # kmock's `in` wants its parsed keys; indexing parses "group/version/plural"
        return not cluster.kmock.objects[key].deleted
    except KeyError:
        return False


async def _gone(cluster: Cluster, key: Any) -> bool:
    return not await _exists(cluster, key)


async def _replicas_are(cluster: Cluster, name: str, expected: int) -> bool:
    return await replicas(cluster, name) == expected


async def _costs_are(cluster: Cluster, expected: dict[str, str]) -> bool:
    return costs(cluster) == expected


async def _passes(cluster: Cluster, name: str, at_least: int) -> bool:
    path = f"/deployments/shigoto-runner-{name}"
    reads = [r for r in list(cluster.kmock) if r.method == "GET" and r.url.path.endswith(path)]
    return len(reads) >= at_least + 3
