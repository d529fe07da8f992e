"""Queue spec → runner Deployment and KEDA ScaledObject; drift patches (pure)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from shigoto_operator import builders
from shigoto_operator.spec import QueueSpec, parse_queue

OWNER = {
    "apiVersion": "shigoto.dev/v1alpha1",
    "kind": "Queue",
    "metadata": {"name": "emails", "namespace": "shop", "uid": "uid-1"},
}


def spec(**overrides: Any) -> QueueSpec:
    raw: dict[str, Any] = {
        "queueName": "mail",
        "concurrency": 7,
        "database": {"secretRef": {"name": "pg", "key": "dsn"}, "schema": "jobs"},
        "runner": {"image": "registry.example.com/w:1", "imports": ["shop.a", "shop.b"]},
    }
    raw.update(overrides)
    return parse_queue("emails", "shop", raw)


def container(dep: dict[str, Any], name: str = "runner") -> dict[str, Any]:
    pod = dep["spec"]["template"]["spec"]
    for c in pod["containers"] + pod.get("initContainers", []):
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name}")


def test_deployment_name_labels_selector_and_owner() -> None:
    dep = builders.deployment(spec(), OWNER, replicas=3)
    meta = dep["metadata"]
    assert (dep["apiVersion"], dep["kind"]) == ("apps/v1", "Deployment")
    assert (meta["name"], meta["namespace"]) == ("shigoto-runner-emails", "shop")
    assert meta["labels"] == {
        "app.kubernetes.io/name": "shigoto-runner",
        "app.kubernetes.io/instance": "emails",
        "app.kubernetes.io/component": "runner",
        "app.kubernetes.io/managed-by": "shigoto-operator",
        "app.kubernetes.io/part-of": "shigoto",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "shigoto.dev/v1alpha1",
            "kind": "Queue",
            "name": "emails",
            "uid": "uid-1",
            "controller": True,
        }
    ]
    assert dep["spec"]["replicas"] == 3
    selector = dep["spec"]["selector"]["matchLabels"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


def test_runner_command_carries_queue_concurrency_imports_and_flags() -> None:
    c = container(builders.deployment(spec(globalConcurrency=30), OWNER, replicas=1))
    assert c["command"] == ["shigoto"]
    assert c["args"] == [
        "run",
        "--queue",
        "mail=7",
        "--import",
        "shop.a",
        "--import",
        "shop.b",
        "--health-port",
        "8000",
        "--shutdown-timeout",
        "15",
        "--schema",
        "jobs",
        "--no-migrate",
        "--global-concurrency",
        "mail=30",
    ]


def test_no_global_concurrency_flag_without_the_field() -> None:
    assert "--global-concurrency" not in builders.runner_args(spec())


def test_database_url_comes_from_the_secret_never_the_manifest() -> None:
    dep = builders.deployment(
        spec(runner={"image": "i", "env": [{"name": "X", "value": "1"}]}), OWNER, replicas=1
    )
    for name in ("runner",):
        env = container(dep, name)["env"]
        assert env[0] == {
            "name": "SHIGOTO_DATABASE_URL",
            "valueFrom": {"secretKeyRef": {"name": "pg", "key": "dsn"}},
        }
        assert {"name": "SHIGOTO_SCHEMA", "value": "jobs"} in env
        assert {"name": "X", "value": "1"} in env
    assert "postgresql://" not in repr(dep)


def test_pods_do_not_migrate_the_operator_does() -> None:
    """No init container: the operator migrates (or the schema is managed elsewhere), so a
    runner's role needs no DDL rights and its pods start without racing for the lock."""
    dep = builders.deployment(spec(), OWNER, replicas=1)
    assert "initContainers" not in dep["spec"]["template"]["spec"]
    assert "--no-migrate" in container(dep)["args"]


def test_tmp_volume_is_bounded() -> None:
    dep = builders.deployment(spec(), OWNER, replicas=1)
    (tmp,) = dep["spec"]["template"]["spec"]["volumes"]
    assert tmp == {"name": "tmp", "emptyDir": {"sizeLimit": builders.TMP_SIZE_LIMIT}}


def test_probes_ports_and_prometheus_annotations() -> None:
    dep = builders.deployment(spec(runner={"image": "i", "healthPort": 9100}), OWNER, replicas=1)
    c = container(dep)
    assert c["ports"] == [{"name": "http", "containerPort": 9100, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9100"
    assert annotations["prometheus.io/path"] == "/metrics"


def test_security_context_is_non_root_and_read_only_with_a_tmp_volume() -> None:
    dep = builders.deployment(spec(), OWNER, replicas=1)
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    for name in ("runner",):
        c = container(dep, name)
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["runAsNonRoot"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": builders.TMP_SIZE_LIMIT}} in pod["volumes"]


@pytest.mark.parametrize("timeout", [1, 15, 600])
def test_grace_period_exceeds_the_shutdown_timeout(timeout: int) -> None:
    dep = builders.deployment(
        spec(runner={"image": "i", "shutdownTimeoutSeconds": timeout}), OWNER, replicas=1
    )
    assert "--shutdown-timeout" in container(dep)["args"]
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > timeout


def test_runner_pod_options_pass_through() -> None:
    dep = builders.deployment(
        spec(
            runner={
                "image": "i",
                "imagePullPolicy": "IfNotPresent",
                "envFrom": [{"secretRef": {"name": "extra"}}],
                "resources": {"requests": {"cpu": "100m"}},
                "nodeSelector": {"pool": "w"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {}},
                "serviceAccountName": "runner-sa",
                "imagePullSecrets": [{"name": "regcred"}],
                "podLabels": {"team": "shop", "app.kubernetes.io/name": "hijack"},
                "podAnnotations": {"note": "x"},
            }
        ),
        OWNER,
        replicas=1,
    )
    pod = dep["spec"]["template"]["spec"]
    c = container(dep)
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["envFrom"] == [{"secretRef": {"name": "extra"}}]
    assert c["resources"] == {"requests": {"cpu": "100m"}}
    assert pod["nodeSelector"] == {"pool": "w"}
    assert pod["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert pod["affinity"] == {"podAntiAffinity": {}}
    assert pod["serviceAccountName"] == "runner-sa"
    assert "automountServiceAccountToken" not in pod
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "shop"
    assert labels["app.kubernetes.io/name"] == "shigoto-runner"  # the selector must match
    assert dep["spec"]["template"]["metadata"]["annotations"]["note"] == "x"


def test_keda_deployment_leaves_replicas_alone() -> None:
    assert "replicas" not in builders.deployment(spec(), OWNER, replicas=None)["spec"]


def test_owner_without_uid_is_refused() -> None:
    with pytest.raises(ValueError, match="uid"):
        builders.deployment(spec(), {"metadata": {"name": "x"}}, replicas=1)


def test_template_hash_follows_the_template_only() -> None:
    a = builders.deployment(spec(), OWNER, replicas=1)
    b = builders.deployment(spec(), OWNER, replicas=5)
    c = builders.deployment(spec(concurrency=8), OWNER, replicas=1)
    h = builders.TEMPLATE_HASH
    assert a["metadata"]["annotations"][h] == b["metadata"]["annotations"][h]
    assert a["metadata"]["annotations"][h] != c["metadata"]["annotations"][h]


# --- KEDA ----------------------------------------------------------------------------------------


def test_scaled_object_targets_the_deployment_with_the_same_measure() -> None:
    s = spec(
        autoscaling={
            "mode": "keda",
            "minReplicas": 1,
            "maxReplicas": 4,
            "targetJobsPerReplica": 50,
            "scaleDownStabilizationSeconds": 120,
            "pollIntervalSeconds": 15,
        }
    )
    so = builders.scaled_object(s, OWNER)
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert so["metadata"]["name"] == "shigoto-runner-emails"
    assert so["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    body = so["spec"]
    assert body["scaleTargetRef"]["name"] == "shigoto-runner-emails"
    assert (body["minReplicaCount"], body["maxReplicaCount"]) == (1, 4)
    assert body["pollingInterval"] == 15
    behavior = body["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 120
    (trigger,) = body["triggers"]
    assert trigger["type"] == "postgresql"
    meta = trigger["metadata"]
    assert meta["targetQueryValue"] == "50"
    assert meta["connectionFromEnv"] == "SHIGOTO_DATABASE_URL"
    query = meta["query"]
    assert '"jobs".shigoto_jobs' in query
    assert "queue = 'mail'" in query
    assert "'available', 'executing'" in query
    assert "interval '15 seconds'" in query


def test_keda_query_escapes_quotes() -> None:
    # the CRD pattern forbids quotes in queue names; the query must not rely on it
    s = dataclasses.replace(spec(), queue_name="o'brien")
    assert "queue = 'o''brien'" in builders.keda_query(s)


# --- drift ---------------------------------------------------------------------------------------


def live_from(desired: dict[str, Any]) -> dict[str, Any]:
    """What an API server returns: the object plus defaulted fields and a status."""
    live = copy.deepcopy(desired)
    pod = live["spec"]["template"]["spec"]
    pod["dnsPolicy"] = "ClusterFirst"
    pod["restartPolicy"] = "Always"
    for c in pod["containers"]:
        c["terminationMessagePath"] = "/dev/termination-log"
    live["metadata"]["uid"] = "dep-uid"
    live["metadata"]["labels"]["extra"] = "kept"
    live["status"] = {"replicas": 1}
    return live


def test_no_patch_when_the_live_object_only_adds_defaults() -> None:
    desired = builders.deployment(spec(), OWNER, replicas=1)
    assert builders.deployment_patch(desired, live_from(desired)) == {}


def test_edited_template_is_patched_back_with_lists_replaced() -> None:
    desired = builders.deployment(spec(), OWNER, replicas=1)
    live = live_from(desired)
    runner = live["spec"]["template"]["spec"]["containers"][0]
    runner["image"] = "evil:latest"
    runner["env"].append({"name": "INJECTED", "value": "1"})
    patch = builders.deployment_patch(desired, live)
    containers = patch["spec"]["template"]["spec"]["containers"]
    assert containers == desired["spec"]["template"]["spec"]["containers"]
    # server-defaulted fields are nulled (and re-defaulted by the server)
    assert patch["spec"]["template"]["spec"]["dnsPolicy"] is None


def test_spec_change_rolls_and_removed_fields_are_nulled() -> None:
    old = builders.deployment(
        spec(runner={"image": "i", "nodeSelector": {"pool": "a"}}), OWNER, replicas=1
    )
    new = builders.deployment(spec(runner={"image": "i"}), OWNER, replicas=1)
    patch = builders.deployment_patch(new, live_from(old))
    assert patch["spec"]["template"]["spec"]["nodeSelector"] is None
    assert (
        patch["metadata"]["annotations"][builders.TEMPLATE_HASH]
        == new["metadata"]["annotations"][builders.TEMPLATE_HASH]
    )


def test_kubectl_restart_annotation_survives_a_drift_patch() -> None:
    desired = builders.deployment(spec(concurrency=3), OWNER, replicas=1)
    live = live_from(builders.deployment(spec(), OWNER, replicas=1))
    live["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = "t"
    patch = builders.deployment_patch(desired, live)
    annotations = patch["spec"]["template"].get("metadata", {}).get("annotations", {})
    assert "kubectl.kubernetes.io/restartedAt" not in annotations


def test_missing_owner_reference_and_labels_are_restored() -> None:
    desired = builders.deployment(spec(), OWNER, replicas=1)
    live = live_from(desired)
    live["metadata"]["ownerReferences"] = []
    del live["metadata"]["labels"]["app.kubernetes.io/part-of"]
    patch = builders.deployment_patch(desired, live)
    assert patch["metadata"]["ownerReferences"] == desired["metadata"]["ownerReferences"]
    assert patch["metadata"]["labels"] == desired["metadata"]["labels"]
    assert "spec" not in patch


def test_replicas_are_not_the_template_builders_business() -> None:
    desired = builders.deployment(spec(), OWNER, replicas=1)
    live = live_from(desired)
    live["spec"]["replicas"] = 9
    assert builders.deployment_patch(desired, live) == {}


@pytest.mark.parametrize(
    ("want", "have", "expected"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"a": {"b": 1}}, {"a": {"b": 1, "c": 1}}, True),
        ({"l": [1, 2]}, {"l": [1, 2, 3]}, False),
        ({"l": [{"n": 1}]}, {"l": [{"n": 1, "x": 0}]}, True),
        ({"a": 1}, {}, False),
    ],
)
def test_is_subset(want: Any, have: Any, expected: bool) -> None:
    assert builders.is_subset(want, have) is expected


def test_merge_patch_turns_live_into_desired() -> None:
    live = {"a": 1, "b": {"c": 1, "d": 2}, "l": [1], "gone": True}
    desired = {"a": 1, "b": {"c": 2}, "l": [1, 2], "new": "x"}
    patch = builders.merge_patch(live, desired)
    assert patch == {"b": {"c": 2, "d": None}, "l": [1, 2], "new": "x", "gone": None}


def test_scaled_object_patch_only_when_it_differs() -> None:
    s = spec(autoscaling={"mode": "keda"})
    desired = builders.scaled_object(s, OWNER)
    live = copy.deepcopy(desired)
    assert builders.scaled_object_patch(desired, live) == {}
    live["spec"]["maxReplicaCount"] = 99
    assert builders.scaled_object_patch(desired, live)["spec"] == {"maxReplicaCount": 10}


def test_load_shedding_becomes_the_runner_flags() -> None:
    runner = {"image": "w:1", "loadShedding": {"targetSeconds": 0.05}}
    args = builders.runner_args(spec(runner=runner))
    assert args[-4:] == ["--shed-target", "0.05", "--shed-interval", "1"]
    assert "--shed-target" not in builders.runner_args(spec())


def test_load_shedding_needs_a_positive_target() -> None:
    from shigoto_operator.spec import SpecError

    for bad in ({"intervalSeconds": 1}, {"targetSeconds": 0}, {"targetSeconds": 1, "x": 1}):
        with pytest.raises(SpecError, match=r"runner\.loadShedding"):
            spec(runner={"image": "w:1", "loadShedding": bad})


def test_encryption_keys_come_from_their_secret_never_the_manifest() -> None:
    queue = spec(encryption={"keysSecretRef": {"name": "keys-secret"}, "encryptQueue": True})
    [keys] = [e for e in builders.env(queue) if e["name"] == "SHIGOTO_ENCRYPTION_KEYS"]
    ref = {"name": "keys-secret", "key": "keys"}
    assert keys == {"name": "SHIGOTO_ENCRYPTION_KEYS", "valueFrom": {"secretKeyRef": ref}}
    assert queue.encrypt_queue is True
    assert not [e for e in builders.env(spec()) if e["name"] == "SHIGOTO_ENCRYPTION_KEYS"]
