"""Which runner pods a scale-down removes: the idle ones first.

When the Deployment shrinks, its ReplicaSet picks the pods to delete, and among ready pods it
takes those with the lowest `controller.kubernetes.io/pod-deletion-cost` first. Left unset, a
pod halfway through a 20-minute job is as likely to go as an idle one, and its job is put back
and started over. So the operator marks each runner pod with what it is running: its cost is
the number of the queue's jobs executing on it, read from the database (`shigoto_jobs.
attempted_by` is the runner's node id, and `shigoto_nodes.hostname` the pod it runs in).

A pod's node records its hostname, which Kubernetes sets to the pod's name (the first 63
characters of it); a runner that knows its pod name from `SHIGOTO_POD_NAME` (the pod template
sets it from the downward API) records that instead, which also holds under host networking,
where every pod has the node's hostname. A hostname that names no pod, or more than one, marks
nothing.

Costs are written only when they change (a merge patch of one annotation), and only while the
Deployment has two pods or more: with one, there is no choice to steer. Written before the
replicas change in the same pass, so a scale-down decided on these counts finds them on the
pods. A job claimed by an idle pod between that read and the deletion is put back without
consuming an attempt, as on every scale-down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from shigoto_operator import builders, k8s
from shigoto_operator.dbcounts import QUERY_TIMEOUT
from shigoto_operator.spec import QueueSpec

log = logging.getLogger("shigoto.operator.deletion_cost")

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: Kubernetes keeps this many characters of a pod's name as its hostname.
HOSTNAME_MAX = 63
#: The annotation is an int32.
COST_MAX = 2**31 - 1

# The queue's executing jobs by the hostname of the runner node running them (the partial
# index on executing jobs keeps this cheap however large the table is).
_BUSY = """
SELECT n.hostname, count(*)::bigint
FROM {jobs} j JOIN {nodes} n ON n.id = j.attempted_by
WHERE j.state = 'executing' AND j.queue = %(queue)s
GROUP BY n.hostname
"""


def busy_statement(schema: str) -> sql.Composed:
    return sql.SQL(_BUSY).format(
        jobs=sql.Identifier(schema, "shigoto_jobs"), nodes=sql.Identifier(schema, "shigoto_nodes")
    )


async def read_busy(pool: AsyncConnectionPool, schema: str, queue: str) -> dict[str, int]:
    """hostname -> executing jobs of `queue` on it."""
    async with pool.connection(timeout=QUERY_TIMEOUT) as conn:
        cur = await asyncio.wait_for(
            conn.execute(busy_statement(schema), {"queue": queue}), QUERY_TIMEOUT
        )
        return {str(host): int(n) for host, n in await cur.fetchall()}


async def mark(pool: AsyncConnectionPool, spec: QueueSpec) -> int:
    """Bring the cost annotation of the Queue's runner pods up to date; how many changed."""
    selector = builders.selector_labels(spec)
    pods = live_pods(await k8s.list_pods(spec.namespace, selector), selector)
    if len(pods) < 2:
        return 0
    busy = await read_busy(pool, spec.database.schema, spec.queue_name)
    changed = patches(pods, costs(pods, busy))
    for name, patch in changed.items():
        await k8s.patch_pod(spec.namespace, name, patch)
    if changed:
        log.debug("%s/%s: deletion costs changed on %s", spec.namespace, spec.name, sorted(changed))
    return len(changed)


# --- pure ----------------------------------------------------------------------------------------


def pod_for_host(host: str, pods: Iterable[str]) -> str | None:
    """The pod a runner's hostname names: its full name, or the only pod whose name begins
    with the 63 characters Kubernetes kept."""
    names = list(pods)
    if host in names:
        return host
    if len(host) == HOSTNAME_MAX:
        matches = [n for n in names if n[:HOSTNAME_MAX] == host]
        if len(matches) == 1:
            return matches[0]
    return None


def costs(pods: Iterable[str], busy: Mapping[str, int]) -> dict[str, int]:
    """Every pod's deletion cost: the jobs executing on it (0 when idle, or unknown)."""
    names = list(pods)
    out = dict.fromkeys(names, 0)
    for host, executing in busy.items():
        pod = pod_for_host(host, names)
        if pod is not None:
            out[pod] = min(COST_MAX, out[pod] + executing)
    return out


def live_pods(
    pods: Iterable[Mapping[str, Any]], selector: Mapping[str, str]
) -> dict[str, str | None]:
    """name -> its current cost annotation, for the pods `selector` matches that are not
    being deleted (the list is filtered here too: an API server stand-in may not)."""
    out: dict[str, str | None] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if meta.get("deletionTimestamp") or any(labels.get(k) != v for k, v in selector.items()):
            continue
        out[meta["name"]] = (meta.get("annotations") or {}).get(ANNOTATION)
    return out


def patches(
    current: Mapping[str, str | None], wanted: Mapping[str, int]
) -> dict[str, dict[str, Any]]:
    """pod name -> the merge patch that sets its cost, for the pods whose cost changed."""
    return {
        name: {"metadata": {"annotations": {ANNOTATION: str(cost)}}}
        for name, cost in wanted.items()
        if current.get(name) != str(cost)
    }


async def mark_quietly(
    pool: AsyncConnectionPool, spec: QueueSpec, live: Mapping[str, Any] | None
) -> None:
    """`mark`, while the live Deployment has two replicas or more (with one there is no
    choice to steer). Best effort: a failure is logged, and the next pass tries again."""
    if int(((live or {}).get("spec") or {}).get("replicas") or 0) < 2:
        return
    try:
        await mark(pool, spec)
    except (psycopg.Error, PoolTimeout, OSError, TimeoutError, k8s.ApiError) as exc:
        log.warning("%s/%s: marking runner pods with what they run: %s",
                    spec.namespace, spec.name, exc)  # fmt: skip
