"""Queue and CronSchedule specs: defaults applied like the API server, bad input named (pure)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import shigoto_operator
from shigoto_operator.spec import (
    AutoscalingSpec,
    DatabaseRef,
    SpecError,
    cron_row_name,
    parse_cron,
    parse_queue,
)


def queue_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "database": {"secretRef": {"name": "db"}},
        "runner": {"image": "registry.example.com/workers:1"},
    }
    spec.update(overrides)
    return spec


def cron_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedule": "*/5 * * * *",
        "worker": "shop.workers.report",
        "database": {"secretRef": {"name": "db"}},
    }
    spec.update(overrides)
    return spec


def test_minimal_queue_gets_every_default() -> None:
    q = parse_queue("emails", "shop", queue_spec())
    assert q.name == "emails" and q.namespace == "shop"
    assert q.queue_name == "emails"  # metadata.name
    assert q.concurrency == 10
    assert q.global_concurrency is None
    assert q.paused is False
    assert q.database == DatabaseRef(secret_name="db", secret_key="url", schema="public")
    assert q.runner.image == "registry.example.com/workers:1"
    assert q.runner.shutdown_timeout_seconds == 15
    assert q.runner.health_port == 8000
    assert q.runner.imports == ()
    assert q.forward is None
    assert q.fanout is False
    assert q.autoscaling == AutoscalingSpec(
        mode="operator",
        min_replicas=0,
        max_replicas=10,
        target_jobs_per_replica=100,
        scale_down_stabilization_seconds=300,
        poll_interval_seconds=10,
    )


def test_full_queue_is_read_field_by_field() -> None:
    q = parse_queue(
        "emails",
        "shop",
        queue_spec(
            queueName="mail.outbound",
            concurrency=25,
            globalConcurrency=40,
            paused=True,
            database={"secretRef": {"name": "pg", "key": "dsn"}, "schema": "jobs"},
            runner={
                "image": "img",
                "imagePullPolicy": "Always",
                "imports": ["shop.workers", "shop.more"],
                "env": [{"name": "LOG", "value": "1"}],
                "envFrom": [{"configMapRef": {"name": "cfg"}}],
                "resources": {"limits": {"cpu": "1"}},
                "nodeSelector": {"pool": "workers"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {}},
                "serviceAccountName": "sa",
                "imagePullSecrets": [{"name": "regcred"}],
                "podLabels": {"team": "shop"},
                "podAnnotations": {"a": "b"},
                "shutdownTimeoutSeconds": 60,
                "healthPort": 9000,
            },
            autoscaling={"mode": "keda", "minReplicas": 1, "maxReplicas": 3},
        ),
    )
    assert q.queue_name == "mail.outbound"
    assert (q.concurrency, q.global_concurrency, q.paused) == (25, 40, True)
    assert q.database == DatabaseRef("pg", "dsn", "jobs")
    r = q.runner
    assert r.imports == ("shop.workers", "shop.more")
    assert r.image_pull_secrets == ("regcred",)
    assert r.node_selector == {"pool": "workers"}
    assert (r.shutdown_timeout_seconds, r.health_port) == (60, 9000)
    assert q.autoscaling.mode == "keda"
    assert (q.autoscaling.min_replicas, q.autoscaling.max_replicas) == (1, 3)
    assert q.autoscaling.target_jobs_per_replica == 100  # defaults fill the rest


def test_parsed_spec_does_not_share_mutable_state_with_the_input() -> None:
    raw = queue_spec(runner={"image": "i", "env": [{"name": "A", "value": "1"}]})
    q = parse_queue("q", "ns", raw)
    raw["runner"]["env"][0]["value"] = "changed"
    assert q.runner.env[0]["value"] == "1"


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"runner": {"image": "i"}}, "spec.database", "required"),
        ({"database": {"secretRef": {"name": "db"}}}, "spec.runner", "required"),
        (queue_spec(runner={"imports": []}), "spec.runner.image", "required"),
        (queue_spec(database={"secretRef": {}}), "spec.database.secretRef.name", "required"),
        (queue_spec(concurrency=0), "spec.concurrency", "from 1"),
        (queue_spec(concurrency=True), "spec.concurrency", "whole number"),
        (queue_spec(concurrency="10"), "spec.concurrency", "whole number"),
        (queue_spec(globalConcurrency=0), "spec.globalConcurrency", "from 1"),
        (queue_spec(paused="yes"), "spec.paused", "true or false"),
        (queue_spec(queueName="a,b"), "spec.queueName", "does not match"),
        (queue_spec(queueName="x" * 129), "spec.queueName", "at most 128"),
        # `$` in a Python pattern also matches before a final newline; the whole value must fit
        (queue_spec(queueName="mail\n"), "spec.queueName", "does not match"),
        (
            queue_spec(database={"secretRef": {"name": "db"}, "migrate": "yes"}),
            "spec.database.migrate",
            "true or false",
        ),
        (
            queue_spec(database={"secretRef": {"name": "db"}, "migrationSecretRef": {}}),
            "spec.database.migrationSecretRef.name",
            "required",
        ),
        (
            queue_spec(database={"secretRef": {"name": "db"}, "schema": "bad-schema"}),
            "spec.database.schema",
            "does not match",
        ),
        (
            queue_spec(runner={"image": "i", "imports": ["ok", "not a module"]}),
            "spec.runner.imports[1]",
            "does not match",
        ),
        (
            queue_spec(runner={"image": "i", "imagePullPolicy": "Sometimes"}),
            "spec.runner.imagePullPolicy",
            "Always",
        ),
        (
            queue_spec(runner={"image": "i", "env": [{"name": "SHIGOTO_DATABASE_URL"}]}),
            "spec.runner.env[0].name",
            "set by the operator",
        ),
        (
            queue_spec(runner={"image": "i", "healthPort": 70000}),
            "spec.runner.healthPort",
            "65535",
        ),
        (
            queue_spec(runner={"image": "i", "nodeSelector": {"a": 1}}),
            "spec.runner.nodeSelector",
            "strings",
        ),
        (queue_spec(autoscaling={"mode": "hpa"}), "spec.autoscaling.mode", "operator or keda"),
        (
            queue_spec(autoscaling={"minReplicas": 5, "maxReplicas": 2}),
            "spec.autoscaling.minReplicas",
            "less than or equal",
        ),
        (
            queue_spec(autoscaling={"targetJobsPerReplica": 0}),
            "spec.autoscaling.targetJobsPerReplica",
            "from 1",
        ),
        (
            queue_spec(autoscaling={"pollIntervalSeconds": 0}),
            "spec.autoscaling.pollIntervalSeconds",
            "from 1",
        ),
        (queue_spec(forward=["q-dead"]), "spec.forward", "must be an object"),
        (queue_spec(forward={"retryable": "done"}), "spec.forward.retryable", "completed"),
        (queue_spec(jobDefaults={"maxAttempts": 0}), "spec.jobDefaults.maxAttempts", "from 1"),
        (queue_spec(jobDefaults={"backoffSeconds": [1, -1]}),
         "spec.jobDefaults.backoffSeconds[1]", "at least 0"),
        (queue_spec(jobDefaults={"timeout": 5}), "spec.jobDefaults.timeout", "not a job default"),
        (queue_spec(forward={"discarded": "two words"}), "spec.forward.discarded", "not match"),
        (queue_spec(forward={"cancelled": 5}), "spec.forward.cancelled", "must be a string"),
        # q is metadata.name, hence the queue name by default
        (queue_spec(forward={"discarded": "q"}), "spec.forward.discarded", "q-dead"),
        (
            queue_spec(queueName="mail", forward={"cancelled": "mail"}),
            "spec.forward.cancelled",
            "cannot forward to itself",
        ),
        (queue_spec(fanout="yes"), "spec.fanout", "must be true or false"),
        (queue_spec(fair=1), "spec.fair", "must be true or false"),
        (queue_spec(weight=0), "spec.weight", "from 1 to 1000"),
        (queue_spec(partitionConcurrency=0), "spec.partitionConcurrency", "from 1"),
        (queue_spec(rateLimit=[50]), "spec.rateLimit", "must be an object"),
        (queue_spec(rateLimit={"per": 10}), "spec.rateLimit.limit", "is required"),
        (queue_spec(rateLimit={"limit": 5, "every": 1}), "spec.rateLimit.every", "not a rate"),
        (queue_spec(rateLimit={"limit": 5, "per": -1}), "spec.rateLimit.per", "positive"),
        (queue_spec(rateLimit={"limit": 5, "algorithm": "x"}), "spec.rateLimit.algorithm", "gcra"),
        (
            queue_spec(rateLimit={"limit": 5, "algorithm": "leaky_bucket", "burst": 1}),
            "spec.rateLimit.burst",
            "leave burst at 0",
        ),
    ],
)
def test_bad_queue_spec_names_the_field(spec: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_queue("q", "ns", spec)
    assert caught.value.path == path
    assert words in str(caught.value)
    assert str(caught.value).startswith(path + ":")


def test_flow_settings_are_parsed_into_the_runners_own_names() -> None:
    spec = parse_queue("q", "ns", queue_spec(
        fair=True, weight=3, partitionConcurrency=2,
        rateLimit={"limit": 50, "per": 10, "algorithm": "sliding_window", "byPartition": True},
    ))  # fmt: skip
    assert (spec.fair, spec.weight, spec.partition_concurrency) == (True, 3, 2)
    assert spec.rate_limit == {"limit": 50, "per": 10, "algorithm": "sliding_window",
                               "burst": 0, "by_partition": True}  # fmt: skip
    plain = parse_queue("q", "ns", queue_spec())
    assert (plain.fair, plain.weight, plain.partition_concurrency, plain.rate_limit) == (
        False, 1, None, None)  # fmt: skip


def test_forward_keeps_the_forwarded_states_only() -> None:
    q = parse_queue("q", "ns", queue_spec(forward={"discarded": "q-dead", "cancelled": None}))
    assert q.forward == {"discarded": "q-dead"}
    assert parse_queue("q", "ns", queue_spec(forward={})).forward is None
    # the object's name may be the target when queueName names another queue
    named = parse_queue("q", "ns", queue_spec(queueName="mail", forward={"cancelled": "q"}))
    assert named.forward == {"cancelled": "q"}


def test_fanout_is_parsed() -> None:
    assert parse_queue("q", "ns", queue_spec(fanout=True)).fanout is True
    assert parse_queue("q", "ns", queue_spec(fanout=False)).fanout is False


def test_queue_object_name_must_leave_room_for_the_deployment_name() -> None:
    with pytest.raises(SpecError) as caught:
        parse_queue("x" * 60, "ns", queue_spec())
    assert caught.value.path == "metadata.name"


def test_minimal_cron_gets_every_default() -> None:
    c = parse_cron("nightly", "shop", cron_spec())
    assert (c.schedule, c.worker, c.time_zone) == ("*/5 * * * *", "shop.workers.report", "UTC")
    assert c.args == {}
    assert (c.queue, c.priority, c.max_attempts) == ("default", 0, None)
    assert (c.suspend, c.catch_up, c.catch_up_limit) == (False, "latest", 100)
    assert c.database == DatabaseRef("db", "url", "public")
    assert c.row_name == "shop/nightly"


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"worker": "w", "database": {"secretRef": {"name": "db"}}}, "spec.schedule"),
        (cron_spec(worker=""), "spec.worker"),
        (cron_spec(args=[1, 2]), "spec.args"),
        (cron_spec(queue="a b"), "spec.queue"),
        (cron_spec(maxAttempts=0), "spec.maxAttempts"),
        (cron_spec(suspend="no"), "spec.suspend"),
        (cron_spec(catchUp="some"), "spec.catchUp"),
        (cron_spec(catchUpLimit=0), "spec.catchUpLimit"),
        (cron_spec(tags=["ok", ""]), "spec.tags[1]"),
        (cron_spec(database=None), "spec.database"),
    ],
)
def test_bad_cron_spec_names_the_field(spec: dict[str, Any], path: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_cron("c", "ns", spec)
    assert caught.value.path == path


def test_cron_row_names_are_unique_and_fit_the_table() -> None:
    assert cron_row_name("shop", "nightly") == "shop/nightly"
    long_a = cron_row_name("ns", "a" * 250)
    long_b = cron_row_name("ns", "a" * 249 + "b")
    assert len(long_a) == len(long_b) == 200
    assert long_a != long_b
    assert long_a.startswith("ns/aaa")


PURE = ("crds", "spec", "builders", "policy", "status", "config")
FORBIDDEN = ("kopf", "kubernetes", "psycopg", "psycopg_pool", "shigoto")


@pytest.mark.parametrize("module", PURE)
def test_pure_operator_modules_import_no_io_library(module: str) -> None:
    """The operator's pure modules import neither kopf, the Kubernetes client nor psycopg
    (not even through `shigoto`, whose package imports psycopg), only each other."""
    path = Path(shigoto_operator.__file__).parent / f"{module}.py"
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            top = name.split(".")[0]
            assert top not in FORBIDDEN, f"{module} imports {name}"
            if top == "shigoto_operator" and name.count(".") >= 1:
                sub = name.split(".")[1]
                assert sub in PURE, f"{module} imports the non-pure shigoto_operator.{sub}"


def test_database_migration_settings_are_read() -> None:
    default = parse_queue("q", "ns", queue_spec()).database
    assert (default.migrate, default.migration_secret) == (True, None)
    spec = queue_spec(
        database={
            "secretRef": {"name": "db"},
            "migrate": False,
            "migrationSecretRef": {"name": "owner"},
        }
    )
    db = parse_queue("q", "ns", spec).database
    assert (db.migrate, db.migration_secret) == (False, ("owner", "url"))
