"""The operator migrates in the background, once per target version (`migrations`).

A migration that takes long is never cut short by a timeout: while it runs, the Queue says
Ready=False, reason Migrating, with which migration and which step, and its passes go on. A
failure is reported (MigrationFailed, with the error, and an Event) and not tried again by
itself for that version; a spec change tries again. `migrations.amigrate` is replaced by a
stand-in the test holds or fails at will, around the real one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import shigoto
from shigoto.db.migrate import MigrationProgress, amigrate
from shigoto.errors import MigrationError
from shigoto_operator import k8s, migrations
from tests.integration.test_operator_kmock import QUEUE, _tables, fast_operator, queue_spec
from tests.support.operator_harness import Cluster, eventually, running_operator

__all__ = ["fast_operator"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class StandIn:
    """`amigrate` as the operator calls it: reports a step, waits at the gate, then fails or
    runs the real migration."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = threading.Event()
        self.fail: str | None = None

    async def __call__(
        self, url: str, *, schema: str, on_progress: Callable[[MigrationProgress], None]
    ) -> list[int]:
        self.calls += 1
        on_progress(MigrationProgress(1, "jobs", 1, 3, "creating shigoto_jobs"))
        while not self.gate.is_set():
            await asyncio.sleep(0.05)
        if self.fail is not None:
            raise MigrationError(self.fail)
        return await amigrate(url, schema=schema, on_progress=on_progress)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> StandIn:
    fake = StandIn()
    monkeypatch.setattr(migrations, "amigrate", fake)
    return fake


async def reason(cluster: Cluster, name: str, wanted: str) -> dict[str, Any] | None:
    cond = await cluster.condition(k8s.QUEUES, name, "Ready")
    return cond if cond.get("reason") == wanted else None


async def at_step(cluster: Cluster, name: str) -> dict[str, Any] | None:
    cond = await reason(cluster, name, "Migrating")
    return cond if cond and "step" in cond["message"] else None


async def passes(cluster: Cluster, name: str, at_least: int) -> bool:
    """At least this many passes of the Queue (each reads its Deployment by name)."""
    path = f"/deployments/shigoto-runner-{name}"
    reads = [r for r in list(cluster.kmock) if r.method == "GET" and r.url.path.endswith(path)]
    return len(reads) >= at_least


async def test_a_long_migration_runs_in_the_background_and_reports_its_step(
    kmock: Any, empty_db_url: str, stand_in: StandIn
) -> None:
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": empty_db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "fresh", queue_spec())
        cond = await eventually(lambda: at_step(cluster, "fresh"), message="Migrating, a step")
        assert cond["status"] == "False"
        assert "migration 1 of" in cond["message"]
        assert "0001_jobs: step 2 of 3 (creating shigoto_jobs)" in cond["message"]
        reachable = await cluster.condition(k8s.QUEUES, "fresh", "DatabaseReachable")
        assert reachable["status"] == "True"
        status = await cluster.status(k8s.QUEUES, "fresh")
        assert status["pendingMigrations"][0] == 1
        # the passes go on while it runs (poll 1 s), and nothing starts it again
        await eventually(lambda: passes(cluster, "fresh", 4), message="passes while migrating")
        assert stand_in.calls == 1
        reasons = cluster.event_reasons()
        assert reasons.count("MigrationStarted") == 1
        assert "Migrating" not in reasons, "progress is a condition, not a Warning per step"

        stand_in.gate.set()
        ready = await eventually(lambda: reason(cluster, "fresh", "ScaledToZero"), message="Ready")
        assert ready["status"] == "True"
        assert _tables(empty_db_url)
        assert (await cluster.status(k8s.QUEUES, "fresh"))["pendingMigrations"] == []
        assert "Migrated" in cluster.event_reasons()
        assert stand_in.calls == 1


async def test_a_failed_migration_is_not_retried_until_the_spec_changes(
    kmock: Any, empty_db_url: str, stand_in: StandIn
) -> None:
    stand_in.fail = "step 0001/1 failed: permission denied for schema public"
    stand_in.gate.set()
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": empty_db_url})
        await cluster.create(k8s.QUEUES, QUEUE, "broken", queue_spec())
        cond = await eventually(
            lambda: reason(cluster, "broken", "MigrationFailed"), message="MigrationFailed"
        )
        assert "permission denied for schema public" in cond["message"]
        assert (
            "not tried again for this version until this object's spec changes" in (cond["message"])
        )
        await eventually(lambda: passes(cluster, "broken", 6), message="passes after it failed")
        assert stand_in.calls == 1, "a failed migration is not looped"
        assert cluster.event_reasons().count("MigrationFailed") == 1

        # a spec change is a new attempt: it runs again, and this time it works
        stand_in.fail = None
        await cluster.patch_spec(k8s.QUEUES, "broken", {"concurrency": 5})
        await eventually(lambda: reason(cluster, "broken", "ScaledToZero"), message="Ready")
        assert stand_in.calls == 2
        assert _tables(empty_db_url)


async def test_behind_a_transaction_pooler_without_a_session_url_nothing_is_tried(
    kmock: Any, empty_db_url: str, stand_in: StandIn
) -> None:
    """Migrations need a session (a session lock, index builds outside transactions): with
    `pooler: transaction` and neither a direct nor a migration URL the Queue says which field
    to set, and no migration starts."""
    stand_in.gate.set()
    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": empty_db_url})
        spec = queue_spec(database={"secretRef": {"name": "pg"}, "pooler": "transaction"})
        await cluster.create(k8s.QUEUES, QUEUE, "pooled", spec)
        cond = await eventually(
            lambda: reason(cluster, "pooled", "MigrationFailed"), message="MigrationFailed"
        )
        assert "spec.database.directUrlSecretRef" in cond["message"]
        assert stand_in.calls == 0
        assert not _tables(empty_db_url)

        # Migrated by someone else (a job with a direct URL): nothing to run, no session needed.
        shigoto.migrate(empty_db_url)
        ready = await eventually(lambda: reason(cluster, "pooled", "ScaledToZero"), message="Ready")
        assert ready["status"] == "True"
        assert stand_in.calls == 0


def test_the_events_of_a_run_are_posted_once_by_each_object_that_saw_it() -> None:
    running = migrations.MigrationState("running", 1, 25, (24, 25))
    done = migrations.MigrationState("done", 1, 25, (24, 25), applied=(24, 25))
    posted, seen = migrations.event(running, None, "db")
    assert posted is not None and posted[1] == "MigrationStarted" and seen == (1, "running")
    assert migrations.event(running, seen, "db") == (None, seen)
    posted, seen = migrations.event(done, seen, "db")
    assert posted == ("Normal", "Migrated", "db: applied migrations 24-25")
    # an object that only arrives after the run posts nothing about it
    assert migrations.event(done, None, "db")[0] is None
    assert migrations.describe_versions([5, 1, 2, 3, 7, 8]) == "1-3, 5, 7-8"
