"""Day two on a real cluster (issue 23): connection budgets, one owner per queue, scale from zero
at once, scale-down that spares busy pods, and failover between two operator replicas.

Two kinds of test, as in the rest of tests/e2e:

- The operator on this machine, logged in as its ServiceAccount (`operator_as_sa`): needs only
  an API server and a database this machine reaches. The connection budget, the queue-name
  conflict and the operator's wake-up on a new job are decisions it writes into the cluster.
- The operator from its image, installed with deploy/ (`operator_in_cluster`,
  `operators_in_cluster`: two replicas, as shipped): needs a Ready node, Docker and a database
  the pods reach (see conftest.py). Enqueue-to-start from zero, the scale-down and the failover
  need pods.

Every figure measured is printed (run with `-s`): docs/kubernetes.md records them.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import shigoto
from tests.e2e.conftest import (
    EXAMPLE,
    OPERATOR_LABEL,
    OPERATOR_NS,
    Kube,
    OperatorProcess,
    eventually,
    secret_manifest,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

HELLO = "shigoto_example.workers.hello"
#: What the issue asks of a handover after the active operator pod is deleted.
HANDOVER = 15.0
#: Seconds from a job's insert to its start, by the database's clock.
STARTED = (
    "SELECT extract(epoch FROM attempted_at - inserted_at) FROM shigoto_jobs "
    "WHERE queue = %s AND attempted_at IS NOT NULL"
)


def queue_manifest(namespace: str, name: str, **spec: Any) -> str:
    body: dict[str, Any] = {
        "database": {"secretRef": {"name": "shigoto-db"}},
        "runner": {
            "image": EXAMPLE,
            "imagePullPolicy": "Never",
            "imports": ["shigoto_example.workers"],
        },
        "autoscaling": {
            "minReplicas": 0,
            "maxReplicas": 10,
            "targetJobsPerReplica": 100,
            "pollIntervalSeconds": 2,
            "scaleDownStabilizationSeconds": 5,
        },
    }
    body.update(spec)
    return json.dumps(
        {
            "apiVersion": "shigoto.dev/v1alpha1",
            "kind": "Queue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": body,
        }
    )


def condition(kube: Kube, namespace: str, name: str, type_: str) -> dict[str, Any]:
    obj = kube.get("queue.shigoto.dev", "-n", namespace, name) or {}
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return {}


def replicas(kube: Kube, namespace: str, queue: str) -> int | None:
    dep = kube.get("deployment", "-n", namespace, f"shigoto-runner-{queue}")
    return None if dep is None else int(dep["spec"].get("replicas", 1))


def enqueue(url: str, queue: str, count: int, **args: Any) -> None:
    shigoto.enqueue_many(
        [{"worker": HELLO, "args": {"name": str(i), **args}, "queue": queue} for i in range(count)],
        database_url=url,
    )


def rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def events(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    out = kube("get", "events", "-n", namespace, "--field-selector",
               f"involvedObject.name={name}", "-o", "json")  # fmt: skip
    return list(json.loads(out)["items"])


@contextmanager
def diagnosed(
    kube: Kube, namespace: str, operator: OperatorProcess | None = None
) -> Iterator[None]:
    """On a failure, what the cluster and the operator said. Either way the test's Queues and
    CronSchedules are deleted while their operator and database are still there: their
    finalizers would otherwise hold the namespace in Terminating once both are gone."""
    try:
        yield
    except AssertionError as error:
        parts = [str(error)]
        for argv in (
            ("-n", namespace, "get", "queues,deployments,pods,events", "-o", "wide"),
            ("-n", OPERATOR_NS, "logs", "-l", OPERATOR_LABEL, "--tail=100", "--prefix"),
        ):
            parts.append(f"$ kubectl {' '.join(argv)}\n{kube.run(*argv, check=False).stdout}")
        if operator is not None:
            parts.append(f"--- operator log ---\n{operator.output()[-6000:]}")
        raise AssertionError("\n".join(parts)) from None
    finally:
        kube.run("delete", "queues.shigoto.dev,cronschedules.shigoto.dev", "--all", "-n",
                 namespace, "--timeout=90s", check=False, timeout=120)  # fmt: skip


# --- the operator on this machine ---------------------------------------------------------------


def test_connection_budget_caps_the_replicas_and_the_crd_refuses_less_than_a_pod(
    installed: Kube, namespace: str, fresh_db: str, operator_as_sa: OperatorProcess
) -> None:
    kube, ns = installed, namespace
    with diagnosed(kube, ns, operator_as_sa):
        # The API server refuses a budget below one pod's need, naming the field and minimum.
        tight = kube.apply(
            queue_manifest(
                ns, "tight", database={"secretRef": {"name": "db"}, "maxConnections": 5}
            ),
            dry_run=True,
        )
        assert tight.returncode != 0
        assert "spec.database.maxConnections" in tight.stderr and "at least 6" in tight.stderr
        pooled = {"secretRef": {"name": "db"}, "maxConnections": 4, "pooler": "transaction"}
        assert kube.apply(queue_manifest(ns, "ok", database=pooled), dry_run=True).returncode == 0
        # ...and a PodDisruptionBudget that is neither a count nor a percentage
        half = queue_manifest(ns, "pdb", disruption={"maxUnavailable": "half"})
        bad = kube.apply(half, dry_run=True)
        assert bad.returncode != 0 and "spec.disruption.maxUnavailable" in bad.stderr
        quarter = queue_manifest(ns, "pdb", disruption={"maxUnavailable": "25%"})
        good = kube.apply(quarter, dry_run=True)
        assert good.returncode == 0, good.stderr

        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
        budget = {"secretRef": {"name": "shigoto-db"}, "maxConnections": 20}
        kube.run("apply", "-f", "-", stdin=queue_manifest(ns, "capped", database=budget))
        eventually(
            lambda: condition(kube, ns, "capped", "Ready").get("reason") == "ScaledToZero",
            timeout=120,
            message="Ready on a fresh database",
        )
        enqueue(fresh_db, "capped", 500)  # autoscaling asks for 5; 20 at 6 a pod allows 3
        scaling = eventually(
            lambda: (
                (c := condition(kube, ns, "capped", "Scaling")).get("reason") == "ConnectionBudget"
                and c
            ),
            timeout=60,
            message="Scaling: ConnectionBudget",
        )
        print(f"Scaling condition: {scaling['message']}")
        assert "maxConnections 20 at 6 per runner pod allows 3" in scaling["message"]
        assert replicas(kube, ns, "capped") == 3
        described = kube("describe", "queue.shigoto.dev", "-n", ns, "capped")
        assert "Connection Budget" in described and "Per Pod" in described, described
        reasons = [e["reason"] for e in events(kube, ns, "capped")]
        assert "ConnectionBudget" in reasons, reasons
        dep = kube.get("deployment", "-n", ns, "shigoto-runner-capped")
        assert dep is not None
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SHIGOTO_MAX_CONNECTIONS"] == "6"


def test_a_second_queue_naming_an_owned_queue_changes_nothing(
    installed: Kube, namespace: str, fresh_db: str, operator_as_sa: OperatorProcess
) -> None:
    kube, ns = installed, namespace
    with diagnosed(kube, ns, operator_as_sa):
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
        first_queue = queue_manifest(ns, "first", queueName="mail", globalConcurrency=7)
        kube.run("apply", "-f", "-", stdin=first_queue)
        eventually(
            lambda: condition(kube, ns, "first", "Ready").get("reason") == "ScaledToZero",
            timeout=120,
            message="the first Queue Ready",
        )
        kube.run("apply", "-f", "-",
                 stdin=queue_manifest(ns, "second", queueName="mail", paused=True))  # fmt: skip
        ready = eventually(
            lambda: (
                (c := condition(kube, ns, "second", "Ready")).get("reason") == "QueueNameConflict"
                and c
            ),
            timeout=60,
            message="QueueNameConflict",
        )
        assert ready["status"] == "False" and f"Queue {ns}/first" in ready["message"]
        time.sleep(5)  # a few of its passes (poll 2 s): the second one still writes nothing
        assert kube.get("deployment", "-n", ns, "shigoto-runner-second") is None
        settings = rows(fresh_db, "SELECT paused, global_concurrency, owner FROM shigoto_queues "
                        "WHERE name = 'mail'")  # fmt: skip
        first = kube.get("queue.shigoto.dev", "-n", ns, "first")
        assert first is not None
        assert settings == [(False, 7, f"{ns}/first/{first['metadata']['uid']}")]

        kube("delete", "queue.shigoto.dev", "-n", ns, "first", "--timeout=60s")
        eventually(
            lambda: condition(kube, ns, "second", "Ready").get("reason") == "ScaledToZero",
            timeout=60,
            message="the second Queue takes the queue over",
        )
        assert kube.get("deployment", "-n", ns, "shigoto-runner-second") is not None
        assert rows(fresh_db, "SELECT paused FROM shigoto_queues WHERE name = 'mail'") == [(True,)]


def test_a_new_job_wakes_a_queue_at_zero_long_before_its_poll(
    installed: Kube, namespace: str, fresh_db: str, operator_as_sa: OperatorProcess
) -> None:
    """The operator's side of scale-from-zero: enqueue → the Deployment's replicas >= 1, with
    a 120 s poll (the wake-up), and, for comparison, through a transaction pooler with no
    direct URL (no LISTEN: the 30 s poll, KEDA's default)."""
    kube, ns = installed, namespace
    with diagnosed(kube, ns, operator_as_sa):
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "polled-db", _other_url(fresh_db)))
        woken = _zero_to_one(kube, ns, fresh_db, "woken", poll=120, database=None)
        polled = _zero_to_one(
            kube, ns, fresh_db, "polled", poll=30,
            database={"secretRef": {"name": "polled-db"}, "pooler": "transaction"},
        )  # fmt: skip
        print(f"enqueue to replicas >= 1: {woken:.2f} s with the wake-up (poll 120 s), "
              f"{polled:.2f} s poll-only (poll 30 s)")  # fmt: skip
        assert woken < 10, f"{woken:.1f} s: the wake-up did not work"


def _other_url(url: str) -> str:
    """The same database under another URL: the operator keeps one connection set (and one
    LISTEN session) per URL, so a Queue measured poll-only must not share the wake-up's."""
    return make_conninfo(url, connect_timeout="11")


def _zero_to_one(
    kube: Kube, ns: str, url: str, name: str, *, poll: int, database: dict[str, Any] | None
) -> float:
    spec: dict[str, Any] = {
        "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "targetJobsPerReplica": 100,
                        "pollIntervalSeconds": poll, "scaleDownStabilizationSeconds": 5},
        "paused": True,  # only the decision is measured here: no runner takes the job
    }  # fmt: skip
    if database is not None:
        spec["database"] = database
    kube.run("apply", "-f", "-", stdin=queue_manifest(ns, name, **spec))
    eventually(
        lambda: condition(kube, ns, name, "Ready").get("reason") == "ScaledToZero",
        timeout=120,
        message=f"{name} at zero",
    )
    time.sleep(2)  # past the first passes: the next one is a whole poll away
    started = time.monotonic()
    enqueue(url, name, 1)
    eventually(lambda: (replicas(kube, ns, name) or 0) >= 1, timeout=poll + 30,
               message=f"{name} scaled up")  # fmt: skip
    return time.monotonic() - started


# --- the operator from its image ----------------------------------------------------------------


def _several_pods_possible() -> str | None:
    if os.environ.get("SHIGOTO_E2E_HOSTNET") == "1":
        return (
            "several runner pods of one Deployment cannot run at once with host networking on "
            "one node (their ports collide; /work/shared/examples/loopback-node-hostnet-"
            "policy.yaml)"
        )
    return None


def test_enqueue_to_start_from_zero(
    operator_in_cluster: Kube, namespace: str, fresh_db: str
) -> None:
    """A job enqueued to a Queue at zero replicas, to its start in a runner pod (the image
    present on the node), by the database's clock: with the wake-up, and poll-only."""
    kube, ns = operator_in_cluster, namespace
    with diagnosed(kube, ns):
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "polled-db", _other_url(fresh_db)))
        figures = {}
        for name, poll, database, port in (
            ("woken", 120, None, 8101),
            ("polled", 30, {"secretRef": {"name": "polled-db"}, "pooler": "transaction"}, 8102),
        ):
            spec: dict[str, Any] = {
                "concurrency": 1,
                "autoscaling": {"minReplicas": 0, "maxReplicas": 1, "targetJobsPerReplica": 1,
                                "pollIntervalSeconds": poll, "scaleDownStabilizationSeconds": 5},
                "runner": {"image": EXAMPLE, "imagePullPolicy": "Never",
                           "imports": ["shigoto_example.workers"], "healthPort": port},
            }  # fmt: skip
            if database is not None:
                spec["database"] = database
            kube.run("apply", "-f", "-", stdin=queue_manifest(ns, name, **spec))
            eventually(
                lambda n=name: condition(kube, ns, n, "Ready").get("reason") == "ScaledToZero",
                timeout=180,
                message=f"{name} at zero",
            )
            time.sleep(2)
            enqueue(fresh_db, name, 1)
            started = eventually(lambda n=name: rows(fresh_db, STARTED, n), timeout=poll + 300,
                                 message=f"the {name} job started")  # fmt: skip
            figures[name] = float(started[0][0])
        print(f"enqueue to start from zero: {figures['woken']:.1f} s with the wake-up, "
              f"{figures['polled']:.1f} s poll-only (poll 30 s)")  # fmt: skip


def test_scale_down_removes_idle_pods_and_spares_the_busy_ones(
    operator_in_cluster: Kube, namespace: str, fresh_db: str
) -> None:
    """Long jobs on three pods, a quick backlog on three more; the backlog drains, the Queue
    goes from six pods to three, and the pods removed are the idle ones: no long job is put
    back or run again (same node, same start, attempt 1)."""
    reason = _several_pods_possible()
    if reason:
        pytest.skip(reason)
    kube, ns = operator_in_cluster, namespace
    long_seconds = 240
    with diagnosed(kube, ns):
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
        spec = {
            "concurrency": 1,
            "autoscaling": {"minReplicas": 0, "maxReplicas": 6, "targetJobsPerReplica": 1,
                            "pollIntervalSeconds": 2, "scaleDownStabilizationSeconds": 20},
            "runner": {"image": EXAMPLE, "imagePullPolicy": "Never",
                       "imports": ["shigoto_example.workers"], "shutdownTimeoutSeconds": 5},
        }  # fmt: skip
        kube.run("apply", "-f", "-", stdin=queue_manifest(ns, "spare", **spec))
        eventually(
            lambda: condition(kube, ns, "spare", "Ready").get("reason") == "ScaledToZero",
            timeout=180,
            message="at zero",
        )
        shigoto.enqueue_many(
            [{"worker": HELLO, "args": {"name": f"long-{i}", "seconds": long_seconds},
              "queue": "spare", "max_attempts": 1} for i in range(3)],
            database_url=fresh_db,
        )  # fmt: skip
        running = (
            "SELECT id, attempted_by, attempted_at, attempt FROM shigoto_jobs "
            "WHERE queue = 'spare' AND args->>'name' LIKE 'long-%%' AND state = 'executing' "
            "ORDER BY id"
        )
        first = eventually(lambda: len(r := rows(fresh_db, running)) == 3 and r, timeout=240,
                           message="three long jobs running")  # fmt: skip
        assert len({node for _, node, _, _ in first}) == 3, "one long job per pod"

        enqueue(fresh_db, "spare", 30, seconds=1)
        eventually(lambda: replicas(kube, ns, "spare") == 6, timeout=60, message="6 pods")
        busy = eventually(lambda: _costs(kube, ns).count("1") >= 3 and _costs(kube, ns),
                          timeout=120, message="the long jobs' pods marked")  # fmt: skip
        print(f"pod-deletion-cost while busy: {busy}")
        quick_done = ("SELECT count(*) FROM shigoto_jobs WHERE queue = 'spare' "
                      "AND args->>'name' NOT LIKE 'long-%%' AND state = 'completed'")  # fmt: skip
        eventually(lambda: rows(fresh_db, quick_done) == [(30,)], timeout=240,
                   message="the quick backlog drained")  # fmt: skip
        eventually(lambda: replicas(kube, ns, "spare") == 3, timeout=120, message="down to 3")
        eventually(lambda: _running_pods(kube, ns) == 3, timeout=120, message="3 pods left")
        assert rows(fresh_db, running) == first, "the long jobs go on where they started"

        done = ("SELECT id, attempted_by, attempted_at, attempt, state, errors FROM shigoto_jobs "
                "WHERE queue = 'spare' AND args->>'name' LIKE 'long-%%' ORDER BY id")  # fmt: skip

        def completed() -> list[tuple[Any, ...]] | None:
            found = rows(fresh_db, done)
            return found if all(r[4] == "completed" for r in found) else None

        finished = eventually(completed, timeout=long_seconds + 120, message="long jobs done")
        for (id_, node, at, attempt), (_, node2, at2, attempt2, _, errors) in zip(
            first, finished, strict=True
        ):
            assert (node2, at2, attempt2) == (node, at, attempt), f"job {id_} ran again"
            assert attempt2 == 1 and not errors, f"job {id_}: {errors}"


def _costs(kube: Kube, ns: str) -> list[str | None]:
    pods = json.loads(kube("get", "pods", "-n", ns, "-o", "json"))["items"]
    return [
        (p["metadata"].get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost")
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    ]


def _running_pods(kube: Kube, ns: str) -> int:
    pods = json.loads(kube("get", "pods", "-n", ns, "-o", "json"))["items"]
    return sum(1 for p in pods if p["status"].get("phase") in ("Pending", "Running"))


def test_deleting_the_active_operator_pod_hands_over_within_15_seconds(
    operators_in_cluster: Kube, namespace: str, fresh_db: str
) -> None:
    """deploy/ as shipped: two replicas, one acting. The acting pod is deleted; the standby
    scales a new backlog within 15 s of the deletion, from the replicas the first one left,
    and the CronSchedule's minutes go on, each slot enqueued exactly once."""
    kube, ns = operators_in_cluster, namespace
    with diagnosed(kube, ns):
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
        kube.run("apply", "-f", "-", stdin=queue_manifest(ns, "fo", paused=True))
        kube.run("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "shigoto.dev/v1alpha1", "kind": "CronSchedule",
            "metadata": {"name": "tick", "namespace": ns},
            "spec": {"schedule": "* * * * *", "worker": HELLO, "queue": "ticks",
                     "database": {"secretRef": {"name": "shigoto-db"}}},
        }))  # fmt: skip
        eventually(
            lambda: condition(kube, ns, "fo", "Ready").get("reason") == "ScaledToZero",
            timeout=180,
            message="Queue Ready",
        )
        enqueue(fresh_db, "fo", 200)
        eventually(lambda: replicas(kube, ns, "fo") == 2, timeout=60, message="2 replicas")
        eventually(lambda: _slots(fresh_db), timeout=90, message="a first cron slot")

        # The second replica joins once its pod runs (its image loaded, the peering read).
        leader, standby = eventually(
            lambda: _peers(kube) if len(_peers(kube)) == 2 else None,
            timeout=180, message="both operators in the peering",
        )  # fmt: skip
        print(f"active operator pod {leader}, standby {standby}")
        started = time.monotonic()
        kube("-n", OPERATOR_NS, "delete", "pod", leader, "--wait=false")
        eventually(lambda: leader not in _peers(kube), timeout=HANDOVER,
                   message="the deleted pod left the peering")  # fmt: skip
        left = time.monotonic() - started
        enqueue(fresh_db, "fo", 300)
        lowest = 2
        deadline = started + HANDOVER + 30
        while replicas(kube, ns, "fo") != 5 and time.monotonic() < deadline:
            lowest = min(lowest, replicas(kube, ns, "fo") or 0)
            time.sleep(0.5)
        handover = time.monotonic() - started
        print(f"handover: the deleted pod left the peering after {left:.1f} s; the standby "
              f"scaled a new backlog {handover:.1f} s after the deletion")  # fmt: skip
        assert replicas(kube, ns, "fo") == 5, "the standby did not take over"
        assert handover < HANDOVER, f"{handover:.1f} s"
        assert lowest == 2, "the new leader started from the replicas the old one left"

        # two more minutes: every slot once, none missing, none doubled
        first_slots = _slots(fresh_db)
        eventually(lambda: len(_slots(fresh_db)) >= len(first_slots) + 2, timeout=150,
                   message="two more cron slots")  # fmt: skip
        slots = _slots(fresh_db)
        assert len(slots) == len(set(slots)), f"a slot enqueued twice: {slots}"
        minutes = [datetime.fromisoformat(s) for s in sorted(slots)]
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(minutes)]
        assert all(g == 60 for g in gaps), f"a slot missed: {sorted(slots)}"


def _peers(kube: Kube) -> list[str]:
    """The operator pods in the peering, the acting one (highest priority) first."""
    obj = kube.get("clusterkopfpeering.kopf.dev", "shigoto-operator") or {}
    status = obj.get("status") or {}
    return sorted(status, key=lambda pod: -int(status[pod].get("priority", 0)))


def _slots(url: str) -> list[str]:
    found = rows(url, "SELECT meta->>'slot' FROM shigoto_jobs WHERE meta ? 'cron'")
    return [slot for (slot,) in found]
