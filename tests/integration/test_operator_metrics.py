"""The real operator's /metrics: kopf in-process against kmock and the real PostgreSQL, scraped
over HTTP as Prometheus would.

After a reconcile the operator exports the Queue's counts, its desired and ready replicas, the
oldest available job's wait, the live runners and `database_up` 1; a Queue pointing at a
database that does not answer gets `database_up` 0, under a name without the URL's password;
a deleted Queue's series go. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import shigoto
from shigoto_operator import databases, k8s
from shigoto_operator.databases import describe
from tests.support.http_probe import aget
from tests.support.operator_harness import eventually, running_operator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def metrics_port(monkeypatch: pytest.MonkeyPatch) -> int:
    """Short intervals, and the metrics on a port of this test's own."""
    port = free_port()
    monkeypatch.setenv("SHIGOTO_OPERATOR_METRICS_PORT", str(port))
    monkeypatch.setenv("SHIGOTO_OPERATOR_METRICS_HOST", "127.0.0.1")
    monkeypatch.setenv("SHIGOTO_OPERATOR_METRICS_INTERVAL", "0.3")
    monkeypatch.setenv("SHIGOTO_OPERATOR_RETRY_INTERVAL", "0.5")
    monkeypatch.setenv("SHIGOTO_OPERATOR_LEADER_INTERVAL", "0.5")
    monkeypatch.setenv("SHIGOTO_OPERATOR_CRON_STATUS_INTERVAL", "0.5")
    return port


def queue_spec(secret: str = "pg", queue: str = "mail") -> dict[str, Any]:
    return {
        "queueName": queue,
        "concurrency": 5,
        "database": {"secretRef": {"name": secret}},
        "runner": {"image": "registry.example.com/shop-workers:1", "imports": ["shop.workers"]},
        "autoscaling": {
            "minReplicas": 0,
            "maxReplicas": 4,
            "targetJobsPerReplica": 10,
            "pollIntervalSeconds": 1,
        },
    }


async def scrape(port: int) -> tuple[str, Samples]:
    code, text = await aget(port, "/metrics")
    assert code == 200, text
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, found


def q(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


async def test_metrics_after_a_reconcile(kmock: Any, db_url: str, metrics_port: int) -> None:
    shigoto.enqueue_many(
        [{"worker": "shop.workers.send", "args": {"n": i}, "queue": "mail"} for i in range(25)]
    )
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, "Queue", "emails", queue_spec())
        mail = q(namespace="shop", queue="mail")

        async def reconciled() -> Samples | None:
            _, found = await scrape(metrics_port)
            wanted = ("shigoto_operator_queue_replicas", mail)
            return found if found.get(wanted) == 3 else None  # ceil(25 / 10)

        found = await eventually(reconciled, message="desired replicas 3 on /metrics")
        jobs = "shigoto_operator_queue_jobs"
        assert found[(jobs, q(namespace="shop", queue="mail", state="available"))] == 25
        assert found[(jobs, q(namespace="shop", queue="mail", state="completed"))] == 0
        assert found[("shigoto_operator_queue_ready_replicas", mail)] == 0  # kmock runs no pods
        assert found[("shigoto_operator_queue_paused", mail)] == 0
        assert found[("shigoto_operator_reconcile_passes_total", q(kind="Queue"))] >= 1
        assert found[("shigoto_operator_reconcile_errors_total", q(kind="Queue"))] == 0

        async def probed() -> Samples | None:
            _, found = await scrape(metrics_port)
            return found if ("shigoto_operator_queue_runners", mail) in found else None

        found = await eventually(probed, message="the database probe's series")
        database = q(database=describe(db_url), schema="public")
        assert found[("shigoto_operator_database_up", database)] == 1
        assert found[("shigoto_operator_queue_runners", mail)] == 0
        assert found[("shigoto_operator_queue_oldest_available_age_seconds", mail)] >= 0

        # deleting the Queue removes its series
        await cluster.delete(k8s.QUEUES, "emails")

        async def forgotten() -> bool:
            _, found = await scrape(metrics_port)
            return not any(name.startswith("shigoto_operator_queue") for name, _ in found)

        await eventually(forgotten, message="the deleted Queue's series gone")


async def test_an_unreachable_database_is_down_under_a_name_without_its_password(
    kmock: Any, db_url: str, metrics_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A probe of a database that refuses connections gives up after the pool's timeout (10 s):
    # shorter here, where what counts is that it gives up and how it is reported, not when.
    monkeypatch.setattr(databases, "QUERY_TIMEOUT", 2.0)
    nowhere = f"postgresql://shop:s3cret-pw@127.0.0.1:{free_port()}/nowhere"
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        cluster.add_secret("broken", {"url": nowhere})
        await cluster.create(k8s.QUEUES, "Queue", "emails", queue_spec())
        await cluster.create(k8s.QUEUES, "Queue", "lost", queue_spec("broken", "lost"))
        up = "shigoto_operator_database_up"
        good = (up, q(database=describe(db_url), schema="public"))
        bad = (up, q(database="127.0.0.1:" + nowhere.rsplit(":", 1)[1], schema="public"))
        assert bad[1] == q(database=describe(nowhere), schema="public")

        async def both_probed() -> tuple[str, Samples] | None:
            text, found = await scrape(metrics_port)
            return (text, found) if good in found and bad in found else None

        text, found = await eventually(both_probed, message="both databases probed")
        assert (found[good], found[bad]) == (1, 0)
        assert "s3cret" not in text and "postgresql://" not in text
        # an unreachable database's queue has no counts to export, only its replicas
        lost = q(namespace="shop", queue="lost")
        assert ("shigoto_operator_queue_oldest_available_age_seconds", lost) not in found
        assert not any(
            name == "shigoto_operator_queue_jobs" and dict(labels)["queue"] == "lost"
            for name, labels in found
        )
