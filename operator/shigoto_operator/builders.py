"""Queue spec → Kubernetes manifests (runner Deployment, KEDA ScaledObject), and drift patches.

Pure: plain dicts in, plain dicts out, so every field of the pod template is unit-tested and the
handlers only send what these functions return. Imports neither kopf, the Kubernetes client
nor psycopg.

Drift. The pod template belongs to the Queue spec and replicas to the autoscaler. A Deployment
drifted when a field the operator sets differs from the live object (someone edited it), or when
the template hash annotation differs (the spec changed, which may also mean a field was
*removed*, something a subset check cannot see). The fix is a JSON merge patch (RFC 7386) that
turns the live template into the desired one: lists are replaced whole, keys the operator no
longer sets are nulled. Fields the API server defaults are nulled too and simply re-defaulted, so
the result is exactly the spec's template; the patch is only sent when drift was seen.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from shigoto_operator import crds
from shigoto_operator.spec import MAX_CONNECTIONS_ENV, QueueSpec

RUNNER_CONTAINER = "runner"
PORT_NAME = "http"
TMP_SIZE_LIMIT = "256Mi"
#: Runner images run as this user (Dockerfile.runner); set explicitly so `runAsNonRoot` holds
#: even for a derived image whose USER is a name the kubelet cannot check.
RUNNER_UID = 10001
#: Added to `shutdownTimeoutSeconds`: the runner must be able to put unfinished jobs back and
#: close its connections after the timeout, before the kubelet's SIGKILL.
GRACE_MARGIN_SECONDS = 15

TEMPLATE_HASH = "shigoto.dev/template-hash"
QUEUE_ANNOTATION = "shigoto.dev/queue"
#: Template annotations written by kubectl (`rollout restart`) survive a drift patch: removing
#: them would roll the pods a second time.
_KEPT_ANNOTATION_PREFIXES = ("kubectl.kubernetes.io/",)

KEDA_API_VERSION = "keda.sh/v1alpha1"


def runner_name(queue_object_name: str) -> str:
    """`shigoto-runner-<metadata.name>`: the contract's name for a Queue's Deployment."""
    return f"{crds.RUNNER_PREFIX}{queue_object_name}"


def selector_labels(spec: QueueSpec) -> dict[str, str]:
    """The Deployment's selector: immutable once created, so derived from the name only."""
    return {
        "app.kubernetes.io/name": "shigoto-runner",
        "app.kubernetes.io/instance": spec.name,
    }


def labels(spec: QueueSpec) -> dict[str, str]:
    return {
        **selector_labels(spec),
        "app.kubernetes.io/component": "runner",
        "app.kubernetes.io/managed-by": "shigoto-operator",
        "app.kubernetes.io/part-of": "shigoto",
    }


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """An owner reference to the Queue, so the garbage collector removes what it owns.

    `blockOwnerDeletion` is left out: setting it needs `update` on `queues/finalizers`, a
    permission the operator does not otherwise need; the operator deletes the Deployment itself
    when the Queue goes, and the collector still removes orphans in the background.
    """
    meta = owner.get("metadata", {})
    if not meta.get("uid"):
        raise ValueError("the owner has no metadata.uid; it must come from the API server")
    return {
        "apiVersion": owner.get("apiVersion", crds.API_VERSION),
        "kind": owner.get("kind", crds.QUEUE_KIND),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def runner_args(spec: QueueSpec) -> list[str]:
    """`shigoto run` flags. Flags rather than env vars: they show in `kubectl describe`."""
    q = spec.queue_name
    args = ["run", "--queue", f"{q}={spec.concurrency}"]
    for module in spec.runner.imports:
        args += ["--import", module]
    args += [
        "--health-port",
        str(spec.runner.health_port),
        "--shutdown-timeout",
        str(spec.runner.shutdown_timeout_seconds),
        "--schema",
        spec.database.schema,
        # the operator migrates the database (or it is managed elsewhere); a runtime role
        # need not hold DDL rights, and N pods racing to migrate would only wait on the lock
        "--no-migrate",
    ]
    if spec.global_concurrency is not None:
        args += ["--global-concurrency", f"{q}={spec.global_concurrency}"]
    if spec.runner.load_shedding is not None:
        target, interval = spec.runner.load_shedding
        args += ["--shed-target", f"{target:g}", "--shed-interval", f"{interval:g}"]
    return args


#: The pod's own name, from the downward API: the runner records it as its node's hostname, so
#: the operator can tell which pod runs which job (`deletion_cost`) even where the hostname is
#: not the pod name (host networking, names past 63 characters).
POD_NAME_ENV = "SHIGOTO_POD_NAME"


def env(spec: QueueSpec, *, max_connections: int | None = None) -> list[dict[str, Any]]:
    """The database URLs (and the encryption keys) from their Secrets, never copied into the
    manifest, the pooler and the pod's connection cap (`budget`) when set, then the user's
    env. Variables for unset fields are left out, so a Queue that uses none of them keeps the
    template (and its pods) it had."""
    ref = spec.database
    out: list[dict[str, Any]] = [
        _secret_env("SHIGOTO_DATABASE_URL", ref.secret_name, ref.secret_key),
        {"name": "SHIGOTO_SCHEMA", "value": ref.schema},
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    if ref.pooler != "none":
        out.append({"name": "SHIGOTO_POOLER", "value": ref.pooler})
    if ref.direct_secret is not None:
        out.append(_secret_env("SHIGOTO_DIRECT_DATABASE_URL", *ref.direct_secret))
    if max_connections is not None:
        out.append({"name": MAX_CONNECTIONS_ENV, "value": str(max_connections)})
    return [*out, *_encryption_env(spec), *copy.deepcopy(list(spec.runner.env))]


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _encryption_env(spec: QueueSpec) -> list[dict[str, Any]]:
    """The encryption keys from their Secret, never copied into the manifest."""
    if spec.encryption_keys is None:
        return []
    name, key = spec.encryption_keys
    return [{"name": "SHIGOTO_ENCRYPTION_KEYS",
             "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}]  # fmt: skip


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _container(
    spec: QueueSpec, name: str, args: list[str], *, max_connections: int | None
) -> dict[str, Any]:
    r = spec.runner
    c: dict[str, Any] = {
        "name": name,
        "image": r.image,
        # the runner image's entrypoint, spelled out so a derived image's own ENTRYPOINT does
        # not change what runs
        "command": ["shigoto"],
        "args": args,
        "env": env(spec, max_connections=max_connections),
    }
    if r.image_pull_policy:
        c["imagePullPolicy"] = r.image_pull_policy
    if r.env_from:
        c["envFrom"] = copy.deepcopy(list(r.env_from))
    if r.resources:
        c["resources"] = copy.deepcopy(dict(r.resources))
    c["securityContext"] = _container_security()
    c["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    return c


def _probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def pod_template(spec: QueueSpec, *, max_connections: int | None = None) -> dict[str, Any]:
    """The runner pods; `max_connections` is each pod's share of the Queue's connection
    budget (`budget.plan`), None without one."""
    r = spec.runner
    runner = _container(spec, RUNNER_CONTAINER, runner_args(spec), max_connections=max_connections)
    runner["ports"] = [{"name": PORT_NAME, "containerPort": r.health_port, "protocol": "TCP"}]
    # Importing a large worker package can take a while: the startup probe gives it two
    # minutes before liveness (which restarts) takes over.
    runner["startupProbe"] = _probe("/healthz", period=2, failures=60)
    runner["livenessProbe"] = _probe("/healthz", period=10, failures=3)
    runner["readinessProbe"] = _probe("/readyz", period=5, failures=2)

    annotations = dict(r.pod_annotations or {})
    annotations.update(
        {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(r.health_port),
            "prometheus.io/path": "/metrics",
        }
    )
    pod: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNNER_UID,
            "runAsGroup": RUNNER_UID,
            "fsGroup": RUNNER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": r.shutdown_timeout_seconds + GRACE_MARGIN_SECONDS,
        "containers": [runner],
        # bounded, so a runaway worker writing to /tmp gets its pod evicted, not the node's
        # disk filled
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}}],
    }
    if r.service_account_name:
        pod["serviceAccountName"] = r.service_account_name
    else:
        # runners never call the Kubernetes API; without a chosen account, mount no token
        pod["automountServiceAccountToken"] = False
    if r.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in r.image_pull_secrets]
    if r.node_selector:
        pod["nodeSelector"] = dict(r.node_selector)
    if r.tolerations:
        pod["tolerations"] = copy.deepcopy(list(r.tolerations))
    if r.affinity:
        pod["affinity"] = copy.deepcopy(dict(r.affinity))
    return {
        # the operator's labels win: the selector must keep matching
        "metadata": {
            "labels": {**(r.pod_labels or {}), **labels(spec)},
            "annotations": annotations,
        },
        "spec": pod,
    }


def template_hash(template: Mapping[str, Any]) -> str:
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def deployment(
    spec: QueueSpec,
    owner: Mapping[str, Any],
    *,
    replicas: int | None,
    max_connections: int | None = None,
) -> dict[str, Any]:
    """The runner Deployment. `replicas=None` leaves them to someone else (KEDA's HPA);
    `max_connections` is each pod's connection cap (`budget`)."""
    template = pod_template(spec, max_connections=max_connections)
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": runner_name(spec.name),
            "namespace": spec.namespace,
            "labels": labels(spec),
            "annotations": {
                QUEUE_ANNOTATION: spec.queue_name,
                TEMPLATE_HASH: template_hash(template),
            },
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector_labels(spec)},
            # never fewer serving pods than wanted during a rollout
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
            },
            "template": template,
        },
    }
    if replicas is not None:
        body["spec"]["replicas"] = replicas
    return body


# --- KEDA --------------------------------------------------------------------------------------


def _sql_literal(text: str) -> str:
    # standard_conforming_strings is on by default since PostgreSQL 9.1: only quotes matter
    return "'" + text.replace("'", "''") + "'"


def keda_query(spec: QueueSpec) -> str:
    """The operator's own demand measure as one count: available and executing jobs, plus
    scheduled or retryable ones due within the next poll (they need a runner to stage them)."""
    table = f'"{spec.database.schema}".shigoto_jobs'  # the schema matches a plain identifier
    poll = spec.autoscaling.poll_interval_seconds
    return (
        f"SELECT count(*) FROM {table} WHERE queue = {_sql_literal(spec.queue_name)} "
        "AND (state IN ('available', 'executing') OR (state IN ('scheduled', 'retryable') "
        f"AND scheduled_at <= now() + interval '{poll} seconds'))"
    )


def scaled_object(
    spec: QueueSpec, owner: Mapping[str, Any], *, max_replicas: int | None = None
) -> dict[str, Any]:
    """A KEDA ScaledObject for `autoscaling.mode: keda`; `max_replicas` lowers
    `maxReplicas` to what the connection budget allows.

    The connection comes from the runner container's own SHIGOTO_DATABASE_URL
    (`connectionFromEnv`), which KEDA resolves from the Secret; no TriggerAuthentication.
    """
    a = spec.autoscaling
    most = a.max_replicas if max_replicas is None else min(a.max_replicas, max_replicas)
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {
            "name": runner_name(spec.name),
            "namespace": spec.namespace,
            "labels": labels(spec),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": runner_name(spec.name),
            },
            "pollingInterval": a.poll_interval_seconds,
            "cooldownPeriod": a.scale_down_stabilization_seconds,
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": most,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": a.scale_down_stabilization_seconds
                        }
                    }
                }
            },
            "triggers": [
                {
                    "type": "postgresql",
                    "metadata": {
                        "query": keda_query(spec),
                        "targetQueryValue": str(a.target_jobs_per_replica),
                        "activationTargetQueryValue": "0",
                        "connectionFromEnv": "SHIGOTO_DATABASE_URL",
                    },
                }
            ],
        },
    }


# --- PodDisruptionBudget ----------------------------------------------------------------------


def pod_disruption_budget(spec: QueueSpec, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The runner pods' PodDisruptionBudget (`spec.disruption`), named like the Deployment
    and owned by the Queue, so the garbage collector removes it with the Queue."""
    assert spec.disruption is not None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": runner_name(spec.name),
            "namespace": spec.namespace,
            "labels": labels(spec),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "selector": {"matchLabels": selector_labels(spec)},
            **copy.deepcopy(dict(spec.disruption)),
        },
    }


# --- drift -------------------------------------------------------------------------------------


def is_subset(want: Any, have: Any) -> bool:
    """True when every field of `want` is in `have` with the same value.

    Lists must match item by item (their length too): a merge patch replaces lists whole, so a
    list holding anything extra is drift.
    """
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            k in have and is_subset(v, have[k]) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(is_subset(w, h) for w, h in zip(want, have, strict=True))
        )
    return bool(want == have)


def merge_patch(live: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns `live` into `desired`."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        current = live.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            sub = merge_patch(current, value)
            if sub:
                patch[key] = sub
        elif key not in live or current != value:
            patch[key] = copy.deepcopy(value)
    for key in live:
        if key not in desired:
            patch[key] = None
    return patch


def _keep_kubectl_annotations(patch: dict[str, Any]) -> None:
    annotations = patch.get("metadata", {}).get("annotations")
    if isinstance(annotations, dict):
        for key in [k for k, v in annotations.items() if v is None]:
            if key.startswith(_KEPT_ANNOTATION_PREFIXES):
                del annotations[key]
        if not annotations:
            del patch["metadata"]["annotations"]
        if not patch["metadata"]:
            del patch["metadata"]


def _metadata_patch(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    want, have = desired.get("metadata", {}), live.get("metadata", {})
    patch: dict[str, Any] = {}
    for key in ("labels", "annotations"):
        if want.get(key) and not is_subset(want[key], have.get(key) or {}):
            patch[key] = copy.deepcopy(want[key])
    wanted_uids = {ref.get("uid") for ref in want.get("ownerReferences", [])}
    live_uids = {ref.get("uid") for ref in have.get("ownerReferences") or []}
    if not wanted_uids <= live_uids:
        patch["ownerReferences"] = copy.deepcopy(want["ownerReferences"])
    return patch


def deployment_patch(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """What to send so the live Deployment carries the desired template; `{}` when it does.

    Replicas are not compared here: they belong to the autoscaler (see `reconcile`).
    """
    patch: dict[str, Any] = {}
    metadata = _metadata_patch(desired, live)
    if metadata:
        patch["metadata"] = metadata
    want_t = desired["spec"]["template"]
    have_t = live.get("spec", {}).get("template") or {}
    want_hash = desired["metadata"]["annotations"][TEMPLATE_HASH]
    have_hash = (live.get("metadata", {}).get("annotations") or {}).get(TEMPLATE_HASH)
    if have_hash != want_hash or not is_subset(want_t, have_t):
        template = merge_patch(have_t, want_t)
        _keep_kubectl_annotations(template)
        if template:
            patch.setdefault("spec", {})["template"] = template
        # the hash travels with the template it describes
        patch.setdefault("metadata", {}).setdefault("annotations", {})[TEMPLATE_HASH] = want_hash
    return patch


def scaled_object_patch(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """What to send so a live ScaledObject (or PodDisruptionBudget) matches; `{}` when it
    does."""
    patch: dict[str, Any] = {}
    metadata = _metadata_patch(desired, live)
    if metadata:
        patch["metadata"] = metadata
    if not is_subset(desired["spec"], live.get("spec") or {}):
        patch["spec"] = merge_patch(live.get("spec") or {}, desired["spec"])
    return patch
