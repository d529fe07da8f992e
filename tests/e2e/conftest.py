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
"""

from __future__ import annotations

import json
import os
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


@pytest.fixture
def operator_as_sa(installed: Kube, tmp_path: Path) -> Iterator[OperatorProcess]:
    operator = start_operator(installed, tmp_path)
    try:
        yield operator
    finally:
        operator.stop()
