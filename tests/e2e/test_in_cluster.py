"""The whole loop on a cluster with a node: the operator from its image, installed with
deploy/, runs user runner pods built FROM our runner image, which drain a real queue; the
Queue scales up on the backlog and back to zero.

Needs, beyond SHIGOTO_E2E_KUBECONFIG: a Ready node, a Docker engine to build the images,
SHIGOTO_E2E_LOAD_IMAGE to hand them to the node, and SHIGOTO_E2E_DATABASE_URL (a database the
pods can reach). Skips with the reason when any is missing. SHIGOTO_E2E_PYTHON_IMAGE picks the
images' base (the PYTHON_IMAGE build argument) where the default cannot be pulled.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

import shigoto
from tests.e2e.conftest import EXAMPLE, OPERATOR_NS, Kube, eventually, secret_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

JOBS, TARGET, MAX = 200, 20, 3


def _diagnostics(kube: Kube, ns: str) -> str:
    parts = []
    for argv in (
        ("-n", OPERATOR_NS, "logs", "deploy/shigoto-operator", "--tail=150"),
        ("-n", ns, "get", "queues,deployments,pods,events", "-o", "wide"),
        ("-n", ns, "logs", "deploy/shigoto-runner-work", "--all-containers", "--tail=50"),
    ):
        parts.append(f"$ kubectl {' '.join(argv)}\n{kube.run(*argv, check=False).stdout}")
    return "\n".join(parts)


def test_runner_pods_drain_a_queue_and_scale_back_to_zero(
    operator_in_cluster: Kube, namespace: str, fresh_db: str, tmp_path: Path
) -> None:
    kube, ns = operator_in_cluster, namespace
    queue = {
        "apiVersion": "shigoto.dev/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": "work", "namespace": ns},
        "spec": {
            "concurrency": 5,
            "database": {"secretRef": {"name": "shigoto-db"}},
            "runner": {
                "image": EXAMPLE,
                "imagePullPolicy": "Never",
                "imports": ["shigoto_example.workers"],
            },
            "autoscaling": {
                "minReplicas": 0,
                "maxReplicas": MAX,
                "targetJobsPerReplica": TARGET,
                "pollIntervalSeconds": 2,
                "scaleDownStabilizationSeconds": 10,
            },
        },
    }

    def replicas() -> int:
        dep = kube.get("deployment", "-n", ns, "shigoto-runner-work") or {}
        return int(dep.get("spec", {}).get("replicas", -1))

    def ready() -> int:
        dep = kube.get("deployment", "-n", ns, "shigoto-runner-work") or {}
        return int(dep.get("status", {}).get("readyReplicas", 0))

    def completed() -> int:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM shigoto_jobs WHERE state = 'completed'"
            ).fetchone()
        return int(row[0]) if row else 0

    try:
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
        kube.run("apply", "-f", "-", stdin=json.dumps(queue))
        # the operator (in its pod) migrates the fresh database; then the backlog arrives
        eventually(
            lambda: replicas() == 0 and _tables(fresh_db), timeout=180, message="migrated, at 0"
        )
        shigoto.enqueue_many(
            [
                {
                    "worker": "shigoto_example.workers.hello",
                    "args": {"name": str(i), "seconds": 0.2},
                    "queue": "work",
                }
                for i in range(JOBS)
            ],
            database_url=fresh_db,
        )
        eventually(lambda: replicas() == MAX, timeout=120, message=f"scaled up to {MAX}")
        eventually(lambda: _operator_reports(kube, ns, MAX), timeout=120,
                   message="operator metrics and dashboard show the replicas")  # fmt: skip
        eventually(ready, timeout=300, message="a runner pod ready")
        eventually(lambda: completed() == JOBS, timeout=600, message="every job completed")
        eventually(lambda: replicas() == 0, timeout=180, message="scaled back to zero")
        pods = json.loads(kube("get", "pods", "-n", ns, "-o", "json"))["items"]
        running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        assert [p["status"]["phase"] for p in running if p["status"]["phase"] == "Running"] == []
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_diagnostics(kube, ns)}") from None


def _operator_reports(kube: Kube, ns: str, replicas: int) -> bool:
    """The operator pod's /metrics and its dashboard (deploy/dashboard's port), reached with
    `kubectl port-forward` as docs/dashboard.md tells users (the API server's proxy refuses a
    loopback pod address, which a one-node loopback cluster's host-network pods have), both
    show the queue's replicas."""
    label = "app.kubernetes.io/name=shigoto-operator"
    pods = json.loads(kube("get", "pods", "-n", OPERATOR_NS, "-l", label, "-o", "json"))["items"]
    running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
    # Two replicas, one acting (kopf peering): the standby serves neither counts nor scaling.
    return any(_pod_reports(kube, pod, ns, replicas) for pod in running)


def _pod_reports(kube: Kube, pod: str, ns: str, replicas: int) -> bool:
    metrics_port, dashboard_port = _free_port(), _free_port()
    forward = subprocess.Popen(
        ["kubectl", "--kubeconfig", kube.kubeconfig, "-n", OPERATOR_NS, "port-forward",
         f"pod/{pod}", f"{metrics_port}:9090", f"{dashboard_port}:8081"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert forward.stdout is not None
        forward.stdout.readline()  # "Forwarding from ..." once it listens
        return _metrics_show(metrics_port, ns, replicas) and _dashboard_shows(
            dashboard_port, replicas
        )
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fetch(port: int, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.read().decode()
    except OSError:
        return ""


def _metrics_show(port: int, ns: str, replicas: int) -> bool:
    text = _fetch(port, "/metrics")
    wanted = f'shigoto_operator_queue_replicas{{namespace="{ns}",queue="work"}} {replicas}.0'
    return wanted in text and "shigoto_operator_database_up{" in text


def _dashboard_shows(port: int, replicas: int) -> bool:
    session = _fetch(port, "/api/session")
    for name in json.loads(session or "{}").get("databases", []):
        queues = json.loads(_fetch(port, f"/api/queues?db={quote(name)}") or "{}")
        if any(q["name"] == "work" and q["operator_replicas"] == replicas
               for q in queues.get("queues", [])):  # fmt: skip
            return True
    return False


def _tables(url: str) -> bool:
    """The operator has migrated the database all the way: the jobs table alone appears with
    the first of some thirty migrations, long before this release can enqueue into it."""
    from shigoto.db.migrate import pending

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass('shigoto_schema_migrations') IS NOT NULL")
        if not (row.fetchone() or (False,))[0]:
            return False
        return not pending(conn, "public")
