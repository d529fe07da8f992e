"""A real API server, controller manager and RBAC: what kmock and cel-python cannot show.

The CRDs install and reject bad objects at `kubectl apply`; the operator, logged in with its
ServiceAccount's own token, drives a Queue on a fresh database to Ready, scales on 500 jobs and
back to zero, keeps a CronSchedule's row, and is denied what it must not do; a real garbage
collector removes a runner Deployment through its owner reference; the admission policies of the
default install refuse a disallowed image, ServiceAccount or toleration, and a Queue or
CronSchedule naming a Secret its author may not read (as a user impersonated with `--as`).
Needs SHIGOTO_E2E_KUBECONFIG (see conftest.py); no node is needed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from tests.e2e.conftest import (
    OPERATOR_NS,
    ROOT,
    Kube,
    OperatorProcess,
    eventually,
    secret_manifest,
    start_operator,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def queue_manifest(namespace: str, name: str, **spec: Any) -> str:
    body: dict[str, Any] = {
        "database": {"secretRef": {"name": "shigoto-db"}},
        "runner": {"image": "shigoto-example:0.1.0", "imports": ["shigoto_example.workers"]},
        "autoscaling": {
            "minReplicas": 0,
            "maxReplicas": 10,
            "targetJobsPerReplica": 100,
            "pollIntervalSeconds": 1,
            "scaleDownStabilizationSeconds": 2,
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


def cron_manifest(namespace: str, name: str, **spec: Any) -> str:
    body = {
        "schedule": "0 3 * * *",
        "worker": "shigoto_example.workers.nightly_report",
        "database": {"secretRef": {"name": "shigoto-db"}},
        **spec,
    }
    return json.dumps(
        {
            "apiVersion": "shigoto.dev/v1alpha1",
            "kind": "CronSchedule",
            "metadata": {"name": name, "namespace": namespace},
            "spec": body,
        }
    )


# --- the CRDs on a real API server ---------------------------------------------------------------


def test_crds_are_established_and_documented(installed: Kube) -> None:
    explained = installed("explain", "queues.spec.autoscaling.minReplicas")
    assert "scales to zero" in explained
    names = installed("api-resources", "--api-group=shigoto.dev", "-o", "name").split()
    assert sorted(names) == ["cronschedules.shigoto.dev", "queues.shigoto.dev"]


#: (id, manifest maker, a phrase the API server's refusal must contain)
BAD = [
    ("min-above-max", lambda ns: queue_manifest(
        ns, "bad", autoscaling={"minReplicas": 5, "maxReplicas": 2}), "maxReplicas"),
    ("min-above-default-max", lambda ns: queue_manifest(
        ns, "bad", autoscaling={"minReplicas": 11}), "maxReplicas"),
    ("no-runner", lambda ns: queue_manifest(ns, "bad", runner=None), "spec.runner"),
    ("empty-image", lambda ns: queue_manifest(ns, "bad", runner={"image": ""}),
     "spec.runner.image"),
    ("concurrency-0", lambda ns: queue_manifest(ns, "bad", concurrency=0), "spec.concurrency"),
    ("queue-name-space", lambda ns: queue_manifest(ns, "bad", queueName="two words"),
     "spec.queueName"),
    ("bad-schema", lambda ns: queue_manifest(
        ns, "bad", database={"secretRef": {"name": "x"}, "schema": "a;b"}),
     "spec.database.schema"),
    ("unknown-field", lambda ns: queue_manifest(ns, "bad", concurency=5), "concurency"),
    ("object-name-too-long", lambda ns: queue_manifest(ns, "q" * 60), "metadata.name"),
    ("cron-four-fields", lambda ns: cron_manifest(ns, "bad", schedule="* * * *"),
     "spec.schedule"),
    ("cron-bad-catch-up", lambda ns: cron_manifest(ns, "bad", catchUp="some"), "spec.catchUp"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "phrase"), [pytest.param(m, p, id=i) for i, m, p in BAD])
def test_bad_objects_are_refused_at_apply(installed: Kube, make: Any, phrase: str) -> None:
    result = installed.apply(make("default"), dry_run=True)
    assert result.returncode != 0, f"accepted:\n{result.stdout}"
    assert phrase in result.stderr, result.stderr


def test_minimal_objects_are_accepted_and_defaulted(installed: Kube) -> None:
    for manifest in (queue_manifest("default", "ok"), cron_manifest("default", "ok")):
        result = installed.run("apply", "--dry-run=server", "-o", "json", "-f", "-", stdin=manifest)
        spec = json.loads(result.stdout)["spec"]
        assert spec["database"]["migrate"] is True
        assert spec["database"]["schema"] == "public"
    queue = json.loads(
        installed.run(
            "apply",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
            stdin=queue_manifest("default", "ok", autoscaling=None),
        ).stdout
    )
    assert queue["spec"]["autoscaling"]["minReplicas"] == 0
    assert queue["spec"]["autoscaling"]["maxReplicas"] == 10


# --- RBAC, as the API server enforces it ---------------------------------------------------------

ALLOWED = [
    ("get", "secrets"),
    ("create", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("delete", "deployments.apps"),
    ("watch", "queues.shigoto.dev"),
    ("patch", "queues.shigoto.dev/status"),
    ("patch", "cronschedules.shigoto.dev"),
    ("create", "events"),
    # deletion costs on runner pods, and their optional PodDisruptionBudget
    ("list", "pods"),
    ("patch", "pods"),
    ("create", "poddisruptionbudgets.policy"),
    ("delete", "poddisruptionbudgets.policy"),
    # leader election between the replicas (kopf's peering)
    ("watch", "clusterkopfpeerings.kopf.dev"),
    ("patch", "clusterkopfpeerings.kopf.dev"),
]
DENIED = [
    ("list", "secrets"),
    ("watch", "secrets"),
    ("create", "secrets"),
    ("get", "pods"),
    ("watch", "pods"),
    ("create", "pods"),
    ("delete", "pods"),
    ("update", "pods"),
    ("update", "deployments.apps"),
    ("delete", "queues.shigoto.dev"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("get", "configmaps"),
]


def test_the_operator_is_allowed_what_it_uses_and_denied_the_rest(installed: Kube) -> None:
    assert [rule for rule in ALLOWED if not installed.can_i(*rule, namespace="default")] == []
    assert [rule for rule in DENIED if installed.can_i(*rule, namespace="default")] == []
    assert [rule for rule in DENIED if installed.can_i(*rule)] == []


# --- the operator under its own ServiceAccount ---------------------------------------------------


def _condition(kube: Kube, kind: str, namespace: str, name: str, type_: str) -> dict[str, Any]:
    obj = kube.get(kind, "-n", namespace, name) or {}
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return {}


def _replicas(kube: Kube, namespace: str, queue: str) -> int | None:
    dep = kube.get("deployment", "-n", namespace, f"shigoto-runner-{queue}")
    return None if dep is None else int(dep["spec"].get("replicas", 1))


#: kopf's log lines start with a timestamp whose milliseconds may read 403.
_TIMESTAMP = re.compile(r"^\[[0-9-]+ [0-9:]+,[0-9]+\]")


def _no_forbidden(operator: OperatorProcess) -> None:
    log = operator.output()
    refused = [
        line
        for line in log.splitlines()
        if re.search(r"\b403\b|Forbidden", _TIMESTAMP.sub("", line))
    ]
    assert refused == [], "\n".join(refused)


def test_queue_and_cron_lifecycle_with_the_operators_own_rights(
    installed: Kube, namespace: str, fresh_db: str, operator_as_sa: OperatorProcess
) -> None:
    kube, ns = installed, namespace
    try:
        kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
        kube.run("apply", "-f", "-", stdin=queue_manifest(ns, "mail"))

        # A fresh database becomes Ready: the operator migrated it.
        eventually(
            lambda: _condition(kube, "queue", ns, "mail", "Ready").get("reason") == "ScaledToZero",
            timeout=90,
            message="Queue Ready (ScaledToZero) on a fresh database",
        )
        queue = kube.get("queue", "-n", ns, "mail")
        dep = kube.get("deployment", "-n", ns, "shigoto-runner-mail")
        assert queue is not None and dep is not None
        [owner] = dep["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Queue", queue["metadata"]["uid"])

        # 500 jobs: up to ceil(500 / 100) = 5, with the counts in `kubectl get queues`.
        shigoto.enqueue_many(
            [
                {
                    "worker": "shigoto_example.workers.hello",
                    "args": {"name": str(i)},
                    "queue": "mail",
                }
                for i in range(500)
            ],
            database_url=fresh_db,
        )
        eventually(lambda: _replicas(kube, ns, "mail") == 5, timeout=60, message="5 replicas")
        table = eventually(
            lambda: (out := kube("get", "queues.shigoto.dev", "-n", ns)) and " 500 " in out and out,
            timeout=60,
            message="500 available jobs in kubectl get queues",
        )
        assert "AVAILABLE" in table.splitlines()[0]

        # The jobs finish (runner pods need a node; here the rows are finished directly).
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(
                "UPDATE shigoto_jobs SET state = 'completed', completed_at = now(), "
                "finished_at = now() WHERE queue = 'mail'"
            )
        eventually(lambda: _replicas(kube, ns, "mail") == 0, timeout=60, message="back to 0")

        # A CronSchedule's row exists while the object does.
        kube.run("apply", "-f", "-", stdin=cron_manifest(ns, "nightly"))
        eventually(
            lambda: (
                _condition(kube, "cronschedule", ns, "nightly", "Ready").get("status") == "True"
            ),
            timeout=60,
            message="CronSchedule Ready",
        )
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (1,)
        kube("delete", "cronschedule", "-n", ns, "nightly", "--timeout=60s")
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (0,)

        kube("delete", "queue", "-n", ns, "mail", "--timeout=60s")
        eventually(
            lambda: kube.get("deployment", "-n", ns, "shigoto-runner-mail") is None,
            timeout=60,
            message="runner Deployment deleted with its Queue",
        )
        _no_forbidden(operator_as_sa)
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- operator log ---\n{operator_as_sa.output()}") from None


def test_garbage_collector_removes_the_runner_deployment_through_its_owner_reference(
    installed: Kube, namespace: str, fresh_db: str, operator_as_sa: OperatorProcess
) -> None:
    """With the operator gone and its finalizer removed, only the owner reference is left
    to clean up: the cluster's own garbage collector must accept it and act on it."""
    kube, ns = installed, namespace
    kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "shigoto-db", fresh_db))
    kube.run("apply", "-f", "-", stdin=queue_manifest(ns, "gc"))
    eventually(
        lambda: kube.get("deployment", "-n", ns, "shigoto-runner-gc"),
        timeout=90,
        message="runner Deployment created",
    )
    operator_as_sa.stop()
    kube("patch", "queue", "-n", ns, "gc", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    kube("delete", "queue", "-n", ns, "gc", "--timeout=60s")
    eventually(
        lambda: kube.get("deployment", "-n", ns, "shigoto-runner-gc") is None,
        timeout=120,
        message="garbage collector removed the orphaned Deployment",
    )


# --- the admission policies, part of the default install -----------------------------------------


def _in_force(kube: Kube) -> None:
    """A policy takes effect within seconds of its install: the API server compiles it
    asynchronously."""
    evil = queue_manifest("default", "evil", runner={"image": "docker.io/evil/miner:1"})
    eventually(
        lambda: "spec.runner.image" in kube.apply(evil, dry_run=True).stderr,
        timeout=60,
        message="admission policy in force",
    )


def test_admission_policy_refuses_disallowed_images_and_service_accounts(
    installed: Kube,
) -> None:
    kube = installed
    _in_force(kube)

    def refused(manifest: str) -> str:
        result = kube.apply(manifest, dry_run=True)
        return result.stderr if result.returncode != 0 else ""

    evil = queue_manifest("default", "evil", runner={"image": "docker.io/evil/miner:1"})
    message = refused(evil)
    assert "spec.runner.image" in message and "docker.io/evil/miner:1" in message
    sa = queue_manifest(
        "default",
        "sa",
        runner={"image": "registry.example.com/w:1", "serviceAccountName": "cluster-admin-ish"},
    )
    assert "spec.runner.serviceAccountName" in refused(sa)
    tolerant = queue_manifest(
        "default",
        "tol",
        runner={"image": "registry.example.com/w:1", "tolerations": [{"operator": "Exists"}]},
    )
    assert "spec.runner.tolerations" in refused(tolerant)
    fine = queue_manifest("default", "fine", runner={"image": "registry.example.com/w:1"})
    assert refused(fine) == ""


AUTHOR = "alice"  # impersonated: a user, not a ServiceAccount, with only the Role below


def _role(namespace: str, name: str, rules: list[dict[str, Any]]) -> str:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": namespace}, "rules": rules}  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": AUTHOR}],
    }  # fmt: skip
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]})


def test_a_queue_author_cannot_name_a_secret_they_may_not_read(
    installed: Kube, namespace: str
) -> None:
    """The confused deputy closed: alice may create Queues and CronSchedules but not read
    Secrets. The operator could read any Secret of the namespace and hand it to a runner pod
    running alice's image; the policy asks the API server's authorizer, as alice, about each
    Secret the object names, and refuses at apply with the field. Once alice may get that
    Secret herself, the same Queue is accepted."""
    kube, ns = installed, namespace
    _in_force(kube)
    kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "team-db", "postgresql://x@db/x"))
    kube.run("apply", "-f", "-", stdin=secret_manifest(ns, "payroll", "postgresql://y@db/y"))
    kube.run("apply", "-f", "-", stdin=_role(ns, "queue-author", [
        {"apiGroups": ["shigoto.dev"], "resources": ["queues", "cronschedules"],
         "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
    ]))  # fmt: skip

    def can(verb: str, what: str) -> bool:
        argv = ["auth", "can-i", verb, what, "-n", ns, f"--as={AUTHOR}"]
        return kube.run(*argv, check=False).stdout.strip() == "yes"

    def as_author(manifest: str) -> Any:
        return kube.run(f"--as={AUTHOR}", "apply", "-f", "-", stdin=manifest, check=False)

    assert can("create", "queues.shigoto.dev") and can("patch", "cronschedules.shigoto.dev")
    assert not can("get", "secret/team-db") and not can("list", "secrets")

    image = {"image": "shigoto-example:0.1.0"}
    queue = queue_manifest(ns, "q", database={"secretRef": {"name": "team-db"}}, runner=image)
    cron = cron_manifest(ns, "c", database={"secretRef": {"name": "team-db"}})
    for manifest, kind in ((queue, "queue"), (cron, "cronschedule")):
        result = as_author(manifest)  # a real apply, not a dry run
        assert result.returncode != 0, f"{kind} accepted:\n{result.stdout}"
        said = result.stderr
        assert "spec.database.secretRef names Secret team-db" in said, said
        assert f"which you ({AUTHOR}) may not get in namespace {ns}" in said, said
        assert "ask for get on it" in said, said  # the fix
        assert kube.get(kind, "-n", ns, kind[0]) is None
    # granted `get` on that one Secret (by name), alice may use it
    kube.run("apply", "-f", "-", stdin=_role(ns, "read-team-db", [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["team-db"],
         "verbs": ["get"]},
    ]))  # fmt: skip
    eventually(lambda: can("get", "secret/team-db"), timeout=30, message="grant in force")
    for manifest, kind in ((queue, "queue"), (cron, "cronschedule")):
        result = as_author(manifest)
        assert result.returncode == 0, f"{kind} refused after the grant:\n{result.stderr}"
        assert kube.get(kind, "-n", ns, kind[0]) is not None
    # ... and only it: every other place a Queue can name a Secret is checked the same way
    readable = {"secretRef": {"name": "team-db"}}
    elsewhere = {
        "spec.runner.env[SMTP].valueFrom.secretKeyRef": {"runner": {**image, "env": [
            {"name": "SMTP", "valueFrom": {"secretKeyRef": {"name": "payroll", "key": "url"}}}]}},
        "spec.runner.envFrom[].secretRef": {"runner": {**image, "envFrom": [
            {"secretRef": {"name": "payroll"}}]}},
        "spec.encryption.keysSecretRef": {"encryption": {"keysSecretRef": {"name": "payroll"}}},
    }  # fmt: skip
    for field, spec in elsewhere.items():
        result = as_author(queue_manifest(ns, "other", **spec, database=readable))
        assert result.returncode != 0 and field in result.stderr, (field, result.stderr)
    # ... nor on a change of her Queue's spec
    patch = {"spec": {"database": {"directUrlSecretRef": {"name": "payroll"}}}}
    result = kube.run(f"--as={AUTHOR}", "-n", ns, "patch", "queue", "q", "--type=merge",
                      "-p", json.dumps(patch), check=False)  # fmt: skip
    assert result.returncode != 0, result.stdout
    assert "spec.database.directUrlSecretRef names Secret payroll" in result.stderr
    # and an image outside the allowed prefixes stays refused whatever she may read
    evil = queue_manifest(ns, "q2", database={"secretRef": {"name": "team-db"}},
                          runner={"image": "docker.io/evil/miner:1"})  # fmt: skip
    result = as_author(evil)
    assert result.returncode != 0 and "spec.runner.image docker.io/evil/miner:1" in result.stderr
    # a Queue an admin made with a Secret alice may not read: she may not change its spec
    # (her image would get that Secret), while metadata alone, which is what the operator
    # writes (finalizers, annotations), is never checked
    kube.run("apply", "-f", "-", stdin=queue_manifest(
        ns, "legacy", database={"secretRef": {"name": "payroll"}}, runner=image))  # fmt: skip
    result = kube.run(f"--as={AUTHOR}", "-n", ns, "patch", "queue", "legacy", "--type=merge",
                      "-p", '{"spec":{"concurrency":3}}', check=False)  # fmt: skip
    assert result.returncode != 0 and "names Secret payroll" in result.stderr, result.stderr
    kube(f"--as={AUTHOR}", "-n", ns, "annotate", "queue", "legacy", "e2e=1")


# --- the namespaced install -------------------------------------------------------------------

WATCHED = "shigoto-demo"  # the namespace deploy/namespaced/ grants and watches


@pytest.fixture
def namespaced_install(installed: Kube) -> Any:
    """deploy/namespaced/ in place of the cluster-wide rights: its Role in the watched
    namespace and the CRD-only ClusterRole, with the base's ClusterRoleBinding removed so
    nothing else is granted. The cluster-wide install is put back afterwards."""
    kube = installed
    kube.run(
        "apply", "-f", "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WATCHED}}),
    )  # fmt: skip
    kube("apply", "-k", str(ROOT / "deploy" / "namespaced"))
    kube("-n", OPERATOR_NS, "scale", "deployment/shigoto-operator", "--replicas=0")
    kube("delete", "clusterrolebinding", "shigoto-operator")
    try:
        yield kube
    finally:
        kube("delete", "-n", WATCHED, "role,rolebinding", "shigoto-operator", "--ignore-not-found")
        kube(
            "delete",
            "clusterrole,clusterrolebinding",
            "shigoto-operator-crds",
            "--ignore-not-found",
        )
        kube("apply", "-k", str(ROOT / "deploy"))
        kube("-n", OPERATOR_NS, "scale", "deployment/shigoto-operator", "--replicas=0")


def test_namespaced_install_runs_a_queue_with_roles_alone(
    namespaced_install: Kube, fresh_db: str, tmp_path: Path
) -> None:
    kube = namespaced_install
    assert kube.can_i("get", "secrets", namespace=WATCHED)
    assert kube.can_i("create", "deployments.apps", namespace=WATCHED)
    assert not kube.can_i("get", "secrets", namespace="default"), "no Secret outside"
    assert not kube.can_i("create", "deployments.apps", namespace="default")
    assert not kube.can_i("list", "secrets", namespace=WATCHED), "get by name only"

    operator = start_operator(kube, tmp_path, namespaces=(WATCHED,))
    try:
        kube.run("apply", "-f", "-", stdin=secret_manifest(WATCHED, "shigoto-db", fresh_db))
        kube.run("apply", "-f", "-", stdin=queue_manifest(WATCHED, "scoped"))
        eventually(
            lambda: _condition(kube, "queue", WATCHED, "scoped", "Ready").get("status") == "True",
            timeout=90,
            message="Queue Ready under the namespaced rights",
        )
        assert kube.get("deployment", "-n", WATCHED, "shigoto-runner-scoped") is not None
        kube("delete", "queue", "-n", WATCHED, "scoped", "--timeout=60s")
        eventually(
            lambda: kube.get("deployment", "-n", WATCHED, "shigoto-runner-scoped") is None,
            timeout=60,
            message="runner Deployment deleted with its Queue",
        )
        _no_forbidden(operator)
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- operator log ---\n{operator.output()}") from None
    finally:
        operator.stop()
        kube("delete", "secret", "-n", WATCHED, "shigoto-db", "--ignore-not-found")
