"""The namespaced install and the Queue and CronSchedule admission policies, rendered by real
kustomize.

The namespaced install must be the cluster-wide one minus every cluster-wide right on data:
the same operator Deployment (but told which namespaces to watch), Roles with the same verbs
in each watched namespace, and only a read-only CRD watch left cluster-wide.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_deploy_manifests import DEPLOY, EXPECTED_RULES, granted_by

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (its embedded kustomize) is not on PATH"
)

#: Rights that exist only for a cluster-wide watch.
#: Cluster-scoped objects: the CRDs, namespaces, and the operator replicas' peering (their
#: keep-alives, no data of any namespace).
CLUSTER_ONLY = {
    ("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces"),
    ("kopf.dev", "clusterkopfpeerings"),
}  # fmt: skip


def render(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_namespaced_install_has_no_cluster_wide_rights_on_data() -> None:
    objects = render(DEPLOY / "namespaced")
    [cluster_role] = by_kind(objects, "ClusterRole")
    assert granted_by(cluster_role) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
        ("kopf.dev", "clusterkopfpeerings"): {"list", "watch", "patch", "create"},
    }
    [role] = by_kind(objects, "Role")
    expected = {k: v for k, v in EXPECTED_RULES.items() if k not in CLUSTER_ONLY}
    assert granted_by(role) == expected
    [binding] = by_kind(objects, "RoleBinding")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "shigoto-operator", "namespace": "shigoto-system"}
    ]


def test_namespaced_operator_watches_exactly_the_namespaces_it_has_roles_in() -> None:
    objects = render(DEPLOY / "namespaced")
    [deployment] = by_kind(objects, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert "--all-namespaces" not in command
    watched = {arg.split("=", 1)[1] for arg in command if arg.startswith("--namespace=")}
    assert watched == {r["metadata"]["namespace"] for r in by_kind(objects, "Role")}
    assert command[-3:] == ["-m", "shigoto_operator", "--liveness=http://0.0.0.0:8080/healthz"]


def test_both_installs_ship_the_same_crds_and_operator_pod_apart_from_the_command() -> None:
    cluster, namespaced = render(DEPLOY), render(DEPLOY / "namespaced")
    assert by_kind(cluster, "CustomResourceDefinition") == by_kind(
        namespaced, "CustomResourceDefinition"
    )
    [a], [b] = by_kind(cluster, "Deployment"), by_kind(namespaced, "Deployment")
    for dep in (a, b):
        del dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert a == b


POLICY_NAMES = {"shigoto-queue-runner", "shigoto-cronschedule-secrets"}


def test_policies_are_v1_admission_policies_with_deny_bindings() -> None:
    objects = render(DEPLOY / "policies")
    policies = {p["metadata"]["name"]: p for p in by_kind(objects, "ValidatingAdmissionPolicy")}
    bindings = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert set(policies) == POLICY_NAMES
    assert {b["spec"]["policyName"] for b in bindings} == POLICY_NAMES
    for binding in bindings:
        assert binding["metadata"]["name"] == binding["spec"]["policyName"]
        assert binding["spec"]["validationActions"] == ["Deny"]
        # bound everywhere: no namespace or object selector to step around
        assert "matchResources" not in binding["spec"]
        # no parameter resource: kubernetes#133827 made a ConfigMap parameter deny every Queue
        assert "paramRef" not in binding["spec"]
    for policy in policies.values():
        assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert "paramKind" not in policy["spec"]
        [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
        assert rule["apiGroups"] == ["shigoto.dev"]
        for validation in policy["spec"]["validations"]:
            said = validation.get("message", "") + validation.get("messageExpression", "")
            assert "spec." in said or "refMessages" in said, "each refusal names the field"
    queue = policies["shigoto-queue-runner"]
    assert queue["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["queues"]
    names = [v["name"] for v in queue["spec"]["variables"]]
    # what an admin's overlay patches, by index (docs/kubernetes.md): keep them first, in order
    assert names[:3] == ["allowedImagePrefixes", "allowedServiceAccounts", "allowTolerations"]


def test_both_installs_ship_the_policies() -> None:
    """The admission policies are part of the default install and of the namespaced one,
    exactly as deploy/policies/ has them."""
    shipped = [o for o in render(DEPLOY / "policies")]
    for directory in (DEPLOY, DEPLOY / "namespaced"):
        objects = render(directory)
        found = [o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")]
        assert sorted(found, key=str) == sorted(shipped, key=str), directory


def test_an_overlay_patch_changes_what_the_policy_allows(tmp_path: Path) -> None:
    """The way docs/kubernetes.md tells an admin to set the lists: a JSON patch on the
    variable, guarded by a `test` of its name."""
    (tmp_path / "shigoto").symlink_to(DEPLOY.parent)
    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n  - shigoto/deploy\n"
        "patches:\n"
        "  - target: {kind: ValidatingAdmissionPolicy, name: shigoto-queue-runner}\n"
        "    patch: |-\n"
        "      - {op: test, path: /spec/variables/0/name, value: allowedImagePrefixes}\n"
        "      - op: replace\n"
        "        path: /spec/variables/0/expression\n"
        "        value: \"['registry.internal/team-a/']\"\n"
    )
    [policy] = [o for o in render(tmp_path) if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["name"] == "shigoto-queue-runner"]  # fmt: skip
    [prefixes] = [v for v in policy["spec"]["variables"] if v["name"] == "allowedImagePrefixes"]
    assert prefixes["expression"] == "['registry.internal/team-a/']"


def test_dashboard_component_serves_the_operator_dashboard_behind_a_service(
    tmp_path: Path,
) -> None:
    """deploy/dashboard added to the base install as users do it (an overlay of their own):
    the operator keeps everything it had and gains the dashboard port, the token file from an
    optional Secret, and a Service that reaches that port on the operator's pods."""
    (tmp_path / "shigoto").symlink_to(DEPLOY.parent)
    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n  - shigoto/deploy\ncomponents:\n  - shigoto/deploy/dashboard\n"
    )
    objects = render(tmp_path)
    [deployment] = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {"POD_ID", "SHIGOTO_OPERATOR_METRICS_PORT"} <= set(env)  # the base's env is kept
    port = int(env["SHIGOTO_OPERATOR_DASHBOARD_PORT"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["dashboard"] == port and ports["metrics"] == 9090
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "dashboard-token"]
    assert env["SHIGOTO_DASHBOARD_TOKEN_FILE"].startswith(mount["mountPath"] + "/")
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "dashboard-token"]
    assert volume["secret"]["optional"] is True  # without the Secret: read-only, still starts

    [service] = [s for s in by_kind(objects, "Service") if s["metadata"]["name"] ==
                 "shigoto-dashboard"]  # fmt: skip
    assert service["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    selector = service["spec"]["selector"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "dashboard"
