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
async def blink(ms: int) -> int:
    await asyncio.sleep(ms / 1000)
    return ms


async def test_jobs_held_ahead_are_put_back_at_shutdown(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    # Short jobs first, so the runner claims ahead; then long ones, so that jobs claimed ahead
    # are still waiting for a slot when the shutdown's deadline comes.
    shigoto.enqueue_many([{"worker": WORKER, "args": {"ms": 3}}] * 300
                         + [{"worker": WORKER, "args": {"ms": 3000}}] * 300)  # fmt: skip
    starts: Counter[int] = Counter()
    handle = telemetry.attach(lambda _e, _m, meta: starts.update([meta["job"].id]), ["job.start"])
    try:
        # The deadline leaves a claim in flight time to return (its jobs are then held too),
        # and cuts the long performs short.
        async with running(db_url, {"default": 4}, shutdown_timeout=0.5) as runner:
            producer = runner.producers["default"]
            held = await until(
                lambda: [i for i in list(producer.running)
                         if producer.waiting(i) and producer.running[i][0].args["ms"] == 3000],
                message="long jobs held ahead of the slots")  # fmt: skip
            await runner.stop()
    finally:
        telemetry.detach(handle)
    rows = conn.execute(
        "SELECT state, attempt, count(*) FROM shigoto_jobs GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    counts = {(state, attempt): n for state, attempt, n in rows}
    assert set(counts) <= {("available", 0), ("completed", 1)}, counts
    assert sum(counts.values()) == 600
    assert counts.get(("completed", 1), 0) >= 300  # every short job ran
    back = conn.execute(
        "SELECT count(*) FROM shigoto_jobs WHERE id = ANY(%s) AND state = 'available'"
        " AND attempt = 0", (held,)).fetchone()  # fmt: skip
    assert back == (len(held),)  # the held ones went back untouched
    assert max(starts.values()) == 1  # no job performed twice
