"""End to end with the operator's real manifests: Queue → Deployment → processes → jobs done →
scale to zero.

A stand-in for the kubelet and the Deployment controller reads each runner Deployment from
kmock and keeps `spec.replicas` real processes running, started exactly from the pod template:
the init container's command first (`shigoto migrate`), then the runner container's command
and args, with the env the template declares (`secretKeyRef` resolved from kmock's Secret). The
image's entrypoint `shigoto` becomes `python -m shigoto.cli`, and each "pod" gets its own health
port (pods have their own network namespace; local processes share one). It reports
`status.replicas` and `status.readyReplicas` (from `/readyz`) back, as the controller would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto_operator import k8s
from tests.support.http_probe import http_get
from tests.support.operator_harness import Cluster, eventually, running_operator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
JOBS = 300


@pytest.fixture(autouse=True)
def fast_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIGOTO_OPERATOR_RETRY_INTERVAL", "0.5")
    # In-process operators: no metrics server each on port 9090 (test_operator_metrics has one).
    monkeypatch.setenv("SHIGOTO_OPERATOR_METRICS_PORT", "0")
    monkeypatch.setenv("SHIGOTO_OPERATOR_LEADER_INTERVAL", "0.5")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Pod:
    name: str
    proc: asyncio.subprocess.Process
    port: int
    log: Path
    ready: bool = False

    def output(self) -> str:
        return self.log.read_text("utf-8", errors="replace")[-4000:]


@dataclass
class Kubelet:
    """Keeps each runner Deployment's `spec.replicas` processes alive, per its pod template."""

    cluster: Cluster
    logs: Path
    pods: dict[str, list[Pod]] = field(default_factory=dict)
    history: list[Pod] = field(default_factory=list)
    started: int = 0
    peak: int = 0
    serial: int = 0

    def resolve_env(self, container: dict[str, Any], pod: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.logs),
            "PYTHONPATH": str(ROOT),  # where the worker module lives; in an image, site-packages
            "PYTHONUNBUFFERED": "1",
        }
        for var in container.get("env") or []:
            source = var.get("valueFrom") or {}
            if "value" in var:
                env[var["name"]] = str(var["value"])
            elif "fieldRef" in source:  # the downward API: only the pod's name is used
                assert source["fieldRef"]["fieldPath"] == "metadata.name", var
                env[var["name"]] = pod
            else:
                ref = source["secretKeyRef"]
                env[var["name"]] = self.cluster.secret(ref["name"])[ref["key"]]
        return env

    @staticmethod
    def command(container: dict[str, Any], port: int | None = None) -> list[str]:
        argv = [*container.get("command", []), *container.get("args", [])]
        assert argv[0] == "shigoto", f"unexpected entrypoint {argv[0]}"
        argv = [sys.executable, "-m", "shigoto.cli", *argv[1:]]
        if port is not None and "--health-port" in argv:
            argv[argv.index("--health-port") + 1] = str(port)
        return argv

    async def start_pod(self, deployment: dict[str, Any]) -> Pod:
        pod_spec = deployment["spec"]["template"]["spec"]
        self.serial += 1
        name = f"{deployment['metadata']['name']}-{self.serial}"
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            for init in pod_spec.get("initContainers", []):
                proc = await asyncio.create_subprocess_exec(
                    *self.command(init),
                    env=self.resolve_env(init, name),
                    cwd=self.logs,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                )
                assert await proc.wait() == 0, f"init container failed:\n{log.read_text()}"
            (runner,) = pod_spec["containers"]
            port = free_port()
            proc = await asyncio.create_subprocess_exec(
                *self.command(runner, port),
                env=self.resolve_env(runner, name),
                cwd=self.logs,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        self.started += 1
        pod = Pod(name, proc, port, log)
        self.history.append(pod)
        return pod

    @staticmethod
    async def stop_pod(pod: Pod) -> None:
        """SIGTERM, as the kubelet sends; the runner finishes or puts back its jobs."""
        if pod.proc.returncode is None:
            pod.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(pod.proc.wait(), 30)
        except TimeoutError:
            pod.proc.kill()
            await pod.proc.wait()

    @staticmethod
    def probe(pod: Pod) -> bool:
        try:
            return http_get(f"http://127.0.0.1:{pod.port}/readyz", timeout=1)[0] == 200
        except OSError:
            return False

    def deployment_names(self) -> list[str]:
        names = []
        for key, obj in list(self.cluster.kmock.objects.items()):
            ours = key[0].plural == "deployments" and key[1] == self.cluster.namespace
            if ours and not obj.deleted:
                names.append(key[2])
        return names

    async def sync(self) -> None:
        """One pass: start or stop processes to match spec.replicas; report the status."""
        names = self.deployment_names()
        for gone in set(self.pods) - set(names):
            for pod in self.pods.pop(gone):
                await self.stop_pod(pod)
        for name in names:
            dep = await k8s.get(k8s.DEPLOYMENTS, self.cluster.namespace, name)
            if dep is None:
                continue
            pods = self.pods.setdefault(name, [])
            for pod in [p for p in pods if p.proc.returncode is not None]:
                pods.remove(pod)  # a crashed pod is replaced, as a ReplicaSet would
                print(f"pod {pod.name} exited {pod.proc.returncode}:\n{pod.output()}")
            wanted = int(dep["spec"].get("replicas") or 0)
            while len(pods) < wanted:
                pods.append(await self.start_pod(dep))
            while len(pods) > wanted:
                await self.stop_pod(pods.pop())  # the newest goes first
            for pod in pods:
                pod.ready = pod.ready or await asyncio.to_thread(self.probe, pod)
            self.peak = max(self.peak, len(pods))
            status = {"replicas": len(pods), "readyReplicas": sum(p.ready for p in pods)}
            if dep.get("status", {}) != {**dep.get("status", {}), **status}:
                await k8s.patch_status(k8s.DEPLOYMENTS, self.cluster.namespace, name, status)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sync()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    async def close(self) -> None:
        for pods in self.pods.values():
            for pod in pods:
                await self.stop_pod(pod)
        self.pods.clear()

    def report(self) -> str:
        lines = [f"kubelet: started {self.started}, peak {self.peak}"]
        for pod in self.history:
            lines.append(f"--- {pod.name} ready={pod.ready} rc={pod.proc.returncode}")
            lines.append(pod.output())
        return "\n".join(lines)

    def running(self) -> int:
        return sum(1 for pods in self.pods.values() for p in pods if p.proc.returncode is None)


async def test_queue_to_processes_to_zero(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        kubelet = Kubelet(cluster, tmp_path)
        stop = asyncio.Event()
        kubelet_task = asyncio.create_task(kubelet.run(stop))
        try:
            # enqueue first: the Queue starts at zero pods and must scale up on its own
            shigoto.enqueue_many(
                [
                    {
                        "worker": "tests.support.operator_workers.crunch",
                        "args": {"n": i},
                        "queue": "kube",
                    }
                    for i in range(JOBS)
                ]
            )
            await cluster.create(
                k8s.QUEUES,
                "Queue",
                "kube",
                {
                    "concurrency": 10,
                    "database": {"secretRef": {"name": "pg"}},
                    "runner": {
                        "image": "shigoto-runner:test",
                        "imports": ["tests.support.operator_workers"],
                        "shutdownTimeoutSeconds": 10,
                    },
                    "autoscaling": {
                        "minReplicas": 0,
                        "maxReplicas": 3,
                        "targetJobsPerReplica": 100,
                        "scaleDownStabilizationSeconds": 1,
                        "pollIntervalSeconds": 1,
                    },
                },
            )

            def completed() -> int:
                row = conn.execute(
                    "SELECT count(*) FROM shigoto_jobs WHERE queue = 'kube' AND state = 'completed'"
                ).fetchone()
                return int(row[0]) if row else 0

            async def all_done() -> bool:
                if kubelet_task.done():
                    kubelet_task.result()  # surface a kubelet failure at once
                return completed() == JOBS

            try:
                await eventually(all_done, timeout=60, message=f"{JOBS} jobs completed")
            except AssertionError:
                states = conn.execute(
                    "SELECT state, attempted_by, count(*) FROM shigoto_jobs "
                    "WHERE state <> 'completed' GROUP BY 1, 2"
                ).fetchall()
                print(f"jobs by state: {states}; deployment: {await cluster.deployment('kube')}")
                print(f"queue status: {await cluster.status(k8s.QUEUES, 'kube')}")
                print(kubelet.report())
                raise
            # ceil(300 / 100) = 3 = maxReplicas: the policy's value, reached at the first poll
            assert kubelet.peak == 3, f"peak {kubelet.peak} pods"

            async def scaled_to_zero() -> bool:
                dep = await cluster.deployment("kube")
                return bool(dep) and dep["spec"].get("replicas") == 0 and kubelet.running() == 0

            await eventually(scaled_to_zero, message="Deployment and processes at zero")

            async def reported() -> dict[str, Any] | None:
                st = await cluster.status(k8s.QUEUES, "kube")
                jobs = st.get("jobs") or {}
                ready = next((c for c in st.get("conditions", []) if c["type"] == "Ready"), {})
                done = jobs.get("completed") == JOBS and ready.get("reason") == "ScaledToZero"
                return st if done else None

            status = await eventually(reported, message="status: all completed, scaled to zero")
            assert status["replicas"] == 0 and status["desiredReplicas"] == 0
            workers = conn.execute(
                "SELECT count(DISTINCT attempted_by) FROM shigoto_jobs WHERE queue = 'kube'"
            ).fetchone()
            rescued = conn.execute(
                "SELECT count(*) FROM shigoto_jobs WHERE queue = 'kube' "
                "AND errors::text LIKE '%rescued from node%'"
            ).fetchone()
            # Pods scaled down mid-claim finish or hand back what they claimed: nothing is
            # left for the rescuer (which, at its 90 s default, would stall this test anyway).
            assert rescued == (0,)
            print(f"{JOBS} jobs ran on {workers and workers[0]} runner processes")
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await kubelet_task
            await kubelet.close()
