"""The operator in-process against kmock's Kubernetes emulator and the real PostgreSQL.

Queue → Deployment with the right pod template; spec change → Deployment rolled; 500 jobs →
replicas rise to the policy's value; jobs done → replicas fall to the minimum after the window;
drift corrected; status counts match the database; delete → Deployment gone. CronSchedule →
cron row (and jobs from the operator's own scheduler), delete → row gone, invalid → condition
and no row. Every wait is on a condition with a deadline.

The `kmock` fixture comes from kmock's pytest plugin, which plain `pytest` loads through its
entry point (`-p kmock` is only needed where plugin autoloading is disabled).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import shigoto
from shigoto.db import database
from shigoto_operator import k8s
from shigoto_operator.config import OperatorConfig
from shigoto_operator.databases import STOP_TIMEOUT, Database, Databases
from shigoto_operator.metrics import DatabaseHealth
from tests.support.operator_harness import Cluster, eventually, running_operator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

QUEUE = "Queue"
CRON = "CronSchedule"


@pytest.fixture(autouse=True)
def fast_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Operator-wide intervals short enough for a test (per-queue ones are in each spec)."""
    monkeypatch.setenv("SHIGOTO_OPERATOR_CRON_STATUS_INTERVAL", "0.5")
    monkeypatch.setenv("SHIGOTO_OPERATOR_CRON_INTERVAL", "0.5")
    monkeypatch.setenv("SHIGOTO_OPERATOR_LEADER_INTERVAL", "0.5")
    monkeypatch.setenv("SHIGOTO_OPERATOR_RETRY_INTERVAL", "0.5")
    # In-process operators: no metrics server each on port 9090 (test_operator_metrics has one).
    monkeypatch.setenv("SHIGOTO_OPERATOR_METRICS_PORT", "0")


def queue_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "queueName": "mail",
        "concurrency": 10,
        "database": {"secretRef": {"name": "pg"}},
        "runner": {"image": "registry.example.com/shop-workers:1", "imports": ["shop.workers"]},
        "autoscaling": {
            "minReplicas": 0,
            "maxReplicas": 10,
            "targetJobsPerReplica": 100,
            "scaleDownStabilizationSeconds": 1,
            "pollIntervalSeconds": 1,
        },
    }
    spec.update(overrides)
    return spec


def runner(dep: dict[str, Any]) -> dict[str, Any]:
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return dict(container)


def db_counts(conn: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT state, count(*) FROM shigoto_jobs WHERE queue = %s GROUP BY state", (queue,)
    ).fetchall()
    return {state: int(n) for state, n in rows}


async def replicas(cluster: Cluster, name: str) -> int | None:
    dep = await cluster.deployment(name)
    return None if dep is None else dep["spec"].get("replicas")


async def test_queue_lifecycle(kmock: Any, db_url: str, conn: psycopg.Connection[Any]) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "emails", queue_spec())

        # Queue → Deployment with the right pod template, owned by the Queue
        dep = await eventually(lambda: cluster.deployment("emails"), message="Deployment")
        queue = await cluster.get(k8s.QUEUES, "emails")
        assert queue is not None
        assert dep["metadata"]["ownerReferences"][0]["uid"] == queue["metadata"]["uid"]
        assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "shigoto-operator"
        assert dep["spec"]["replicas"] == 0  # no jobs, minReplicas 0
        args = runner(dep)["args"]
        assert args[:3] == ["run", "--queue", "mail=10"]
        assert args[3:5] == ["--import", "shop.workers"]
        assert "--no-migrate" in args
        assert runner(dep)["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "pg", "key": "url"}

        ready = await eventually(
            lambda: cluster.condition(k8s.QUEUES, "emails", "Ready"), message="Ready"
        )
        assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")
        reachable = await cluster.condition(k8s.QUEUES, "emails", "DatabaseReachable")
        assert reachable["status"] == "True"

        # spec change → Deployment patched (a new template rolls the pods)
        await cluster.patch_spec(
            k8s.QUEUES,
            "emails",
            {
                "concurrency": 5,
                "globalConcurrency": 30,
                "paused": True,
                "runner": {"imports": ["shop.workers", "shop.more"]},
            },
        )

        async def rolled() -> dict[str, Any] | None:
            d = await cluster.deployment("emails")
            return d if d and "mail=5" in runner(d)["args"] else None

        dep = await eventually(rolled, message="Deployment rolled to the new spec")
        args = runner(dep)["args"]
        assert args[args.index("--global-concurrency") + 1] == "mail=30"
        assert args.count("--import") == 2

        def settings() -> tuple[Any, ...] | None:
            return conn.execute(
                "SELECT paused, global_concurrency FROM shigoto_queues WHERE name = 'mail'"
            ).fetchone()

        await eventually(
            lambda: _value(settings() == (True, 30)), message="paused and limit in the database"
        )
        status = await eventually(
            lambda: _observed(cluster, "emails", 2), message="observedGeneration 2"
        )
        assert status["observedGeneration"] == 2
        await cluster.patch_spec(k8s.QUEUES, "emails", {"paused": False})
        await eventually(lambda: _value(settings() == (False, 30)), message="resumed")

        # 500 jobs → replicas rise to ceil(500 / 100) = 5 at once
        shigoto.enqueue_many(
            [{"worker": "shop.workers.send", "args": {"n": i}, "queue": "mail"} for i in range(500)]
        )
        await eventually(lambda: _value(replicas(cluster, "emails"), 5), message="scaled up to 5")
        status = await eventually(
            lambda: _jobs_match(cluster, "emails", conn), message="status counts = database"
        )
        assert status["jobs"]["available"] == 500
        assert status["desiredReplicas"] == 5
        assert "lastScaleTime" in status
        assert (await cluster.condition(k8s.QUEUES, "emails", "Scaling"))["status"] == "True"

        # drift: someone scales the Deployment by hand → set back on the next pass
        await k8s.patch(
            k8s.DEPLOYMENTS, cluster.namespace, "shigoto-runner-emails", {"spec": {"replicas": 9}}
        )
        await eventually(
            lambda: _value(replicas(cluster, "emails"), 5), message="replicas drift corrected"
        )

        # jobs done → back to minReplicas after the 1 s window
        conn.execute(
            "UPDATE shigoto_jobs SET state = 'completed', completed_at = now(), "
            "finished_at = now() WHERE queue = 'mail'"
        )
        await eventually(
            lambda: _value(replicas(cluster, "emails"), 0), message="scaled down to zero"
        )
        status = await eventually(
            lambda: _jobs_match(cluster, "emails", conn), message="status counts = database"
        )
        assert status["jobs"]["completed"] == 500
        assert status["jobs"]["available"] == 0
        reasons = cluster.event_reasons()
        for reason in (
            "DeploymentCreated",
            "DeploymentUpdated",
            "SettingsApplied",
            "ScaledUp",
            "ReplicasCorrected",
            "ScaledDown",
        ):
            assert reason in reasons, reasons

        # delete → Deployment gone (explicitly: kmock has no garbage collector)
        await cluster.delete(k8s.QUEUES, "emails")
        await eventually(
            lambda: _absent(cluster.deployment("emails")), message="Deployment deleted"
        )
        await eventually(
            lambda: _absent(cluster.get(k8s.QUEUES, "emails")), message="Queue released"
        )


async def test_queue_forward_is_written_to_the_queue_settings(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """spec.forward reaches shigoto_queues.forward (where the forwarding trigger reads it),
    follows spec changes, has drift made in the database undone, and is cleared with the
    field; a job cancelled meanwhile is forwarded by the setting the operator wrote."""

    def stored() -> Any:
        found = conn.execute("SELECT forward FROM shigoto_queues WHERE name = 'mail'").fetchone()
        return None if found is None else found[0]

    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(
            k8s.QUEUES, QUEUE, "fwd", queue_spec(forward={"discarded": "mail-dead"})
        )
        await eventually(
            lambda: _value(stored() == {"discarded": "mail-dead"}), message="forward written"
        )

        await cluster.patch_spec(
            k8s.QUEUES, "fwd", {"forward": {"discarded": None, "cancelled": "mail-cancelled"}}
        )
        await eventually(
            lambda: _value(stored() == {"cancelled": "mail-cancelled"}), message="forward changed"
        )
        job = shigoto.enqueue("shop.workers.send", {"n": 1}, queue="mail")
        shigoto.cancel_by(ids=[job.id])
        copy = conn.execute(
            "SELECT queue, meta -> 'forwarded_from' ->> 'state' FROM shigoto_jobs "
            "WHERE meta -> 'forwarded_from' ->> 'id' = %s::text",
            (job.id,),
        ).fetchone()
        assert copy == ("mail-cancelled", "cancelled")

        # drift: someone rewrites the setting in the database -> put back on the next pass
        conn.execute(
            'UPDATE shigoto_queues SET forward = \'{"discarded": "elsewhere"}\' '
            "WHERE name = 'mail'"
        )
        await eventually(
            lambda: _value(stored() == {"cancelled": "mail-cancelled"}), message="drift undone"
        )

        await cluster.patch_spec(k8s.QUEUES, "fwd", {"forward": None})
        await eventually(lambda: _value(stored() is None), message="forward cleared")
        # The Event is posted after the write the test saw: wait for it too.
        await eventually(lambda: _value("ForwardApplied" in cluster.event_reasons()),
                         message="ForwardApplied event")  # fmt: skip


async def test_queue_fanout_is_written_to_the_queue_settings(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """spec.fanout reaches shigoto_queues.fanout (where runners read it), follows spec
    changes, and has drift made in the database undone."""

    def stored() -> Any:
        found = conn.execute("SELECT fanout FROM shigoto_queues WHERE name = 'bcast'").fetchone()
        return None if found is None else found[0]

    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "fan", queue_spec(queueName="bcast", fanout=True))
        await eventually(lambda: _value(stored() is True), message="fanout written")
        # The Event is posted after the write the test saw: wait for it too.
        await eventually(lambda: _value("FanoutApplied" in cluster.event_reasons()),
                         message="FanoutApplied event")  # fmt: skip

        await cluster.patch_spec(k8s.QUEUES, "fan", {"fanout": False})
        await eventually(lambda: _value(stored() is False), message="fanout turned off")

        # drift: someone turns it back on in the database -> put back on the next pass
        conn.execute("UPDATE shigoto_queues SET fanout = true WHERE name = 'bcast'")
        await eventually(lambda: _value(stored() is False), message="drift undone")

        await cluster.patch_spec(k8s.QUEUES, "fan", {"fanout": True})
        await eventually(lambda: _value(stored() is True), message="fanout turned on again")


async def test_queue_flow_settings_are_written_to_the_queue_settings(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """spec.fair, weight, partitionConcurrency and rateLimit reach shigoto_queues (where
    runners read them), follow spec changes, and drift in the database is undone."""

    def stored() -> Any:
        return conn.execute(
            "SELECT fair, weight, partition_concurrency, rate_limit, encrypted "
            "FROM shigoto_queues WHERE name = 'tenants'"
        ).fetchone()

    limit = {"limit": 50, "per": 10, "algorithm": "gcra", "burst": 0, "by_partition": True}
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        spec = queue_spec(queueName="tenants", fair=True, weight=3, partitionConcurrency=2,
                          rateLimit={"limit": 50, "per": 10, "byPartition": True},
                          encryption={"keysSecretRef": {"name": "keys"},
                                      "encryptQueue": True})  # fmt: skip
        await cluster.create(k8s.QUEUES, QUEUE, "ten", spec)
        await eventually(lambda: _value(stored() == (True, 3, 2, limit, True)), message="written")
        # The Event is posted after the write the test saw: wait for it too.
        await eventually(lambda: _value("FlowControlApplied" in cluster.event_reasons()),
                         message="FlowControlApplied event")  # fmt: skip

        await cluster.patch_spec(k8s.QUEUES, "ten", {"rateLimit": None, "fair": False,
                                                     "encryption": None})  # fmt: skip
        await eventually(lambda: _value(stored() == (False, 3, 2, None, False)),
                         message="changed")  # fmt: skip

        # drift: someone changes the weight in the database -> put back on the next pass
        conn.execute("UPDATE shigoto_queues SET weight = 9 WHERE name = 'tenants'")
        await eventually(lambda: _value(stored() == (False, 3, 2, None, False)),
                         message="drift undone")  # fmt: skip


async def test_template_drift_is_corrected(kmock: Any, db_url: str) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "drift", queue_spec())
        dep = await eventually(lambda: cluster.deployment("drift"), message="Deployment")
        wanted = runner(dep)
        hacked = {**wanted, "image": "evil:latest", "args": ["run", "--queue", "other=1"]}
        await k8s.patch(
            k8s.DEPLOYMENTS,
            cluster.namespace,
            "shigoto-runner-drift",
            {"spec": {"template": {"spec": {"containers": [hacked], "hostNetwork": True}}}},
        )

        async def restored() -> bool:
            d = await cluster.deployment("drift")
            pod = (d or {}).get("spec", {}).get("template", {}).get("spec", {})
            return bool(d) and runner(d) == wanted and "hostNetwork" not in pod

        await eventually(restored, message="pod template restored")


async def test_invalid_queue_gets_a_condition_and_no_deployment(kmock: Any, db_url: str) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        bad = queue_spec(autoscaling={"minReplicas": 5, "maxReplicas": 2})
        await cluster.create(k8s.QUEUES, QUEUE, "bad", bad)
        ready = await eventually(
            lambda: cluster.condition(k8s.QUEUES, "bad", "Ready"), message="Ready condition"
        )
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        assert "spec.autoscaling.minReplicas" in ready["message"]
        assert await cluster.deployment("bad") is None
        assert "InvalidSpec" in cluster.event_reasons()


async def test_missing_secret_is_reported_then_recovered(kmock: Any, db_url: str) -> None:
    async with running_operator(kmock) as cluster:
        await cluster.create(k8s.QUEUES, QUEUE, "nosecret", queue_spec())
        db = await eventually(
            lambda: _status_is(cluster, "nosecret", "DatabaseReachable", "False"),
            message="DatabaseReachable False",
        )
        assert db["reason"] == "SecretNotFound"
        assert "shop/pg" in db["message"]
        # the Deployment is there already, so pods start as soon as the Secret exists
        assert await cluster.deployment("nosecret") is not None
        cluster.add_secret("pg", {"url": db_url})
        await eventually(
            lambda: _status_is(cluster, "nosecret", "DatabaseReachable", "True"),
            message="recovered",
        )


async def test_keda_mode_emits_a_scaled_object(kmock: Any, db_url: str) -> None:
    kmock.resources["keda.sh/v1alpha1/scaledobjects"] = {
        "kind": "ScaledObject",
        "singular": "scaledobject",
        "namespaced": True,
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    }
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        spec = queue_spec()
        spec["autoscaling"] = {**spec["autoscaling"], "mode": "keda", "maxReplicas": 4}
        await cluster.create(k8s.QUEUES, QUEUE, "kq", spec)
        so = await eventually(
            lambda: k8s.get(k8s.SCALED_OBJECTS, cluster.namespace, "shigoto-runner-kq"),
            message="ScaledObject",
        )
        assert so["spec"]["maxReplicaCount"] == 4
        assert so["spec"]["triggers"][0]["type"] == "postgresql"
        dep = await eventually(lambda: cluster.deployment("kq"), message="Deployment")
        assert "replicas" not in dep["spec"]  # KEDA's HPA owns them

        await cluster.patch_spec(k8s.QUEUES, "kq", {"autoscaling": {"mode": "operator"}})
        await eventually(
            lambda: _absent(k8s.get(k8s.SCALED_OBJECTS, cluster.namespace, "shigoto-runner-kq")),
            message="ScaledObject removed when leaving keda mode",
        )
        await eventually(lambda: _value(replicas(cluster, "kq"), 0), message="operator scales")


def cron_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedule": "*/5 * * * *",
        "timeZone": "Europe/Oslo",
        "worker": "shop.workers.nightly_report",
        "args": {"format": "pdf"},
        "queue": "reports",
        "database": {"secretRef": {"name": "pg"}},
    }
    spec.update(overrides)
    return spec


def cron_row(conn: psycopg.Connection[Any], name: str) -> dict[str, Any] | None:
    cur = conn.execute(
        "SELECT expression, timezone, worker, args, queue, enabled, last_job_id "
        "FROM shigoto_cron WHERE name = %s",
        (name,),
    )
    row = cur.fetchone()
    if row is None:
        return None
    assert cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


async def test_cron_schedule_lifecycle(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.CRON_SCHEDULES, CRON, "nightly", cron_spec())

        row = await eventually(lambda: _value(cron_row(conn, "shop/nightly")), message="row")
        assert row["expression"] == "*/5 * * * *"
        assert (row["timezone"], row["worker"]) == ("Europe/Oslo", "shop.workers.nightly_report")
        assert (row["args"], row["queue"], row["enabled"]) == ({"format": "pdf"}, "reports", True)
        ready = await eventually(
            lambda: _cron_is(cluster, "nightly", "Ready", "True"), message="Ready"
        )
        assert ready["reason"] == "Scheduled"
        assert (await cluster.status(k8s.CRON_SCHEDULES, "nightly")).get("nextScheduleTime")

        # the operator's leader-elected scheduler enqueues due slots: move the row's catch-up
        # point back so a slot is due now, instead of waiting for the next 5-minute boundary
        conn.execute(
            "UPDATE shigoto_cron SET last_slot_at = now() - interval '11 minutes' "
            "WHERE name = 'shop/nightly'"
        )
        status = await eventually(
            lambda: _has(cluster.status(k8s.CRON_SCHEDULES, "nightly"), "lastJobId"),
            message="a slot enqueued by the operator",
        )
        job = conn.execute(
            "SELECT worker, queue, args FROM shigoto_jobs WHERE id = %s", (status["lastJobId"],)
        ).fetchone()
        assert job == ("shop.workers.nightly_report", "reports", {"format": "pdf"})
        assert status["lastScheduleTime"].endswith("Z")

        # suspend → the row stays, disabled
        await cluster.patch_spec(k8s.CRON_SCHEDULES, "nightly", {"suspend": True})
        await eventually(
            lambda: _value((cron_row(conn, "shop/nightly") or {}).get("enabled") is False),
            message="suspended",
        )
        await eventually(
            lambda: _cron_reason(cluster, "nightly", "Suspended"), message="Suspended condition"
        )

        # someone deletes the row by hand → written again on the next pass
        conn.execute("DELETE FROM shigoto_cron WHERE name = 'shop/nightly'")
        await eventually(lambda: _value(cron_row(conn, "shop/nightly")), message="row restored")

        # delete → row gone (kopf's finalizer holds the object until it is)
        await cluster.delete(k8s.CRON_SCHEDULES, "nightly")
        await eventually(
            lambda: _value(cron_row(conn, "shop/nightly") is None), message="row removed"
        )
        await eventually(
            lambda: _absent(cluster.get(k8s.CRON_SCHEDULES, "nightly")), message="object gone"
        )
        reasons = cluster.event_reasons()
        assert "Unscheduled" in reasons
        # written on create, on suspend and after the manual delete; never on a pass that
        # found the row as the spec says
        assert reasons.count("Scheduled") == 3, reasons


async def test_invalid_cron_schedule_writes_nothing(
    kmock: Any, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.CRON_SCHEDULES, CRON, "broken", cron_spec(schedule="61 * * * *"))
        await cluster.create(k8s.CRON_SCHEDULES, CRON, "nozone", cron_spec(timeZone="Mars/Base"))
        ready = await eventually(
            lambda: _cron_is(cluster, "broken", "Ready", "False"), message="invalid schedule"
        )
        assert ready["reason"] == "InvalidSpec"
        assert ready["message"].startswith("spec.schedule:")
        zone = await eventually(
            lambda: _cron_is(cluster, "nozone", "Ready", "False"), message="invalid zone"
        )
        assert zone["message"].startswith("spec.timeZone:")
        assert conn.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (0,)

        # fixed → written
        await cluster.patch_spec(k8s.CRON_SCHEDULES, "broken", {"schedule": "1 * * * *"})
        await eventually(lambda: _value(cron_row(conn, "shop/broken")), message="row once fixed")
        await eventually(
            lambda: _cron_is(cluster, "broken", "Ready", "True"), message="Ready once fixed"
        )


async def test_counts_are_one_query_for_all_queues_of_a_database(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """The per-database cache: any number of queues, one counting query per refresh."""
    shigoto.enqueue_many(
        [{"worker": "w", "queue": "a"}] * 3
        + [{"worker": "w", "queue": "b"}] * 2
        + [{"worker": "w", "queue": "b", "schedule_in": 5}]
    )
    databases = Databases()
    try:
        db_a = await databases.acquire(db_url, "public", "Queue/ns/a", queue="a")
        db_b = await databases.acquire(db_url, "public", "Queue/ns/b", queue="b")
        assert db_a is db_b
        a = await db_a.counts.get("a", max_age=60)
        b = await db_b.counts.get("b", max_age=60)
        assert db_a.counts.queries == 1
        assert (a.counts.available, b.counts.available, b.counts.scheduled) == (3, 2, 1)
        assert b.counts.due_within(10) and not a.counts.due_within(10)
        assert a.paused is None  # no settings row yet
        await databases.release("Queue/ns/a")
        assert databases.known == [db_b]
        assert db_b.counts.queues == {"b"}
        await databases.release("Queue/ns/b")
        assert databases.known == []
    finally:
        await databases.close()


async def test_stopping_a_database_ends_even_when_its_probe_swallows_the_cancel(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """Python 3.11's `wait_for` can swallow a cancel that lands as its inner await completes;
    the probe loop is full of them. Stopping must end the loop anyway, within its bound (it
    once slept on, and the release hung for good)."""
    swallowed, probing = asyncio.Event(), asyncio.Event()

    async def probe_that_swallows_a_cancel() -> DatabaseHealth:
        probing.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            swallowed.set()
        return DatabaseHealth(up=True)

    db = Database(db_url, "public", OperatorConfig(metrics_port=1, metrics_interval=0.01))
    db.probe = probe_that_swallows_a_cancel  # type: ignore[method-assign]
    await db.start()
    await asyncio.sleep(0.2)  # the loop has probed a few times
    assert db.health == DatabaseHealth(up=True)
    assert db._prober is not None
    # Cancel inside a probe (not in the pause between two): once `probing` wakes this test,
    # the prober is suspended in the probe's sleep.
    probing.clear()
    await asyncio.wait_for(probing.wait(), 5)
    db._prober.cancel()  # what the old stop relied on; this probe swallows it
    await asyncio.sleep(0.1)
    assert swallowed.is_set() and not db._prober.done()
    await asyncio.wait_for(db.stop(), STOP_TIMEOUT + 5)
    assert db._prober.done()


# --- small awaitable conditions for `eventually` ---------------------------------------------


async def _value(value: Any, expected: Any = True) -> Any:
    if hasattr(value, "__await__"):
        value = await value
    if expected is True:
        return value
    return value == expected


async def _absent(obj: Any) -> bool:
    return (await obj) is None


async def _has(status: Any, key: str) -> dict[str, Any] | None:
    st = await status
    return st if st.get(key) is not None else None


async def _observed(cluster: Cluster, name: str, generation: int) -> dict[str, Any] | None:
    st = await cluster.status(k8s.QUEUES, name)
    return st if st.get("observedGeneration") == generation else None


async def _status_is(cluster: Cluster, name: str, type_: str, value: str) -> dict[str, Any]:
    c = await cluster.condition(k8s.QUEUES, name, type_)
    return c if c.get("status") == value else {}


async def _cron_is(cluster: Cluster, name: str, type_: str, value: str) -> dict[str, Any]:
    c = await cluster.condition(k8s.CRON_SCHEDULES, name, type_)
    return c if c.get("status") == value else {}


async def _cron_reason(cluster: Cluster, name: str, reason: str) -> bool:
    return (await cluster.condition(k8s.CRON_SCHEDULES, name, "Ready")).get("reason") == reason


async def _jobs_match(
    cluster: Cluster, name: str, conn: psycopg.Connection[Any]
) -> dict[str, Any] | None:
    st = await cluster.status(k8s.QUEUES, name)
    want = db_counts(conn, "mail")
    jobs = st.get("jobs") or {}
    if jobs and all(jobs.get(state, 0) == want.get(state, 0) for state in set(jobs) | set(want)):
        return st
    return None


async def test_two_operators_elect_one_cron_scheduler(db_url: str) -> None:
    """Two operator replicas know the same database: one cron scheduler leads, and the other
    takes over when it goes (the lock is the operator's own, not the runners' `leader`)."""
    config = OperatorConfig(leader_interval=0.2, cron_interval=0.2)
    first, second = Databases(config), Databases(config)
    try:
        a = await first.acquire(db_url, "public", "CronSchedule/ns/x")
        b = await second.acquire(db_url, "public", "CronSchedule/ns/x")

        async def one_leader() -> bool:
            return [a.elector.is_leader, b.elector.is_leader].count(True) == 1

        await eventually(one_leader, message="exactly one leader")
        leader, follower = (first, b) if a.elector.is_leader else (second, a)
        assert "operator-cron" in follower.elector.key
        await leader.close()

        async def took_over() -> bool:
            return follower.elector.is_leader

        await eventually(took_over, message="the follower takes over")
    finally:
        await first.close()
        await second.close()


async def _ready(cluster: Cluster, resource: k8s.Resource, name: str) -> dict[str, Any] | None:
    cond = await cluster.condition(resource, name, "Ready")
    return cond if cond.get("status") == "True" else None


def _tables(url: str, schema: str = "public") -> bool:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute("SELECT to_regclass(%s)", (f"{schema}.shigoto_jobs",)).fetchone()
    return row is not None and row[0] is not None


async def test_fresh_database_is_migrated_and_becomes_ready(kmock: Any, empty_db_url: str) -> None:
    """A Queue with minReplicas 0 on a database nobody migrated: no runner pod will ever start
    to do it, so the operator must (and a CronSchedule must be storable at once)."""
    assert not _tables(empty_db_url)
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": empty_db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "fresh", queue_spec())
        ready = await eventually(lambda: _ready(cluster, k8s.QUEUES, "fresh"), message="Ready")
        assert ready["reason"] == "ScaledToZero"
        assert _tables(empty_db_url)
        assert "Migrated" in cluster.event_reasons()
        await cluster.create(
            k8s.CRON_SCHEDULES,
            CRON,
            "nightly",
            cron_spec(),
        )
        await eventually(
            lambda: _ready(cluster, k8s.CRON_SCHEDULES, "nightly"), message="cron Ready"
        )
        with psycopg.connect(empty_db_url, autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (1,)


async def test_unmigrated_database_with_migrate_false_has_its_own_reason(
    kmock: Any, empty_db_url: str
) -> None:
    """`migrate: false` says someone else owns the schema: the operator writes nothing and
    tells a reachable-but-unmigrated database apart from an unreachable one."""
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": empty_db_url})
        spec = queue_spec(database={"secretRef": {"name": "pg"}, "migrate": False})
        await cluster.create(k8s.QUEUES, QUEUE, "managed", spec)

        async def not_migrated() -> dict[str, Any] | None:
            cond = await cluster.condition(k8s.QUEUES, "managed", "Ready")
            return cond if cond.get("reason") == "SchemaNotMigrated" else None

        ready = await eventually(not_migrated, message="SchemaNotMigrated")
        assert ready["status"] == "False"
        assert "shigoto migrate" in ready["message"]
        reachable = await cluster.condition(k8s.QUEUES, "managed", "DatabaseReachable")
        assert reachable["status"] == "True"
        assert not _tables(empty_db_url)

        shigoto.migrate(empty_db_url)  # the DBA's migration job runs
        await eventually(lambda: _ready(cluster, k8s.QUEUES, "managed"), message="Ready")


async def test_migration_uses_the_migration_secret_and_reports_failures(
    kmock: Any, server_url: str, empty_db_url: str
) -> None:
    """Runtime role in secretRef, owner role in migrationSecretRef: the operator migrates
    with the owner's URL. A runtime role that may not create tables, alone, gets
    MigrationFailed with the server's reason, and the Queue recovers once the owner's
    Secret is named."""
    role = f"rt_{uuid.uuid4().hex[:8]}"
    dbname = conninfo_to_dict(empty_db_url)["dbname"]
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'rt'").format(sql.Identifier(role)))
        c.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
        c.execute(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(dbname), sql.Identifier(role)
            )
        )
        # what docs/kubernetes.md tells the owner role to run once: data rights on what it
        # will create
        c.execute(
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES IN SCHEMA public "
                "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}"
            ).format(sql.Identifier(role))
        )
        c.execute(
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {}"
            ).format(sql.Identifier(role))
        )
    runtime_url = make_conninfo(empty_db_url, user=role, password="rt")
    try:
        async with running_operator(kmock) as cluster:
            cluster.add_secret("pg", {"url": runtime_url})
            cluster.add_secret("pg-owner", {"url": empty_db_url})
            await cluster.create(k8s.QUEUES, QUEUE, "least", queue_spec())

            async def failed() -> dict[str, Any] | None:
                cond = await cluster.condition(k8s.QUEUES, "least", "Ready")
                return cond if cond.get("reason") == "MigrationFailed" else None

            cond = await eventually(failed, message="MigrationFailed")
            assert "permission denied" in cond["message"]
            assert "migrationSecretRef" in cond["message"]
            assert "'rt'" not in cond["message"] and ":rt@" not in cond["message"]

            # A new object (a spec change would wait out the failure's backoff first).
            await cluster.delete(k8s.QUEUES, "least")
            await eventually(lambda: _absent(cluster.get(k8s.QUEUES, "least")), message="gone")
            spec = queue_spec(
                database={"secretRef": {"name": "pg"}, "migrationSecretRef": {"name": "pg-owner"}}
            )
            await cluster.create(k8s.QUEUES, QUEUE, "least2", spec)
            await eventually(lambda: _ready(cluster, k8s.QUEUES, "least2"), message="Ready")
            assert _tables(empty_db_url)
    finally:
        with psycopg.connect(empty_db_url, autocommit=True) as c:
            c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        with psycopg.connect(server_url, autocommit=True) as c:
            c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


async def test_operator_keeps_no_client_pool_per_url(
    kmock: Any, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings, cron rows and their removal all go through the operator's own
    per-database pool (closed with the last object using it) or a short-lived connection:
    the client's cached sync pools, one per URL and never closed, are never touched."""

    def no_sync_pool(*_: Any, **__: Any) -> Any:
        raise AssertionError("the operator used shigoto.db.database.sync_pool")

    monkeypatch.setattr(database, "sync_pool", no_sync_pool)
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "set", queue_spec(paused=True, globalConcurrency=3))
        await cluster.create(
            k8s.CRON_SCHEDULES,
            CRON,
            "rows",
            cron_spec(),
        )
        await eventually(lambda: _ready(cluster, k8s.QUEUES, "set"), message="Queue Ready")
        await eventually(lambda: _ready(cluster, k8s.CRON_SCHEDULES, "rows"), message="cron")
        await cluster.delete(k8s.CRON_SCHEDULES, "rows")
        await eventually(
            lambda: _absent(cluster.get(k8s.CRON_SCHEDULES, "rows")), message="cron deleted"
        )
    with psycopg.connect(db_url, autocommit=True) as c:
        assert c.execute(
            "SELECT paused, global_concurrency FROM shigoto_queues WHERE name = 'mail'"
        ).fetchone() == (True, 3)
        assert c.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (0,)


async def test_a_cron_row_in_a_vanished_database_does_not_block_deletion_forever(
    kmock: Any, server_url: str, empty_db_url: str
) -> None:
    """The database is dropped under a CronSchedule: deleting the object retries a bounded
    number of times, then lets it go with a Warning saying what to clean up."""
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": empty_db_url})
        await cluster.create(
            k8s.CRON_SCHEDULES,
            CRON,
            "orphan",
            cron_spec(),
        )
        await eventually(lambda: _ready(cluster, k8s.CRON_SCHEDULES, "orphan"), message="cron")
        dbname = conninfo_to_dict(empty_db_url)["dbname"]
        database.close_pools()
        with psycopg.connect(server_url, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(dbname)))
        await cluster.delete(k8s.CRON_SCHEDULES, "orphan")
        await eventually(
            lambda: _absent(cluster.get(k8s.CRON_SCHEDULES, "orphan")),
            timeout=60,
            message="object let go after bounded retries",
        )
        assert "RowNotRemoved" in cluster.event_reasons()
