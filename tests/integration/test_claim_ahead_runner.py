"""Claiming ahead in a real runner on a real database: short jobs are claimed while others
run, each job performs once, and a shutdown puts every held job back (those waiting for a slot
and those cut short) as available with its attempt given back, none left executing."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from tests.support.in_process import running
from tests.support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

WORKER = f"{__name__}.blink"


@shigoto.worker
async def blink(n: int) -> int:
    await asyncio.sleep(0.003)
    return n


async def test_jobs_held_ahead_are_put_back_at_shutdown(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    shigoto.enqueue_many([{"worker": WORKER, "args": {"n": n}} for n in range(2000)])
    starts: Counter[int] = Counter()
    handle = telemetry.attach(lambda _e, _m, meta: starts.update([meta["job"].id]), ["job.start"])
    try:
        async with running(db_url, {"default": 4}, shutdown_timeout=0.001) as runner:
            producer = runner.producers["default"]
            # Stop at a moment when jobs wait, claimed ahead, for a slot.
            await until(lambda: any(producer.waiting(i) for i in list(producer.running)),
                        message="jobs held ahead of the slots")  # fmt: skip
            await runner.stop()
    finally:
        telemetry.detach(handle)
    rows = conn.execute(
        "SELECT state, attempt, count(*) FROM shigoto_jobs GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    counts = {(state, attempt): n for state, attempt, n in rows}
    assert set(counts) <= {("available", 0), ("completed", 1)}, counts
    assert sum(counts.values()) == 2000
    assert counts.get(("completed", 1), 0) >= 1 and counts.get(("available", 0), 0) >= 1
    assert max(starts.values()) == 1  # no job performed twice
