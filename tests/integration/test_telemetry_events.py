"""Telemetry from a real runner: every documented event arrives with its measurements and
metadata, and a subscriber that raises is logged without breaking job processing.

The runner works against a private PostgreSQL database; waits poll a condition under a
generous deadline, and no assertion is about how long something took.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from shigoto.job import Job
from tests.support.in_process import start, stop
from tests.support.telemetry_recorder import Recorder
from tests.support.waiting import until

QUEUE = "default"
DEADLINE = 30.0


@shigoto.worker
def fine(n: int) -> dict[str, int]:
    return {"n": n}


@shigoto.worker(max_attempts=1)
def broken() -> None:
    raise ValueError("broken on purpose")


@shigoto.worker
def thrown_away() -> None:
    raise shigoto.Discard("not worth it")


@shigoto.worker
def later() -> shigoto.Snooze:
    return shigoto.Snooze(3600)


@shigoto.worker
def called_off() -> None:
    raise shigoto.Cancel("called off")


@shigoto.worker(max_attempts=1, timeout=0.2)
async def too_slow() -> None:
    await asyncio.sleep(30)


def make_runner(db_url: str, **overrides: Any) -> shigoto.Runner:
    return shigoto.Runner(
        {QUEUE: 5}, database_url=db_url, poll_interval=0.2, stage_interval=0.1, **overrides
    )


@pytest.fixture
def attached() -> Iterator[Callable[..., int]]:
    """`attach` for the test; every handler is detached afterwards, even on failure."""
    handles: list[int] = []

    def attach(handler: telemetry.Handler, events: Any = None) -> int:
        handles.append(telemetry.attach(handler, events))
        return handles[-1]

    yield attach
    for handle in handles:
        telemetry.detach(handle)


def state_of(conn: psycopg.Connection, job_id: int) -> str | None:
    row = conn.execute("SELECT state FROM shigoto_jobs WHERE id = %s", (job_id,)).fetchone()
    return row[0] if row else None


def archived(conn: psycopg.Connection, job_id: int) -> bool:
    query = "SELECT 1 FROM shigoto_jobs_archive WHERE id = %s"
    return conn.execute(query, (job_id,)).fetchone() is not None


async def test_subscribers_receive_every_documented_event(
    db_url: str, conn: psycopg.Connection, attached
) -> None:
    # Pruning every 0.2 s with prune_after=0 archives finished jobs at once: pruner.prune
    # then reports real work, not just zeros.
    runner = make_runner(db_url, prune_interval=0.2, prune_after=0.0)
    recorder = Recorder(runner.node)
    attached(recorder)
    task = await start(runner)
    try:
        ok = await shigoto.aenqueue(fine, {"n": 7})
        await shigoto.aenqueue(broken)
        await shigoto.aenqueue(thrown_away)
        await shigoto.aenqueue(later)
        await shigoto.aenqueue(called_off)
        await shigoto.aenqueue(too_slow)
        await shigoto.aenqueue(fine, {"n": 8}, schedule_in=0.3)
        await until(lambda: len(recorder.for_worker("job.stop", fine)) == 2, timeout=DEADLINE,
                    message="2 stops")  # fmt: skip
        await until(lambda: recorder.named("job.cancel"), timeout=DEADLINE, message="job.cancel")
        await until(lambda: recorder.named("job.snooze"), timeout=DEADLINE, message="job.snooze")
        await until(lambda: len(recorder.named("job.discard")) == 3, timeout=DEADLINE,
                    message="3 discards")  # fmt: skip
        await until(lambda: archived(conn, ok.id), timeout=DEADLINE,
                    message="the completed job archived")  # fmt: skip
        await until(
            lambda: any(m["archived"] >= 1 for m, _ in recorder.named("pruner.prune")),
            timeout=DEADLINE, message="pruner.prune reporting the archived job",
        )
    finally:
        await stop(runner, task)

    starts = recorder.named("job.start")
    assert len(starts) == 7
    for measurements, metadata in starts:
        assert isinstance(measurements["system_time"], float)
        assert isinstance(metadata["job"], Job)
        assert metadata["job"].queue == QUEUE

    stops = recorder.for_worker("job.stop", fine)
    assert sorted(md["result"]["n"] for _, md in stops) == [7, 8]
    for measurements, _ in stops:
        assert measurements["duration"] >= 0
        assert measurements["queue_time"] is None or measurements["queue_time"] >= 0

    [(failed_m, failed_md)] = recorder.for_worker("job.exception", broken)
    assert failed_md["kind"] == "failure"
    assert isinstance(failed_md["error"], ValueError)
    assert failed_m["duration"] >= 0
    [(_, slow_md)] = recorder.for_worker("job.exception", too_slow)
    assert slow_md["kind"] == "timeout"

    discards = {md["job"].worker: md for _, md in recorder.named("job.discard")}
    assert set(discards) == {broken.name, thrown_away.name, too_slow.name}
    assert isinstance(discards[thrown_away.name]["error"], shigoto.Discard)

    [(snooze_m, _)] = recorder.for_worker("job.snooze", later)
    assert snooze_m["snooze"] == 3600
    [(_, cancel_md)] = recorder.for_worker("job.cancel", called_off)
    assert cancel_md["reason"] == "called off"

    claims = recorder.named("producer.claim")
    assert sum(m["count"] for m, _ in claims) == 7
    assert all(md["queue"] == QUEUE and m["count"] <= m["requested"] for m, md in claims)

    stages = recorder.named("stager.stage")
    assert sum(m["count"] for m, _ in stages) >= 1
    assert all(QUEUE in md["queues"] for _, md in stages)

    prunes = recorder.named("pruner.prune")
    assert all({"duration", "archived", "deleted"} <= set(m) for m, _ in prunes)


async def test_a_failing_subscriber_is_logged_and_the_job_still_completes(
    db_url: str, conn: psycopg.Connection, attached, caplog: pytest.LogCaptureFixture
) -> None:
    def faulty(event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        raise RuntimeError(f"subscriber broke on {event}")

    runner = make_runner(db_url)
    recorder = Recorder(runner.node)
    attached(faulty)
    attached(recorder, ["job.stop"])  # attached after the faulty one: still called
    caplog.set_level(logging.ERROR, logger="shigoto.telemetry")
    task = await start(runner)
    try:
        job = await shigoto.aenqueue(fine, {"n": 1})
        await until(lambda: state_of(conn, job.id) == "completed", timeout=DEADLINE,
                    message="job completed")  # fmt: skip
    finally:
        await stop(runner, task)
    assert [md["job"].id for _, md in recorder.named("job.stop")] == [job.id]
    failures = [r for r in caplog.records if r.name == "shigoto.telemetry"]
    assert any("job.start" in r.getMessage() for r in failures)
    assert any("job.stop" in r.getMessage() for r in failures)
    assert all(r.exc_info is not None for r in failures)
