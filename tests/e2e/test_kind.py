"""End to end on a real Kubernetes (kind): the path a user takes, with the real images.

Build the runner, operator and example images; start (or reuse) a kind cluster and load them;
`kubectl apply -k deploy/` and the development PostgreSQL; migrate and enqueue jobs; apply a
Queue; see its runner Deployment scale up, every job complete, and the Deployment scale back to
zero; delete the Queue and see the Deployment go. The kmock tests check how the operator talks
to an API; only this one checks what a real API server, scheduler and kubelet make of it.

Needs Docker (a reachable engine, not just the CLI), kind and kubectl; skips with the reason
where any is missing. Environment knobs:
  SHIGOTO_KIND_CLUSTER   cluster name (default shigoto-e2e); an existing one is reused and kept
  SHIGOTO_E2E_KEEP=1     keep a cluster this test created, for poking around afterwards
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]


def _unavailable() -> str | None:
    """Everything this machine lacks to run the test, or None when it has it all."""
    missing = [f"`{tool}` is not on PATH" for tool in ("docker", "kind", "kubectl")
               if shutil.which(tool) is None]  # fmt: skip
    if shutil.which("docker"):
        try:
            info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as error:
            missing.append(f"`docker info` failed: {error}")
        else:
            if info.returncode != 0:
                detail = (info.stderr.strip().splitlines() or ["no output"])[-1]
                missing.append(f"`docker info` failed, no Docker engine reachable ({detail})")
    return "; ".join(missing) or None


_REASON = _unavailable()
if _REASON:
    pytest.skip(
        f"kind end-to-end test needs Docker, kind and kubectl: {_REASON}", allow_module_level=True
    )

# Building three images and starting a cluster takes minutes, far past the suite's default.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

CLUSTER = os.environ.get("SHIGOTO_KIND_CLUSTER", "shigoto-e2e")
CONTEXT = f"kind-{CLUSTER}"
TAG = "e2e"
RUNNER_IMAGE = f"shigoto-runner:{TAG}"
OPERATOR_IMAGE = f"shigoto-operator:{TAG}"
EXAMPLE_IMAGE = f"shigoto-example:{TAG}"
NAMESPACE = "shigoto-demo"  # where deploy/dev/postgres.yaml puts the database and its Secret
QUEUE = "e2e"
JOBS = 200
TARGET = 20  # jobs per replica: 200 pending jobs want 10 pods, capped at MAX
MAX = 3


def sh(*argv: str, timeout: float = 600, stdin: str | None = None, check: bool = True) -> str:
    """Run a command; on failure raise with its output, which is what a CI log needs."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result.stdout


def kubectl(*argv: str, **kwargs: Any) -> str:
    return sh("kubectl", "--context", CONTEXT, *argv, **kwargs)


def eventually(condition: Callable[[], T], *, timeout: float, message: str) -> T:
    """Poll until `condition` returns something truthy (kubectl calls: seconds apart)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {message}")
        time.sleep(2)


def get_json(*argv: str) -> dict[str, Any] | None:
    out = kubectl("get", *argv, "-o", "json", check=False)
    return json.loads(out) if out.strip() else None


PSQL = ("psql", "-U", "shigoto", "-d", "shigoto", "-tA")


def sql(query: str) -> str:
    """One value from the development PostgreSQL, through its own psql."""
    return kubectl("-n", NAMESPACE, "exec", "deploy/postgres", "--", *PSQL, "-c", query).strip()


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def images() -> None:
    """The three images a user builds: ours, and theirs FROM ours with the example workers."""
    build = ("docker", "build")
    sh(*build, "-f", str(ROOT / "Dockerfile.runner"), "-t", RUNNER_IMAGE, str(ROOT), timeout=1200)
    sh(*build, "-f", str(ROOT / "Dockerfile.operator"), "-t", OPERATOR_IMAGE, str(ROOT),
       timeout=1200)  # fmt: skip
    user_image = ("--build-arg", f"SHIGOTO_RUNNER_IMAGE={RUNNER_IMAGE}", "-t", EXAMPLE_IMAGE)
    sh(*build, *user_image, str(ROOT / "deploy" / "examples"), timeout=1200)


@pytest.fixture(scope="module")
def cluster(images: None) -> Iterator[str]:
    existing = sh("kind", "get", "clusters").split()
    created = CLUSTER not in existing
    if created:
        sh("kind", "create", "cluster", "--name", CLUSTER, "--wait", "180s", timeout=900)
    try:
        for image in (RUNNER_IMAGE, OPERATOR_IMAGE, EXAMPLE_IMAGE):
            sh("kind", "load", "docker-image", "--name", CLUSTER, image, timeout=900)
        yield CLUSTER
    finally:
        if created and os.environ.get("SHIGOTO_E2E_KEEP") != "1":
            sh("kind", "delete", "cluster", "--name", CLUSTER, timeout=300, check=False)


OVERLAY = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [{base}]
images: [{{name: shigoto-operator, newTag: {tag}}}]
patches:
  - target: {{kind: Deployment, name: shigoto-operator}}
    patch: |
      - {{op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}}
"""


@pytest.fixture(scope="module")
def installed(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """deploy/ as a user applies it, with the operator image swapped for the one just built
    (an overlay: kustomize only accepts a relative path to the base)."""
    overlay = tmp_path_factory.mktemp("overlay")
    base = os.path.relpath(ROOT / "deploy", overlay)
    (overlay / "kustomization.yaml").write_text(OVERLAY.format(base=base, tag=TAG))
    kubectl("apply", "-k", str(overlay))
    for crd in ("queues.shigoto.dev", "cronschedules.shigoto.dev"):
        kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    kubectl("apply", "-f", str(ROOT / "deploy" / "dev" / "postgres.yaml"))
    for namespace, deployment in ((NAMESPACE, "postgres"), ("shigoto-system", "shigoto-operator")):
        kubectl("-n", namespace, "rollout", "status", f"deploy/{deployment}", "--timeout=300s",
                timeout=330)  # fmt: skip


JOB = """\
apiVersion: batch/v1
kind: Job
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  backoffLimit: 2
  template:
    spec:
      restartPolicy: Never
      securityContext:
        runAsNonRoot: true
        runAsUser: 10001
        seccompProfile: {{type: RuntimeDefault}}
      containers:
        - name: main
          image: {image}
          imagePullPolicy: Never
          command: [python, -c, {script}]
          env:
            - name: SHIGOTO_DATABASE_URL
              valueFrom: {{secretKeyRef: {{name: shigoto-db, key: url}}}}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {{drop: [ALL]}}
"""


def run_job(name: str, script: str) -> None:
    """A one-off pod with the example image: the same code and settings a service would use."""
    ns = ("-n", NAMESPACE)
    kubectl(*ns, "delete", "job", name, "--ignore-not-found", "--wait=true")
    manifest = JOB.format(name=name, namespace=NAMESPACE, image=EXAMPLE_IMAGE,
                          script=json.dumps(script))  # JSON strings are YAML strings  # fmt: skip
    kubectl("apply", "-f", "-", stdin=manifest)
    kubectl(*ns, "wait", "--for=condition=Complete", f"job/{name}", "--timeout=300s", timeout=330)


def diagnostics() -> str:
    """What to look at when the path breaks: the operator's log, the queue, the runners."""
    parts = []
    for argv in (
        ("-n", "shigoto-system", "logs", "deploy/shigoto-operator", "--tail=200"),
        ("-n", NAMESPACE, "get", "queues,deployments,pods,events", "-o", "wide"),
        ("-n", NAMESPACE, "get", "queue", QUEUE, "-o", "yaml"),
        ("-n", NAMESPACE, "logs", f"deploy/shigoto-runner-{QUEUE}", "--all-containers"),
    ):
        parts.append(f"$ kubectl {' '.join(argv)}\n{kubectl(*argv, check=False)}")
    return "\n".join(parts)


# --- the test ----------------------------------------------------------------------------------

ENQUEUE = f"""\
import shigoto
shigoto.enqueue_many([
    {{"worker": "shigoto_example.workers.hello", "args": {{"name": str(i), "seconds": 0.2}},
     "queue": "{QUEUE}"}}
    for i in range({JOBS})
])
"""

QUEUE_YAML = f"""\
apiVersion: shigoto.dev/v1alpha1
kind: Queue
metadata: {{name: {QUEUE}, namespace: {NAMESPACE}}}
spec:
  concurrency: 5
  database: {{secretRef: {{name: shigoto-db}}}}
  runner:
    image: {EXAMPLE_IMAGE}
    imagePullPolicy: Never
    imports: [shigoto_example.workers]
  autoscaling:
    minReplicas: 0
    maxReplicas: {MAX}
    targetJobsPerReplica: {TARGET}
    pollIntervalSeconds: 2
    scaleDownStabilizationSeconds: 20
"""

BAD_QUEUE_YAML = f"""\
apiVersion: shigoto.dev/v1alpha1
kind: Queue
metadata: {{name: bad, namespace: {NAMESPACE}}}
spec:
  database: {{secretRef: {{name: shigoto-db}}}}
  runner: {{image: x}}
  autoscaling: {{minReplicas: 5, maxReplicas: 2}}
"""


def test_queue_scales_up_runs_every_job_and_scales_back_to_zero(installed: None) -> None:
    deployment = f"shigoto-runner-{QUEUE}"
    ns = ("-n", NAMESPACE)

    def replicas() -> int:
        found = get_json(*ns, "deployment", deployment)
        return int(found["spec"].get("replicas", 1)) if found else -1

    def ready() -> int:
        found = get_json(*ns, "deployment", deployment) or {}
        return int(found.get("status", {}).get("readyReplicas", 0))

    def jobs(state: str | None = None) -> int:
        where = f"queue = '{QUEUE}'" + (f" AND state = '{state}'" if state else "")
        return int(sql(f"SELECT count(*) FROM shigoto_jobs WHERE {where}"))

    try:
        # Tables first (what a service's deploy step does), then the backlog, then the Queue:
        # the operator must find pending work and start runners from zero.
        run_job("shigoto-migrate", "import shigoto; shigoto.migrate()")
        run_job("shigoto-enqueue", ENQUEUE)
        assert jobs() == JOBS
        kubectl("apply", "-f", "-", stdin=QUEUE_YAML)

        # Up at once, to the policy's value: clamp(ceil(200 / 20), 0, 3) = 3.
        eventually(lambda: replicas() == MAX, timeout=180, message=f"{deployment} at {MAX}")
        eventually(ready, timeout=300, message=f"a ready pod of {deployment}")
        eventually(lambda: jobs("completed") == JOBS, timeout=600, message="all jobs completed")

        # Down to zero once nothing is pending and the stabilization window has passed.
        eventually(lambda: replicas() == 0, timeout=300, message=f"{deployment} scaled to 0")
        queue = get_json(*ns, "queue", QUEUE)
        assert queue is not None
        status = queue.get("status", {})
        assert status.get("desiredReplicas") == 0
        assert status.get("jobs", {}).get("completed") == JOBS
        assert status.get("observedGeneration") == queue["metadata"]["generation"]
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        assert conditions.get("DatabaseReachable") == "True", conditions

        # What users type: the printer columns and the category.
        assert QUEUE in kubectl(*ns, "get", "queues")
        assert f"queue.shigoto.dev/{QUEUE}" in kubectl("get", "shigoto", "-A", "-o", "name")

        # Bad input never reaches the operator: the API server rejects it at apply time.
        bad = subprocess.run(
            ["kubectl", "--context", CONTEXT, "apply", "--dry-run=server", "-f", "-"],
            capture_output=True, text=True, timeout=60, input=BAD_QUEUE_YAML,
        )  # fmt: skip
        assert bad.returncode != 0 and "minReplicas" in bad.stderr, bad

        # Deleting the Queue removes its runners.
        kubectl(*ns, "delete", "queue", QUEUE, "--wait=true", timeout=180)
        gone = lambda: get_json(*ns, "deployment", deployment) is None  # noqa: E731
        eventually(gone, timeout=120, message=f"{deployment} deleted with its Queue")
    except AssertionError as error:
        raise AssertionError(f"{error}\n\n{diagnostics()}") from error
