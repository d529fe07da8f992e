"""What every real-cluster test needs: the cluster, kubectl, a database, the installed manifests.

The suite runs against whatever cluster `SHIGOTO_E2E_KUBECONFIG` names (kind is one way to get
one; docs/kubernetes.md, "Tested against", says how it ran here) and skips, saying why, when it
is unset. It installs with `kubectl apply -k deploy/` exactly as a user does.

Environment:
  SHIGOTO_E2E_KUBECONFIG     kubeconfig of a cluster where the suite may install the CRDs and
                             the operator and create namespaces (cluster-admin)
  SHIGOTO_E2E_DATABASE_URL   a PostgreSQL server the suite may create databases on, reachable
                             by TCP from this machine and from pods; without it the suite uses
                             the embedded server, and tests that need pods skip
  SHIGOTO_E2E_HOSTNET=1      label test namespaces `shigoto-e2e=hostnet` and let them run
                             privileged pods: for a one-node test cluster whose only network is
                             loopback, with a policy that gives such namespaces host networking
  SHIGOTO_E2E_LOAD_IMAGE     a shell command that makes a local Docker image available to the
                             cluster's nodes, `{image}` standing for it, e.g.
                             `kind load docker-image {image}` or
                             `docker save {image} | ctr -n k8s.io images import -`
  SHIGOTO_E2E_PYTHON_IMAGE   the images' base (the PYTHON_IMAGE build argument) where the
                             default cannot be pulled

Tests that run the operator on this machine (`operator_as_sa`) and tests that run it from its
image in the cluster (`operator_in_cluster`, `operators_in_cluster`) each set the in-cluster
Deployment's replicas themselves, so two operators never act at once whatever order the
tests run in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql

from shigoto.db import embedded
from tests.support.waiting import wait_until

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_NS = "shigoto-system"
OPERATOR_SA = "shigoto-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
OPERATOR_LABEL = "app.kubernetes.io/name=shigoto-operator"

TAG = "e2e"
RUNNER, OPERATOR, EXAMPLE = (f"shigoto-{n}:{TAG}" for n in ("runner", "operator", "example"))


@dataclass
class Kube:
    """kubectl against the cluster under test; failures raise with the command's output."""

    kubeconfig: str

    def run(
        self,
        *argv: str,
        stdin: str | None = None,
        timeout: float = 120,
        check: bool = True,
        kubeconfig: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        command = ["kubectl", "--kubeconfig", kubeconfig or self.kubeconfig, *argv]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, input=stdin
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
            )
        return result

    def __call__(self, *argv: str, **kwargs: Any) -> str:
        return self.run(*argv, **kwargs).stdout

    def get(self, *argv: str) -> dict[str, Any] | None:
        result = self.run("get", *argv, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        return dict(json.loads(result.stdout))

    def apply(self, manifest: str, *, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
        argv = ["apply", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
        return self.run(*argv, stdin=manifest, check=False)

    def can_i(self, verb: str, resource: str, namespace: str | None = None) -> bool:
        resource, _, sub = resource.partition("/")
        argv = ["auth", "can-i", verb, resource, "--as", OPERATOR_USER]
        argv += [f"--subresource={sub}"] if sub else []
        argv += ["-n", namespace] if namespace else ["--all-namespaces"]
        return self.run(*argv, check=False).stdout.strip() == "yes"


def eventually(condition: Callable[[], T], *, timeout: float, message: str) -> T:
    """`wait_until`, polling once a second: each condition here is a kubectl call."""
    return wait_until(condition, timeout=timeout, message=message, step=1.0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The quick start (test_quick_start.py) installs Shigoto its own way and ends by
    uninstalling it, CRDs included: run after every other test, whose session installed it."""
    items.sort(key=lambda item: item.nodeid.startswith("tests/e2e/test_quick_start.py"))


@pytest.fixture(scope="session")
def kube() -> Kube:
    kubeconfig = os.environ.get("SHIGOTO_E2E_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("real-cluster tests need SHIGOTO_E2E_KUBECONFIG (a cluster-admin kubeconfig)")
    if not Path(kubeconfig).is_file():
        pytest.fail(f"SHIGOTO_E2E_KUBECONFIG={kubeconfig}: no such file")
    k = Kube(kubeconfig)
    k("version")  # fails here, with the reason, when the API server does not answer
    return k


@pytest.fixture(scope="session")
def installed(kube: Kube) -> Kube:
    """`kubectl apply -k deploy/`, as docs/kubernetes.md says; the in-cluster operator is
    scaled to zero here, so tests that run their own operator are the only one acting (the
    in-cluster test scales it back up with an image it built)."""
    kube("apply", "-k", str(ROOT / "deploy"))
    for crd in ("queues.shigoto.dev", "cronschedules.shigoto.dev"):
        kube("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    kube("-n", OPERATOR_NS, "scale", "deployment/shigoto-operator", "--replicas=0")
    return kube


@pytest.fixture
def namespace(installed: Kube) -> Iterator[str]:
    """A namespace of its own per test, deleted afterwards (with everything in it)."""
    name = f"shigoto-e2e-{uuid.uuid4().hex[:6]}"
    installed("create", "namespace", name)
    if os.environ.get("SHIGOTO_E2E_HOSTNET") == "1":
        installed(
            "label",
            "namespace",
            name,
            "shigoto-e2e=hostnet",
            "pod-security.kubernetes.io/enforce=privileged",
        )
    try:
        yield name
    finally:
        installed("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def e2e_server_url(request: pytest.FixtureRequest) -> str:
    url = os.environ.get("SHIGOTO_E2E_DATABASE_URL")
    if url:
        return url
    return str(request.getfixturevalue("server_url"))


@pytest.fixture
def fresh_db(e2e_server_url: str) -> Iterator[str]:
    """An empty database (no shigoto tables): the operator must migrate it."""
    name = f"shigoto_e2e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(e2e_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield embedded.with_database(e2e_server_url, name)
    with psycopg.connect(e2e_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def secret_manifest(namespace: str, name: str, url: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {"url": url},
        }
    )


def operator_kubeconfig(kube: Kube, path: Path) -> Path:
    """A kubeconfig that speaks as the operator's ServiceAccount, with a token from the
    TokenRequest API: whatever the operator does with it, the shipped RBAC must allow."""
    token = kube("-n", OPERATOR_NS, "create", "token", OPERATOR_SA, "--duration=2h").strip()
    admin = json.loads(kube("config", "view", "--raw", "--minify", "--flatten", "-o", "json"))
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster["cluster"]}],
        "users": [{"name": OPERATOR_SA, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "e2e", "user": OPERATOR_SA}}],
        "current-context": "operator",
    }
    path.write_text(json.dumps(config))
    return path


@dataclass
class OperatorProcess:
    """`kopf run` on this machine, logged in as the operator's ServiceAccount."""

    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_operator(
    kube: Kube, tmp_path: Path, *, namespaces: tuple[str, ...] = ()
) -> OperatorProcess:
    """`kopf run` on this machine as the operator's ServiceAccount: cluster-wide, or watching
    only `namespaces` (what deploy/namespaced/ runs)."""
    kubeconfig = operator_kubeconfig(kube, tmp_path / "operator.kubeconfig")
    log = tmp_path / "operator.log"
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "SHIGOTO_OPERATOR_RETRY_INTERVAL": "1",
        "SHIGOTO_OPERATOR_CRON_STATUS_INTERVAL": "1",
        "SHIGOTO_OPERATOR_LEADER_INTERVAL": "1",
    }
    kopf = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "kopf"
    scope = [f"--namespace={ns}" for ns in namespaces] or ["--all-namespaces"]
    command = [str(kopf) if kopf.exists() else "kopf", "run", *scope, "--standalone",
               "-m", "shigoto_operator"]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    return OperatorProcess(process, log)


def scale_operator(kube: Kube, replicas: int) -> None:
    """The in-cluster operator's replicas; at 0, wait until its pods are gone, so nothing of
    it acts beside an operator started here."""
    kube("-n", OPERATOR_NS, "scale", "deployment/shigoto-operator", f"--replicas={replicas}")
    if replicas == 0:
        kube("-n", OPERATOR_NS, "wait", "--for=delete", "pod", "-l", OPERATOR_LABEL,
             "--timeout=120s", timeout=150)  # fmt: skip


@pytest.fixture
def operator_as_sa(installed: Kube, tmp_path: Path) -> Iterator[OperatorProcess]:
    scale_operator(installed, 0)
    operator = start_operator(installed, tmp_path)
    try:
        yield operator
    finally:
        operator.stop()


# --- images, and the operator from its image ----------------------------------------------------


def missing_for_pods(kube: Kube) -> str | None:
    """Why pods of our images cannot run here, or None."""
    nodes = json.loads(kube("get", "nodes", "-o", "json"))["items"]
    ready = [
        n
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    ]
    if not ready:
        return "the cluster has no Ready node"
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode
    ):
        return "no Docker engine answers `docker info`"
    for var in ("SHIGOTO_E2E_LOAD_IMAGE", "SHIGOTO_E2E_DATABASE_URL"):
        if not os.environ.get(var):
            return f"{var} is not set"
    return None


def sh(command: str | list[str], timeout: float = 1800) -> None:
    result = subprocess.run(
        command, shell=isinstance(command, str), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="session")
def images(installed: Kube) -> None:
    """The runner, operator and example images, built once and handed to the nodes."""
    reason = missing_for_pods(installed)
    if reason:
        pytest.skip(f"in-cluster test: {reason}")
    base = os.environ.get("SHIGOTO_E2E_PYTHON_IMAGE")
    build = ["docker", "build", "--network", "host"]
    build += ["--build-arg", f"PYTHON_IMAGE={base}"] if base else []
    sh([*build, "-f", str(ROOT / "Dockerfile.runner"), "-t", RUNNER, str(ROOT)])
    sh([*build, "-f", str(ROOT / "Dockerfile.operator"), "-t", OPERATOR, str(ROOT)])
    user_build = ["docker", "build", "--network", "host"]
    user_build += ["--build-arg", f"SHIGOTO_RUNNER_IMAGE={RUNNER}", "-t", EXAMPLE]
    sh([*user_build, str(ROOT / "deploy" / "examples")])
    for image in (RUNNER, OPERATOR, EXAMPLE):
        sh(os.environ["SHIGOTO_E2E_LOAD_IMAGE"].replace("{image}", image), timeout=600)


OVERLAY = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [{base}]
{components}images: [{{name: shigoto-operator, newTag: {tag}}}]
patches:
  - target: {{kind: Deployment, name: shigoto-operator}}
    patch: |
      - {{op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}}
{extra}"""

#: On a one-node cluster whose pods use the host's network, two operator pods would both bind
#: ports 8080 (kopf's liveness) and 9090 (metrics), and every declared port becomes a host port:
#: the second pod could never start. Two replicas there go without ports, probe, metrics and
#: dashboard.
PORTLESS = """\
      - {op: remove, path: /spec/template/spec/containers/0/ports}
      - {op: remove, path: /spec/template/spec/containers/0/livenessProbe}
      - {op: replace, path: /spec/template/spec/containers/0/command,
         value: [kopf, run, --all-namespaces, -m, shigoto_operator]}
      - {op: test, path: /spec/template/spec/containers/0/env/1/name,
         value: SHIGOTO_OPERATOR_METRICS_PORT}
      - {op: replace, path: /spec/template/spec/containers/0/env/1/value, value: "0"}
"""


def deploy_operator(kube: Kube, directory: Path, *, replicas: int) -> None:
    """deploy/ with the image just built, as a user's overlay would pin it (and deploy/dashboard
    turned on), at `replicas`, rolled out."""
    base = os.path.relpath(ROOT / "deploy", directory)
    hostnet = os.environ.get("SHIGOTO_E2E_HOSTNET") == "1"
    portless = hostnet and replicas > 1
    components = "" if portless else f"components: [{base}/dashboard]\n"
    overlay = OVERLAY.format(
        base=base, tag=TAG, components=components, extra=PORTLESS if portless else ""
    )
    (directory / "kustomization.yaml").write_text(overlay)
    kube("apply", "-k", str(directory))
    if hostnet:
        kube("label", "namespace", OPERATOR_NS, "--overwrite", "shigoto-e2e=hostnet",
             "pod-security.kubernetes.io/enforce=privileged")  # fmt: skip
    scale_operator(kube, replicas)
    kube("-n", OPERATOR_NS, "rollout", "restart", "deployment/shigoto-operator")
    kube("-n", OPERATOR_NS, "rollout", "status", "deployment/shigoto-operator",
         "--timeout=300s", timeout=330)  # fmt: skip


def undeploy_operator(kube: Kube) -> None:
    scale_operator(kube, 0)
    kube("apply", "-k", str(ROOT / "deploy"))  # back to the shipped manifests
    scale_operator(kube, 0)


def _deployed(installed: Kube, tmp_path: Path, replicas: int) -> Iterator[Kube]:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    deploy_operator(installed, overlay, replicas=replicas)
    try:
        yield installed
    finally:
        undeploy_operator(installed)


@pytest.fixture
def operator_in_cluster(installed: Kube, images: None, tmp_path: Path) -> Iterator[Kube]:
    """One operator replica from its image, through deploy/ (the dashboard turned on)."""
    yield from _deployed(installed, tmp_path, replicas=1)


@pytest.fixture
def operators_in_cluster(installed: Kube, images: None, tmp_path: Path) -> Iterator[Kube]:
    """The operator as deploy/ ships it: two replicas from its image, one acting."""
    yield from _deployed(installed, tmp_path, replicas=2)
