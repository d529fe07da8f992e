"""Circuit breakers held in PostgreSQL: one breaker for every runner of a worker."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from tests.support import flow_workers
from tests.support.in_process import running
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import until, wait_until

WORKERS = "tests.support.flow_workers"
FLAKY = f"{WORKERS}.flaky"
CLASSIFIED = f"{WORKERS}.classified"


def scalar(conn: psycopg.Connection, query: str, *params: object) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def breaker_status(conn: psycopg.Connection, worker: str) -> str | None:
    return scalar(conn, "SELECT status FROM shigoto_breakers WHERE key = %s", f"worker:{worker}")


def jobs_in(conn: psycopg.Connection, worker: str, state: str) -> int:
    return int(scalar(conn, "SELECT count(*) FROM shigoto_jobs WHERE worker = %s AND state = %s",
                      worker, state))  # fmt: skip


def test_a_breaker_opens_waits_half_opens_and_closes_across_two_runners(
    conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    conn.execute(flow_workers.FLAG_TABLE)
    conn.execute("INSERT INTO flow_flags VALUES ('down')")
    procs = [runner_processes(workers=WORKERS, queue="flow=5") for _ in range(2)]
    try:
        shigoto.enqueue_many([{"worker": FLAKY, "queue": "flow"}] * 3)
        wait_until(lambda: breaker_status(conn, FLAKY) == "open", timeout=30)
        # The breaker's row is written as the third failure is counted; the outcomes follow
        # with the completer's next flush.
        wait_until(lambda: jobs_in(conn, FLAKY, "discarded") == 3, timeout=30)
        # While open, new jobs are left where they are by every runner's claim.
        shigoto.enqueue_many([{"worker": FLAKY, "queue": "flow"}] * 5)
        shigoto.enqueue_many([{"worker": f"{WORKERS}.unlimited", "queue": "flow"}] * 5)
        wait_until(lambda: jobs_in(conn, f"{WORKERS}.unlimited", "completed") == 5, timeout=30)
        # After open_for one probe runs; the dependency is still down: it fails and reopens.
        wait_until(lambda: jobs_in(conn, FLAKY, "discarded") == 4, timeout=30)
        wait_until(lambda: breaker_status(conn, FLAKY) == "open", timeout=30)
        # A claim the other runner made as the breaker reopened holds its job `executing`
        # until the breaker's admission hands it back (attempt given back): wait for that.
        wait_until(lambda: jobs_in(conn, FLAKY, "available") == 4, timeout=30)
        conn.execute("DELETE FROM flow_flags")
        # The next probe succeeds, then a second (close_after=2): closed, and the rest runs.
        wait_until(lambda: jobs_in(conn, FLAKY, "completed") == 4, timeout=30)
        assert breaker_status(conn, FLAKY) == "closed"
    finally:
        for p in procs:
            p.signal(signal.SIGTERM)
        for p in procs:
            assert p.wait_exit(30) == 0, p.output()
    # Waiting in place never used an attempt: every completed job ran once.
    assert scalar(conn, "SELECT max(attempt) FROM shigoto_jobs WHERE worker = %s", FLAKY) == 1
    assert jobs_in(conn, FLAKY, "discarded") == 4


@pytest.fixture
def transitions() -> Iterator[list[tuple[dict[str, Any], dict[str, Any]]]]:
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    handle = telemetry.attach(lambda _e, m, md: seen.append((m, md)), ["breaker.transition"])
    yield seen
    telemetry.detach(handle)
    flow_workers.RAISE.clear()


async def test_only_classified_errors_count_and_transitions_are_emitted(
    db_url: str, conn: psycopg.Connection, transitions: list[Any]
) -> None:
    async with running(db_url, {"flow": 2}) as runner:
        flow_workers.RAISE[:] = [flow_workers.NotOurFault("bad input")]
        shigoto.enqueue_many([{"worker": CLASSIFIED, "queue": "flow"}] * 4)
        await until(lambda: jobs_in(conn, CLASSIFIED, "discarded") == 4)
        assert breaker_status(conn, CLASSIFIED) in (None, "closed")
        assert transitions == []

        flow_workers.RAISE[:] = [ConnectionError("refused")]
        shigoto.enqueue_many([{"worker": CLASSIFIED, "queue": "flow"}] * 2)
        await until(lambda: breaker_status(conn, CLASSIFIED) == "open")
        flow_workers.RAISE.clear()
        job = shigoto.enqueue(CLASSIFIED, queue="flow")
        await until(lambda: scalar(conn, "SELECT state FROM shigoto_jobs WHERE id = %s",
                                   job.id) == "completed")  # fmt: skip
        await until(lambda: len(transitions) == 3)
        assert scalar(conn, "SELECT attempt FROM shigoto_jobs WHERE id = %s", job.id) == 1
    moves = [(md["from"], md["to"]) for _, md in transitions]
    assert moves == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert transitions[0][0] == {"calls": 2, "failures": 2}
    for _, md in transitions:
        assert md["key"] == f"worker:{CLASSIFIED}"
        assert md["worker"] == CLASSIFIED
        assert md["partition"] is None
        assert md["node"] == runner.node
    assert breaker_status(conn, CLASSIFIED) == "closed"
