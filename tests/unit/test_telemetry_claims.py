"""The producer's telemetry without a database: `job.claim` per job only while followed, its
delay from the job's own stamps, and `queue.add`/`queue.remove` once each."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shigoto import telemetry
from shigoto.job import Job, JobState
from shigoto.runtime.producer import Producer, claim_delay

DUE = datetime(2026, 1, 1, tzinfo=UTC)


def claimed(job_id: int, waited: float | None) -> Job:
    attempted = None if waited is None else DUE + timedelta(seconds=waited)
    return Job(id=job_id, queue="q", worker="w", args={}, state=JobState.EXECUTING, attempt=1,
               scheduled_at=DUE, attempted_at=attempted)  # fmt: skip


def producer(jobs: list[Job]) -> Producer:
    async def claim(_queue: str, _limit: int) -> list[Job]:
        return jobs

    async def execute(_job: Job) -> None:
        return None

    return Producer("q", 5, claim=claim, execute=execute, poll_interval=1.0, claim_batch=100,
                    node="n")  # fmt: skip


@pytest.fixture
def seen() -> Iterator[list[tuple[str, dict[str, Any], dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    handle = telemetry.attach(lambda e, m, md: events.append((e, m, md)),
                              ["job.claim", "queue.add", "queue.remove"])  # fmt: skip
    yield events
    telemetry.detach(handle)


def test_the_claim_delay_is_the_wait_past_the_due_time() -> None:
    assert claim_delay(claimed(1, 2.5)) == 2.5
    assert claim_delay(claimed(1, None)) is None
    # Claimed "before" it was due: the stamps are the database's, a snooze may move them.
    assert claim_delay(claimed(1, -1.0)) == 0.0


def test_each_claimed_job_is_announced_with_its_delay(seen: list[Any]) -> None:
    jobs = [claimed(1, 0.5), claimed(2, 3.0)]
    asyncio.run(producer(jobs)._claim_batch())
    assert [(e, m, md["job"].id, md["node"]) for e, m, md in seen] == [
        ("job.claim", {"delay": 0.5}, 1, "n"), ("job.claim", {"delay": 3.0}, 2, "n")]


def test_nothing_is_built_per_job_while_nobody_follows_job_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[int] = []
    monkeypatch.setattr(Producer, "_announce", lambda self, jobs: built.append(len(jobs)))
    handle = telemetry.attach(lambda *_: None, ["producer.claim"])  # another event is followed
    try:
        asyncio.run(producer([claimed(1, 0.5)])._claim_batch())
    finally:
        telemetry.detach(handle)
    assert built == []


async def test_a_queue_is_added_when_its_producer_starts_and_removed_once(
    seen: list[Any],
) -> None:
    p = producer([])
    p.start()
    p.start()
    p.stop_claiming()
    p.request_stop()
    await p.stop()
    assert [(e, m, md) for e, m, md in seen] == [
        ("queue.add", {"concurrency": 5}, {"queue": "q", "node": "n"}),
        ("queue.remove", {"running": 0}, {"queue": "q", "node": "n"}),
    ]


async def test_a_producer_never_started_announces_no_removal(seen: list[Any]) -> None:
    await producer([]).stop()
    assert seen == []
