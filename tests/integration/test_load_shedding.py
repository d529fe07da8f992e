"""Load shedding: a runner whose claimed jobs wait to start stops claiming the low priorities,
keeps claiming the high ones, and every job still completes once the load is gone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from shigoto.job import Job
from shigoto.runtime.producer import Producer
from tests.support import capacity_workers as w
from tests.support.in_process import QUICK, in_process_runners
from tests.support.waiting import until

WORKERS = "tests.support.capacity_workers"
DEADLINE = 60.0
TARGET = 0.04
LOW, HIGH = 0, 10


@pytest.fixture
async def runners(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    w.reset()
    async with in_process_runners([WORKERS], QUICK) as start:
        yield start


@pytest.fixture
def changes() -> Any:
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    handle = telemetry.attach(lambda _e, m, meta: seen.append((m, meta)), ["shed.change"])
    yield seen
    telemetry.detach(handle)


def record_claims(runner: shigoto.Runner) -> list[tuple[int | None, list[int]]]:
    """Each claim from now on: the floor it was made with, and the priorities it returned."""
    claims: list[tuple[int | None, list[int]]] = []
    claim = runner.claimer.claim

    async def recording(producer: Producer | None, queue: str, limit: int) -> list[Job]:
        floor = producer.min_priority if producer is not None else None
        jobs = await claim(producer, queue, limit)
        claims.append((floor, [job.priority for job in jobs]))
        return jobs

    runner.claimer.claim = recording  # type: ignore[method-assign]
    return claims


async def feed_high_priority() -> None:
    """A trickle of urgent jobs for as long as the test needs them."""
    while True:
        await shigoto.aenqueue(w.quick, {}, queue="shed", priority=HIGH)
        await asyncio.sleep(0.05)


def unfinished(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM shigoto_jobs WHERE state <> 'completed'").fetchone()
    assert row is not None
    return int(row[0])


class SlowClock:
    """A monotonic clock on which each reading is half a second after the last: every claimed
    job seems to wait long to start, as on a runner that cannot keep up. A real overload (loop
    hogs) proved too sensitive to what else the machine and the test process were doing."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


async def test_an_overloaded_runner_sheds_low_priorities_first_and_loses_no_job(
    conn: psycopg.Connection, runners: Callable[..., Any], changes: list[Any]
) -> None:
    shigoto.enqueue_many([{"worker": w.quick, "args": {}, "queue": "shed", "priority": HIGH}] * 4)
    shigoto.enqueue_many(
        [{"worker": w.quick, "args": {}, "queue": "shed", "priority": LOW}] * 72
    )  # fmt: skip
    runner = await runners({"shed": 8}, shed_target=TARGET, shed_interval=0.3)
    assert runner.shedding is not None
    claims = record_claims(runner)
    runner.shedding.monotonic = SlowClock()  # overloaded from now on
    feeder = asyncio.create_task(feed_high_priority())
    try:
        await until(lambda: any(floor == HIGH and HIGH in got for floor, got in claims),
                    timeout=DEADLINE, message="urgent jobs claimed while shedding")  # fmt: skip
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
    runner.shedding.monotonic = time.monotonic  # the load is gone
    shed = [(floor, got) for floor, got in claims if floor == HIGH]
    assert all(LOW not in got for _, got in shed), "a shedding runner claimed a low priority"

    started = [(m, meta) for m, meta in changes if meta["shedding"]]
    assert started, "shed.change announced the shedding"
    measurements, metadata = started[0]
    assert metadata == {"queue": "shed", "node": runner.node, "shedding": True,
                        "min_priority": HIGH}  # fmt: skip
    assert measurements["latency"] >= TARGET == measurements["target"]

    # With the load gone every job completes, the low ones included, and the runner claims
    # every priority again.
    await until(lambda: unfinished(conn) == 0, timeout=DEADLINE, message="every job completed")
    await until(lambda: runner.producers["shed"].min_priority is None, timeout=DEADLINE,
                message="shedding over")  # fmt: skip
    assert changes[-1][1]["shedding"] is False and changes[-1][1]["min_priority"] is None
    attempts = conn.execute("SELECT DISTINCT attempt FROM shigoto_jobs").fetchall()
    assert attempts == [(1,)], "shed jobs were never claimed, so never charged an attempt"


async def test_a_runner_that_keeps_up_never_sheds(
    conn: psycopg.Connection, runners: Callable[..., Any], changes: list[Any]
) -> None:
    jobs = [{"worker": w.quick, "args": {}, "queue": "shed", "priority": p} for p in (0, 5, 10)]
    shigoto.enqueue_many(jobs * 30)
    runner = await runners({"shed": 8}, shed_target=TARGET, shed_interval=0.3)
    await until(lambda: unfinished(conn) == 0, timeout=DEADLINE, message="every job completed")
    assert runner.producers["shed"].min_priority is None
    assert changes == []


@pytest.mark.parametrize(("option", "value"), [("shed_target", 0), ("shed_interval", -1.0)])
def test_bad_shedding_settings_name_the_option(option: str, value: float) -> None:
    with pytest.raises(shigoto.ConfigurationError, match=f"{option} must be a positive number"):
        shigoto.Runner({"default": 1}, database_url="postgresql://unused", **{option: value})
