"""The install manifests and images: parseable, wired together, least-privilege, non-root.

`kubectl apply -k deploy/` is how every cluster gets the operator, so a broken reference, a
wildcard RBAC rule or a root container there reaches every user. No cluster runs here; where a
kubectl binary exists, its embedded kustomize renders the base for real.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shigoto_operator import crds

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

#: The contract's operator command, plus the liveness endpoint the probe checks.
OPERATOR_COMMAND = [
    "kopf",
    "run",
    "--all-namespaces",
    "-m",
    "shigoto_operator",
    "--liveness=http://0.0.0.0:8080/healthz",
]

#: Exactly what the operator may do, and why (the same reasons are comments in rbac.yaml).
EXPECTED_RULES = {
    ("shigoto.dev", "queues"): {"get", "list", "watch", "patch"},
    ("shigoto.dev", "cronschedules"): {"get", "list", "watch", "patch"},
    ("shigoto.dev", "queues/status"): {"get", "patch"},
    ("shigoto.dev", "cronschedules/status"): {"get", "patch"},
    ("apps", "deployments"): {"get", "create", "patch", "delete"},
    ("", "secrets"): {"get"},
    ("", "events"): {"create"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
    ("keda.sh", "scaledobjects"): {"get", "create", "patch", "delete"},
    ("", "pods"): {"list", "patch"},
    ("policy", "poddisruptionbudgets"): {"get", "create", "patch", "delete"},
    ("kopf.dev", "clusterkopfpeerings"): {"list", "watch", "patch", "create"},
}

#: Verbs that would let the operator widen its own rights or act as someone else.
DANGEROUS_VERBS = {"*", "escalate", "bind", "impersonate", "deletecollection"}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _all_yaml() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yaml"))


#: kustomize's own files, not Kubernetes objects.
KUSTOMIZE_KINDS = {"Kustomization", "Component"}


def _objects(*paths: Path) -> Iterator[dict[str, Any]]:
    for path in paths:
        for doc in _documents(path):
            if doc.get("kind") not in KUSTOMIZE_KINDS:
                yield doc


def _one(kind: str, name: str) -> dict[str, Any]:
    [found] = [
        o for o in _objects(*_all_yaml()) if o["kind"] == kind and o["metadata"]["name"] == name
    ]
    return found


def _base_resources() -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/` applies, resolved by hand (files and ../crds)."""
    out: list[dict[str, Any]] = []

    def visit(directory: Path) -> None:
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for entry in kustomization["resources"]:
            target = (directory / entry).resolve()
            if target.is_dir():
                visit(target)
            else:
                out.extend(_documents(target))

    visit(DEPLOY)
    return out


# --- parse and wiring --------------------------------------------------------------------------


@pytest.mark.parametrize("path", _all_yaml(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_file_parses_into_kubernetes_objects(path: Path) -> None:
    docs = _documents(path)
    assert docs, "empty file"
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), doc
        if doc["kind"] not in KUSTOMIZE_KINDS:
            assert doc["metadata"].get("name"), doc


def test_kustomization_resources_exist() -> None:
    for path in [*DEPLOY.rglob("kustomization.yaml"), ROOT / "crds" / "kustomization.yaml"]:
        kustomization = yaml.safe_load(path.read_text())
        for entry in kustomization.get("resources", []):
            target = path.parent / entry
            assert target.is_file() or (target / "kustomization.yaml").is_file(), (
                f"{path.relative_to(ROOT)}: {entry} does not exist"
            )
            # kustomize's load restrictor refuses files outside the kustomization's root;
            # anything outside must be a directory with its own kustomization.yaml.
            if not target.resolve().is_relative_to(path.parent.resolve()):
                assert target.is_dir(), f"{entry}: reference files outside via a kustomization"


def test_base_installs_everything_the_operator_needs() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in _base_resources())
    assert kinds == sorted(
        [
            ("Namespace", "shigoto-system"),
            ("CustomResourceDefinition", "queues.shigoto.dev"),
            ("CustomResourceDefinition", "cronschedules.shigoto.dev"),
            ("CustomResourceDefinition", "clusterkopfpeerings.kopf.dev"),
            ("ServiceAccount", "shigoto-operator"),
            ("ClusterRole", "shigoto-operator"),
            ("ClusterRoleBinding", "shigoto-operator"),
            ("Deployment", "shigoto-operator"),
            ("ValidatingAdmissionPolicy", "shigoto-queue-runner"),
            ("ValidatingAdmissionPolicyBinding", "shigoto-queue-runner"),
            ("ValidatingAdmissionPolicy", "shigoto-cronschedule-secrets"),
            ("ValidatingAdmissionPolicyBinding", "shigoto-cronschedule-secrets"),
        ]
    )
    namespaced = [o for o in _base_resources() if o["kind"] in ("ServiceAccount", "Deployment")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"shigoto-system"}


def test_base_carries_the_generated_crds() -> None:
    # kopf's peering CRD is kopf's own schema, written by hand in deploy/operator/.
    installed = {
        o["metadata"]["name"]: o
        for o in _base_resources()
        if o["kind"] == "CustomResourceDefinition"
        and o["metadata"]["name"].endswith(".shigoto.dev")
    }
    assert installed == {
        "queues.shigoto.dev": crds.queue_crd(),
        "cronschedules.shigoto.dev": crds.cron_crd(),
    }


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (embedded kustomize) absent")
def test_kustomize_builds_the_base() -> None:
    """The real kustomize: catches what reading the files by hand cannot (load restrictor,
    transformer errors), and shows the image tag the base pins."""
    result = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert sorted(o["kind"] for o in rendered) == sorted(o["kind"] for o in _base_resources())
    [deployment] = [o for o in rendered if o["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert re.fullmatch(r"shigoto-operator:\d+\.\d+\.\d+", container["image"])
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "shigoto" for o in rendered)


# --- RBAC --------------------------------------------------------------------------------------


def granted_by(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(API group, resource) -> verbs, over all of a Role's or ClusterRole's rules."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def _granted() -> dict[tuple[str, str], set[str]]:
    return granted_by(_one("ClusterRole", "shigoto-operator"))


def test_rbac_grants_exactly_what_the_operator_uses() -> None:
    assert _granted() == EXPECTED_RULES


def test_rbac_has_no_wildcards_or_escalation() -> None:
    role = _one("ClusterRole", "shigoto-operator")
    for rule in role["rules"]:
        assert "*" not in rule["apiGroups"] and "*" not in rule["resources"], rule
        assert not set(rule["verbs"]) & DANGEROUS_VERBS, rule
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
    assert "update" not in set().union(*_granted().values()), "write with patch, not update"
    assert _granted()[("", "secrets")] == {"get"}, "never list or watch Secrets"


def test_every_rbac_rule_says_why() -> None:
    """A rule without a reason gets copied forward forever; each one has a comment above."""
    lines = (DEPLOY / "rbac.yaml").read_text().splitlines()
    rules = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
    assert len(rules) == len(_one("ClusterRole", "shigoto-operator")["rules"])
    bare = [i + 1 for i in rules if not lines[i - 1].strip().startswith("#")]
    assert bare == [], f"rbac.yaml lines {bare}: rule without a comment"


def test_binding_grants_the_role_to_the_operator_only() -> None:
    binding = _one("ClusterRoleBinding", "shigoto-operator")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "shigoto-operator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "shigoto-operator", "namespace": "shigoto-system"}
    ]


# --- the operator Deployment -------------------------------------------------------------------


def _operator() -> dict[str, Any]:
    return _one("Deployment", "shigoto-operator")


def test_operator_runs_the_contract_command() -> None:
    pod = _operator()["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"].split(":")[0] == "shigoto-operator"
    assert container["command"] == OPERATOR_COMMAND
    assert (
        pod["serviceAccountName"] == _one("ServiceAccount", "shigoto-operator")["metadata"]["name"]
    )


def test_operator_liveness_probe_matches_the_kopf_endpoint() -> None:
    [container] = _operator()["spec"]["template"]["spec"]["containers"]
    url = next(a for a in container["command"] if a.startswith("--liveness="))
    port, path = re.fullmatch(r"--liveness=http://0\.0\.0\.0:(\d+)(/\S+)", url).groups()  # type: ignore[union-attr]
    probe = container["livenessProbe"]["httpGet"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == path
    assert named.get(probe["port"], probe["port"]) == int(port)


def test_operator_has_resources_and_two_replicas_that_elect_one() -> None:
    """Two replicas, one acting (kopf peering): a rollout replaces one pod at a time and never
    adds a third, and the standby takes over when the active one goes."""
    deployment = _operator()
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }  # fmt: skip
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SHIGOTO_OPERATOR_PEERING"]["value"] == "shigoto-operator"


DEPLOYMENTS = [
    pytest.param(o, id=f"{o['metadata']['namespace']}/{o['metadata']['name']}")
    for o in _objects(*_all_yaml())
    if o["kind"] == "Deployment"
]


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_every_deployment_runs_non_root_on_a_read_only_root(deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"].get("runAsUser", 1) != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert context.get("runAsUser", 1) != 0 and not context.get("privileged")


def test_dev_postgres_provides_the_secret_the_examples_use() -> None:
    dev = list(_objects(DEPLOY / "dev" / "postgres.yaml"))
    secret = next(o for o in dev if o["kind"] == "Secret" and o["metadata"]["name"] == "shigoto-db")
    example = _documents(DEPLOY / "examples" / "database-secret.yaml")[0]
    assert secret["stringData"] == example["stringData"]
    assert secret["metadata"]["namespace"] == example["metadata"]["namespace"]
    queue = _documents(DEPLOY / "examples" / "queue.yaml")[0]
    assert queue["metadata"]["namespace"] == secret["metadata"]["namespace"]
    assert queue["spec"]["database"]["secretRef"]["name"] == secret["metadata"]["name"]
    service = next(o for o in dev if o["kind"] == "Service")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert host in secret["stringData"]["url"]


# --- images ------------------------------------------------------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def _last(path: Path, instruction: str) -> str:
    return [args for word, args in _instructions(path) if word == instruction][-1]


def _portable(path: Path) -> None:
    """What every builder accepts: no BuildKit-only syntax, and the base as a build argument
    (an air-gapped site passes its own), defaulting to the slim official image."""
    assert not path.read_text().startswith("# syntax="), "the plain builder ignores # syntax="
    instructions = _instructions(path)
    runs = [args for word, args in instructions if word == "RUN"]
    assert not any(args.startswith("--") for args in runs), "RUN --mount is BuildKit-only"
    assert instructions[0] == ("ARG", "PYTHON_IMAGE=python:3.11-slim")
    froms = [args for word, args in instructions if word == "FROM"]
    assert froms and all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)


def _locked(path: Path, lock: str) -> str:
    """Dependencies come only from the hashed lock file; the project itself adds none, and
    is built with the locked build backend (no build isolation fetching an unhashed one)."""
    assert (ROOT / "requirements" / lock).is_file()
    lines = (ROOT / "requirements" / lock).read_text().splitlines()
    pins = [line for line in lines if "==" in line and not line.startswith("#")]
    assert pins and all(line.rstrip().endswith("\\") for line in pins), "a hash for each pin"
    assert any(line.startswith("hatchling==") for line in pins), "the build backend is locked"
    runs = [args for word, args in _instructions(path) if word == "RUN"]
    installs = [part for run in runs for part in run.split("&&") if "pip install" in part]
    assert installs[0].split()[-4:] == ["install", "--require-hashes", "-r", f"requirements/{lock}"]
    assert all("--no-deps" in part and "--no-build-isolation" in part for part in installs[1:])
    assert ("COPY", f"requirements/{lock} requirements/{lock}") in _instructions(path)
    return " ".join(installs)


def test_runner_image_is_slim_non_root_with_the_cli_entrypoint() -> None:
    path = ROOT / "Dockerfile.runner"
    _portable(path)
    _locked(path, "runner.lock")
    assert re.fullmatch(r"10001(:10001)?", _last(path, "USER")), "non-root, numeric uid"
    assert json.loads(_last(path, "ENTRYPOINT")) == ["shigoto"]
    assert json.loads(_last(path, "CMD")) == ["run"]
    installs = " ".join(args for word, args in _instructions(path) if word == "RUN")
    assert "embedded" not in installs and "[operator]" not in installs


def test_operator_image_runs_what_the_deployment_runs() -> None:
    path = ROOT / "Dockerfile.operator"
    _portable(path)
    assert re.fullmatch(r"10001(:10001)?", _last(path, "USER"))
    assert json.loads(_last(path, "CMD")) == OPERATOR_COMMAND
    assert ".[operator]" in _locked(path, "operator.lock")
    assert "kopf==" in (ROOT / "requirements" / "operator.lock").read_text()
    assert _operator()["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001


def test_user_image_extends_ours_and_drops_root_again() -> None:
    path = DEPLOY / "examples" / "Dockerfile"
    assert _last(path, "FROM") == "${SHIGOTO_RUNNER_IMAGE}"
    assert any(
        w == "ARG" and a.startswith("SHIGOTO_RUNNER_IMAGE=shigoto-runner:")
        for w, a in _instructions(path)
    )
    assert any(w == "RUN" and "pip install" in a for w, a in _instructions(path))
    assert re.fullmatch(r"10001(:10001)?", _last(path, "USER"))


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    """An allow list: everything is ignored, then only what the images build from is let
    back in, so local state (.venv, .shigoto, .git, caches, tests) can never leak."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    assert allowed == {
        "pyproject.toml", "README.md", "runner", "operator", "migrations", "requirements"
    }
