"""Two operator replicas, one active (`peering`), in-process against kmock.

Both run as deploy/ runs them, with `SHIGOTO_OPERATOR_PEERING` set, so kopf's peering is
mandatory: the first to start ranks higher and acts; the second waits. When the first stops
(as a deleted pod does, on SIGTERM) it removes itself from the peering object, and the second
takes over within seconds: it reconciles from the cluster and the database alone, so the
replicas the first one set are kept, and a new backlog scales at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest

import shigoto
from shigoto_operator import k8s, peering
from shigoto_operator.config import OperatorConfig
from tests.integration.test_operator_kmock import QUEUE, fast_operator, queue_spec, replicas
from tests.support import operator_harness
from tests.support.operator_harness import Cluster, declare, eventually

__all__ = ["fast_operator"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PEERING = "shigoto-operator"
PEERINGS = f"{k8s.CLUSTER_PEERINGS.group}/{k8s.CLUSTER_PEERINGS.version}/clusterkopfpeerings"
#: What the issue asks of a handover after the active pod is deleted.
HANDOVER = 15.0


@pytest.fixture(autouse=True)
def peered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIGOTO_OPERATOR_PEERING", PEERING)


def declare_peering(kmock: Any) -> None:
    kmock.resources[PEERINGS] = {
        "kind": "ClusterKopfPeering",
        "singular": "clusterkopfpeering",
        "namespaced": False,
        "verbs": ["list", "watch", "get", "patch", "create"],
    }


class Replica:
    """One operator replica in a thread of its own, as in its own pod."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.failure: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name=f"operator-{identity}", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=kopf.get_default_registry(),
                    clusterwide=True,
                    identity=self.identity,  # type: ignore[arg-type]  # kopf's NewType
                    stop_flag=self.stop,
                    ready_flag=self.ready,
                )
            )
        except BaseException as exc:
            self.failure.append(exc)
            self.ready.set()

    async def start(self) -> None:
        self.thread.start()
        assert await asyncio.to_thread(self.ready.wait, 30), f"{self.identity} did not start"
        assert not self.failure, self.failure

    async def halt(self) -> None:
        """A clean stop, as SIGTERM on a deleted pod."""
        self.stop.set()
        await asyncio.to_thread(self.thread.join, 60)
        assert not self.thread.is_alive(), f"{self.identity} did not stop"
        assert not self.failure, self.failure


@contextlib.asynccontextmanager
async def cluster_for(kmock: Any) -> AsyncIterator[Cluster]:
    declare(kmock)
    declare_peering(kmock)
    url = str(kmock.url).rstrip("/")
    operator_harness._SERVER["url"] = url
    k8s.configure(url, verify_ssl=False)
    try:
        yield Cluster(kmock)
    finally:
        k8s.configure(None)
        operator_harness._SERVER.clear()


def peers(kmock: Any) -> dict[str, Any]:
    try:
        obj = kmock.objects[PEERINGS, None, PEERING]
    except KeyError:
        return {}
    return dict(obj.get("status") or {})


async def test_the_standby_takes_over_within_seconds_and_keeps_the_replicas(
    kmock: Any, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kopf._core.engines.peering")
    async with cluster_for(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        first, second = Replica("operator-a"), Replica("operator-b")
        await first.start()
        try:
            await eventually(lambda: _value("operator-a" in peers(kmock)), message="a peers")
            await cluster.create(k8s.QUEUES, QUEUE, "emails", queue_spec())
            await eventually(lambda: cluster.deployment("emails"), message="a acts")

            await second.start()
            await eventually(lambda: _value(len(peers(kmock)) == 2), message="both peer")
            entries = peers(kmock)
            assert entries["operator-a"]["priority"] > entries["operator-b"]["priority"]
            assert entries["operator-a"]["lifetime"] == OperatorConfig().peering_lifetime

            shigoto.enqueue_many(
                [{"worker": "shop.workers.send", "args": {"n": i}, "queue": "mail"}
                 for i in range(500)]
            )  # fmt: skip
            await eventually(lambda: _replicas(cluster, "emails", 5), message="a scales to 5")
            # b starts paused (peering is mandatory) and stays so: it has never resumed
            assert not _resumed(caplog, second), "the standby acted beside the leader"

            await first.halt()  # the active pod is deleted
            stopped = time.monotonic()
            assert "operator-a" not in peers(kmock), "a clean stop leaves the peering"
            shigoto.enqueue_many(
                [{"worker": "shop.workers.send", "args": {"n": i}, "queue": "mail"}
                 for i in range(300)]
            )  # fmt: skip
            await eventually(
                lambda: _replicas(cluster, "emails", 8), timeout=HANDOVER, message="b scales"
            )
            handover = time.monotonic() - stopped
            assert _resumed(caplog, second)
            print(f"handover: the standby scaled {handover:.1f} s after the leader stopped")
            assert handover < HANDOVER
            # the standby started from what the leader left: never below 5 on its way
            deployment = kmock.objects["apps/v1/deployments", "shop", "shigoto-runner-emails"]
            history = [(v or {}).get("spec", {}).get("replicas") for v in deployment.history]
            after = history[history.index(5) :]
            assert min(r for r in after if r is not None) >= 5, history
        finally:
            for replica in (first, second):
                if replica.thread.is_alive():
                    await replica.halt()


def test_earlier_replicas_rank_higher_and_ties_are_broken() -> None:
    assert peering.seniority(1000.0, 0) > peering.seniority(1000.5, 999)
    assert peering.seniority(1000.0, 1) != peering.seniority(1000.0, 2)
    assert abs(peering.seniority(7_000_000_000.0, 999)) < 2**53  # the year 2191


def test_peering_is_left_alone_without_its_name_or_when_standalone() -> None:
    settings = kopf.OperatorSettings()
    assert not peering.configure(settings, OperatorConfig())
    settings.peering.standalone = True
    assert not peering.configure(settings, OperatorConfig(peering="x"))
    settings = kopf.OperatorSettings()
    assert peering.configure(settings, OperatorConfig(peering="x"), clock=lambda: 5.0)
    assert (settings.peering.name, settings.peering.mandatory) == ("x", True)
    assert settings.peering.clusterwide and settings.peering.lifetime == 15


async def _value(value: bool) -> bool:
    return value


def _resumed(caplog: pytest.LogCaptureFixture, replica: Replica) -> bool:
    """kopf said `replica` resumed its operations (a replica that starts paused says nothing
    until it may act)."""
    return any(
        r.threadName == replica.thread.name and "Resuming operations" in r.getMessage()
        for r in caplog.records
    )


async def _replicas(cluster: Cluster, name: str, expected: int) -> bool:
    return await replicas(cluster, name) == expected
