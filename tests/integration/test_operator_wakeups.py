"""Scale from zero at once (`wakeups`), in-process against kmock and the real PostgreSQL.

A Queue at zero replicas polls every 120 s here; a job enqueued sends its NOTIFY, the operator
hears it on its LISTEN session and re-evaluates that Queue at once: the Deployment has a
replica within seconds, not at the next poll. Through a transaction pooler LISTEN takes the
direct URL (`database.directUrlSecretRef`), which the runner pods get too; with no direct URL
there is no session to listen on, and the poll is the fallback.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import shigoto
from shigoto_operator import k8s
from shigoto_operator.config import OperatorConfig
from shigoto_operator.databases import Database
from tests.integration.test_operator_kmock import QUEUE, fast_operator, queue_spec, replicas, runner
from tests.support.operator_harness import Cluster, eventually, running_operator

__all__ = ["fast_operator"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

POLL = 120


async def at_zero(cluster: Cluster, name: str) -> bool:
    ready = await cluster.condition(k8s.QUEUES, name, "Ready")
    return ready.get("reason") == "ScaledToZero"


async def test_a_new_job_wakes_a_queue_at_zero_long_before_its_poll(
    kmock: Any, db_url: str
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        cluster.add_secret("pg-direct", {"url": db_url})
        spec = queue_spec(
            database={
                "secretRef": {"name": "pg"},
                "pooler": "transaction",
                "directUrlSecretRef": {"name": "pg-direct"},
            },
            autoscaling={
                "minReplicas": 0,
                "maxReplicas": 5,
                "targetJobsPerReplica": 100,
                "scaleDownStabilizationSeconds": 1,
                "pollIntervalSeconds": POLL,
            },
        )
        await cluster.create(k8s.QUEUES, QUEUE, "sleepy", spec)
        await eventually(lambda: at_zero(cluster, "sleepy"), message="Ready, scaled to zero")
        dep = await cluster.deployment("sleepy")
        assert dep is not None and dep["spec"]["replicas"] == 0
        env = {e["name"]: e for e in runner(dep)["env"]}
        assert env["SHIGOTO_POOLER"]["value"] == "transaction"
        assert env["SHIGOTO_DIRECT_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "pg-direct",
            "key": "url",
        }

        enqueued = time.monotonic()
        shigoto.enqueue("shop.workers.send", {"n": 1}, queue="mail")

        async def woke() -> bool:
            return (await replicas(cluster, "sleepy") or 0) >= 1

        await eventually(woke, timeout=15, message="a replica within seconds of the enqueue")
        latency = time.monotonic() - enqueued
        print(f"enqueue to replicas >= 1: {latency:.2f} s (poll interval {POLL} s)")
        assert latency < 10
        assert "ScaledUp" in cluster.event_reasons()


def test_no_session_means_no_listen_and_the_poll_as_fallback(db_url: str) -> None:
    """Behind a transaction pooler without a direct URL nothing may LISTEN: a Queue at zero
    is watched (its other wake-ups still come) but no session is opened."""
    config = OperatorConfig()
    pooled = Database(db_url, "public", config, pooler="transaction")
    pooled.wakeups.watch("Queue/shop/a", lambda: None, queue="mail")
    assert pooled.wakeups.session_url is None and not pooled.wakeups.listening
    direct = Database(db_url, "public", config, pooler="transaction", direct_url=db_url)
    assert direct.wakeups.session_url == db_url
    plain = Database(db_url, "public", config)
    assert plain.wakeups.session_url == db_url  # no pooler: the main URL has sessions
    # the pool through the pooler prepares nothing (PgBouncer < 1.21 cannot carry them)
    assert pooled.pool.kwargs.get("prepare_threshold", 0) is None
    assert "prepare_threshold" not in plain.pool.kwargs


def test_notifications_wake_only_the_queues_at_zero_they_name(db_url: str) -> None:
    db = Database(db_url, "public", OperatorConfig(), pooler="transaction")
    woken: list[str] = []
    db.wakeups.watch("Queue/shop/a", lambda: woken.append("a"), queue="mail")
    db.wakeups.watch("Queue/shop/b", lambda: woken.append("b"), queue="post")
    db.wakeups.watch("CronSchedule/shop/c", lambda: woken.append("c"))
    db.wakeups.dispatch("shigoto_insert", "public.mail")
    db.wakeups.dispatch("shigoto_insert", "other.post")  # another schema's queue
    assert woken == ["a"]
    db.wakeups.dispatch("", "")  # the session (re)connected: every Queue at zero looks
    assert woken == ["a", "a", "b"]
    db.wakeups.wake_all()  # the database's own news: everyone
    assert sorted(woken[3:]) == ["a", "b", "c"]
