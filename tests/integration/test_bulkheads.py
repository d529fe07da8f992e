"""Bulkheads: a worker's `concurrency=N` holds at most N of a runner's slots, and the other
workers of its queue keep running in the rest."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from tests.support import capacity_workers as w
from tests.support.in_process import QUICK, in_process_runners
from tests.support.waiting import until

WORKERS = "tests.support.capacity_workers"
DEADLINE = 30.0


@pytest.fixture
async def runners(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    w.reset()
    async with in_process_runners([WORKERS], QUICK, before_stop=lambda: w.gate.set()) as start:
        yield start


@pytest.fixture
def defers() -> Any:
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    handle = telemetry.attach(lambda _e, m, meta: seen.append((m, meta)), ["flow.defer"])
    yield seen
    telemetry.detach(handle)


def states(conn: psycopg.Connection, worker: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT state, count(*) FROM shigoto_jobs WHERE worker = %s GROUP BY state", (worker,)
    ).fetchall()
    return dict(rows)


async def test_a_slow_worker_holds_at_most_its_concurrency_and_the_others_keep_running(
    conn: psycopg.Connection, runners: Callable[..., Any], defers: list[Any]
) -> None:
    # The slow jobs come first in claim order: the first claim takes six of them, four over
    # the bulkhead, which must go back without consuming their attempt.
    slow = shigoto.enqueue_many([{"worker": w.gated, "args": {}}] * 10)
    fast = shigoto.enqueue_many([{"worker": w.quick, "args": {}}] * 30)
    runner = await runners({"bulk": 6})

    await until(lambda: len(w.quick_done) == len(fast), timeout=DEADLINE,
                message="every fast job done while the slow ones hold their slots")  # fmt: skip
    assert w.gated_running == 2 and w.gated_peak == 2
    assert states(conn, w.gated.name).get("available", 0) == len(slow) - 2
    assert any(meta["reason"] == "concurrency" and meta["key"] == w.gated.name
               and meta["node"] == runner.node for _, meta in defers), defers  # fmt: skip

    w.gate.set()
    await until(lambda: states(conn, w.gated.name) == {"completed": len(slow)},
                timeout=DEADLINE, message="every slow job done")  # fmt: skip
    assert w.gated_peak == 2, "never more than 2 slow jobs at once on the runner"
    attempts = conn.execute(
        "SELECT DISTINCT attempt FROM shigoto_jobs WHERE worker = %s", (w.gated.name,)
    ).fetchall()
    assert attempts == [(1,)], "a job handed back over the bulkhead keeps its attempt"
