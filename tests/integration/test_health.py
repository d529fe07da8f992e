"""The health server of a real runner: /healthz, /readyz and /metrics over real HTTP.

Every runner here talks to a private PostgreSQL database; every request goes over 127.0.0.1 to
a server bound to port 0. Waits poll a condition under a generous deadline; nothing asserts how
long something took.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import shigoto
from shigoto.db.migrate import latest_version
from shigoto.ops.probes import HealthServer, probe_database
from tests.support.http_probe import aget, http_get
from tests.support.in_process import start, stop
from tests.support.waiting import until

QUEUE = "default"
DEADLINE = 30.0


@shigoto.worker
def succeed(n: int) -> int:
    return n


@shigoto.worker(max_attempts=1)
def explode() -> None:
    raise RuntimeError("boom")


@shigoto.worker
def nap() -> shigoto.Snooze:
    return shigoto.Snooze(3600)


@shigoto.worker
def give_up() -> shigoto.Cancel:
    return shigoto.Cancel("not needed any more")


# -- helpers ------------------------------------------------------------------------------


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name{labels}` in a Prometheus exposition, None if absent."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def make_runner(db_url: str) -> shigoto.Runner:
    return shigoto.Runner({QUEUE: 5}, database_url=db_url, poll_interval=0.2, stage_interval=0.1)


def make_server(runner: shigoto.Runner, **kwargs: Any) -> HealthServer:
    options = {"probe_interval": 0.2, "depth_interval": 0.2, **kwargs}
    return HealthServer(runner, port=0, host="127.0.0.1", **options)


@pytest.fixture
async def served(db_url: str) -> AsyncIterator[tuple[shigoto.Runner, HealthServer]]:
    """A running runner with its health server."""
    runner = make_runner(db_url)
    server = make_server(runner)
    await server.start()
    try:
        task = await start(runner)
        try:
            yield runner, server
        finally:
            await stop(runner, task)
    finally:
        await server.stop()


def job_states(conn: psycopg.Connection, ids: list[int]) -> dict[int, str]:
    rows = conn.execute("SELECT id, state FROM shigoto_jobs WHERE id = ANY(%s)", (ids,))
    return dict(rows.fetchall())


# -- /healthz -----------------------------------------------------------------------------


async def test_healthz_answers_ok_and_binds_a_free_port(served) -> None:
    _, server = served
    assert server.port > 0
    code, body = await aget(server.port, "/healthz")
    assert code == 200
    assert body["status"] == "ok"
    code, body = await aget(server.port, "/nowhere")
    assert code == 404


async def test_healthz_reports_a_blocked_event_loop(db_url: str) -> None:
    runner = make_runner(db_url)
    server = make_server(runner, stall_after=0.5, tick_interval=0.05)
    await server.start()
    try:
        await until(lambda: aget(server.port, "/healthz"), timeout=DEADLINE, message="first answer")
        # Block the loop on purpose: the ticker cannot run, the HTTP thread still answers.
        time.sleep(1.0)
        code, _, body = http_get(f"http://127.0.0.1:{server.port}/healthz")
        assert code == 503
        assert json.loads(body)["status"] == "stalled"

        async def healthy_again() -> bool:
            return (await aget(server.port, "/healthz"))[0] == 200

        await until(healthy_again, timeout=DEADLINE,
                    message="/healthz back to 200 once the loop runs")  # fmt: skip
    finally:
        await server.stop()


# -- /readyz ------------------------------------------------------------------------------


async def test_readyz_follows_the_runner_lifecycle(db_url: str) -> None:
    runner = make_runner(db_url)
    server = make_server(runner)
    await server.start()
    try:
        code, body = await aget(server.port, "/readyz")
        assert code == 503, body  # not started yet
        task = await start(runner)
        try:

            async def ready() -> Any:
                code, body = await aget(server.port, "/readyz")
                return body if code == 200 else None

            body = await until(ready, timeout=DEADLINE, message="/readyz 200 after runner.ready")
            assert body["status"] == "ready"
        finally:
            await stop(runner, task)
        code, body = await aget(server.port, "/readyz")
        assert code == 503, body  # stopped
    finally:
        await server.stop()


async def test_readyz_is_503_with_a_reason_when_the_schema_falls_behind(
    served, conn: psycopg.Connection
) -> None:
    _, server = served

    async def ready() -> bool:
        return (await aget(server.port, "/readyz"))[0] == 200

    await until(ready, timeout=DEADLINE, message="/readyz 200 on the current schema")
    conn.execute("DELETE FROM shigoto_schema_migrations WHERE version = %s", (latest_version(),))

    async def behind() -> Any:
        code, body = await aget(server.port, "/readyz")
        return body if code == 503 else None

    body = await until(behind, timeout=DEADLINE,
                       message="/readyz 503 once the latest migration is missing")  # fmt: skip
    assert "shigoto migrate" in body["reason"]
    assert f"needs {latest_version()}" in body["reason"]


async def test_probe_database_compares_the_schema_with_the_latest_migration(
    db_url: str, empty_db_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
        current = await probe_database(aconn, "public")
        assert current.ready, current.reason
        await aconn.execute(
            "DELETE FROM shigoto_schema_migrations WHERE version = %s", (latest_version(),)
        )
        behind = await probe_database(aconn, "public")
        assert not behind.ready
        assert "shigoto migrate" in behind.reason
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as aconn:
        never = await probe_database(aconn, "public")
        assert not never.ready
        assert "at migration 0" in never.reason


# -- /metrics -----------------------------------------------------------------------------


async def test_metrics_count_outcomes_and_queue_depth(served, conn: psycopg.Connection) -> None:
    _, server = served
    labels = {"queue": QUEUE}

    async def metrics() -> str:
        code, text = await aget(server.port, "/metrics")
        assert code == 200
        return text

    def counted(name: str, worker: Any, value: float) -> Callable[[], Awaitable[Any]]:
        async def probe() -> bool:
            found = sample(await metrics(), name, worker=worker.name, **labels)
            return found is not None and found >= value

        return probe

    ids = [(await shigoto.aenqueue(succeed, {"n": i})).id for i in range(3)]
    ids += [(await shigoto.aenqueue(explode)).id for _ in range(2)]
    await until(counted("shigoto_jobs_completed_total", succeed, 3), timeout=DEADLINE,
                message="3 done")  # fmt: skip
    await until(counted("shigoto_jobs_failed_total", explode, 2), timeout=DEADLINE,
                message="2 failed")  # fmt: skip

    ids += [(await shigoto.aenqueue(succeed, {"n": 9})).id]
    ids += [(await shigoto.aenqueue(w)).id for w in (explode, nap, give_up)]
    await until(counted("shigoto_jobs_completed_total", succeed, 4), timeout=DEADLINE,
                message="4 done")  # fmt: skip
    await until(counted("shigoto_jobs_failed_total", explode, 3), timeout=DEADLINE,
                message="3 failed")  # fmt: skip
    await until(counted("shigoto_jobs_snoozed_total", nap, 1), timeout=DEADLINE,
                message="1 snoozed")  # fmt: skip
    await until(counted("shigoto_jobs_cancelled_total", give_up, 1), timeout=DEADLINE,
                message="cancel")  # fmt: skip

    def settled() -> bool:
        return "executing" not in job_states(conn, ids).values()

    await until(lambda: asyncio.to_thread(settled), timeout=DEADLINE,
                message="every job acknowledged")  # fmt: skip

    async def depth_settled() -> bool:
        text = await metrics()
        # Live states only: finished jobs are history, not depth (and never counted here).
        want = {"scheduled": 1, "available": 0, "executing": 0, "retryable": 0}
        return all(
            sample(text, "shigoto_queue_depth", state=state, **labels) == count
            for state, count in want.items()
        )

    await until(depth_settled, timeout=DEADLINE, message="queue depth gauge matching the table")
    assert sample(await metrics(), "shigoto_queue_depth", state="completed", **labels) is None

    text = await metrics()
    assert sample(text, "shigoto_jobs_completed_total", worker=succeed.name, **labels) == 4
    assert sample(text, "shigoto_jobs_failed_total", worker=explode.name, **labels) == 3
    assert sample(text, "shigoto_jobs_discarded_total", worker=explode.name, **labels) == 3
    # Each attempt is timed once, though a last failure emits both exception and discard.
    count = "shigoto_job_duration_seconds_count"
    assert sample(text, count, worker=succeed.name, **labels) == 4
    assert sample(text, count, worker=explode.name, **labels) == 3
