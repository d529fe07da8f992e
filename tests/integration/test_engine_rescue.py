"""The rescuer calls `on_discard` of the jobs it discards, exactly once, and forgets dead nodes
even when they left no job behind."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from shigoto.runtime.rescuer import DISCARD_CHANNEL
from tests.support import engine_workers as w
from tests.support.in_process import RESCUE_FAST, in_process_runners
from tests.support.waiting import row, until

WORKERS = "tests.support.engine_workers"
DEADLINE = 30.0


@pytest.fixture
async def runners(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    w.reset()
    async with in_process_runners([WORKERS], RESCUE_FAST) as start:
        yield start


def ghost_job(conn: psycopg.Connection, n: int, node: str = "ghost-node") -> int:
    """A job left executing, on its last attempt, by a node that is gone."""
    found = conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, args, state, attempt, max_attempts, "
        "attempted_at, attempted_by) VALUES ('unserved', %s, %s, 'executing', 1, 1, "
        "now() - interval '1 hour', %s) RETURNING id",
        (w.with_on_discard.name, psycopg.types.json.Jsonb({"n": n}), node),
    ).fetchone()
    assert found is not None
    return int(found[0])


async def test_jobs_discarded_by_the_rescuer_get_on_discard_exactly_once(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    # Two runners: the leader rescues, both could resolve the worker; one call per job only.
    first = await runners({"default": 1})
    await until(lambda: first.elector.is_leader, timeout=DEADLINE, message="leader")
    await runners({"default": 1})
    ids = [ghost_job(conn, n) for n in range(3)]
    await until(lambda: len(w.discards) == 3, timeout=DEADLINE,
                message="on_discard called for every rescued job")  # fmt: skip
    assert sorted(n for n, _ in w.discards) == [0, 1, 2]
    for _, errors in w.discards:
        assert "rescued from node ghost-node" in errors[-1]["error"]
    for job_id in ids:
        job = row(conn, job_id)
        assert job["state"] == "discarded"
        assert "on_discard_pending" not in job["meta"]
    # A pending mark is what makes a call: with none left, a repeated announcement calls nothing.
    for job_id in ids:
        conn.execute("SELECT pg_notify(%s, %s)", (DISCARD_CHANNEL, f"public.{job_id}"))
    witness = ghost_job(conn, 99)
    await until(lambda: len(w.discards) == 4, timeout=DEADLINE, message="a later rescue")
    assert [n for n, _ in w.discards].count(99) == 1 and len(w.discards) == 4
    assert row(conn, witness)["state"] == "discarded"


async def test_a_pending_on_discard_is_taken_by_a_runner_that_has_the_worker(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    # What a leader that cannot resolve the worker leaves behind: the mark and a notification.
    await runners({"default": 1})
    found = conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, args, state, attempt, max_attempts, errors, "
        "meta, finished_at) VALUES ('unserved', %s, '{\"n\": 7}', 'discarded', 1, 1, "
        '\'[{"attempt": 1, "error": "rescued from node far-away"}]\', '
        "'{\"on_discard_pending\": true}', now()) RETURNING id",
        (w.with_on_discard.name,),
    ).fetchone()
    assert found is not None
    conn.execute("SELECT pg_notify(%s, %s)", (DISCARD_CHANNEL, f"public.{found[0]}"))
    await until(lambda: w.discards, timeout=DEADLINE, message="on_discard called")
    [(n, errors)] = w.discards
    assert n == 7 and errors[-1]["error"] == "rescued from node far-away"
    assert row(conn, found[0])["meta"] == {}


async def test_the_leader_forgets_nodes_silent_past_the_rescue_threshold(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    leader = await runners({"default": 1})
    await until(lambda: leader.elector.is_leader, timeout=DEADLINE, message="leader")
    # A runner SIGKILLed while idle: its row stays, no job of it needs rescue.
    conn.execute(
        "INSERT INTO shigoto_nodes (id, hostname, pid, last_seen_at) "
        "VALUES ('killed-idle', 'gone-host', 1, now() - interval '10 minutes')"
    )
    await until(
        lambda: conn.execute("SELECT count(*) FROM shigoto_nodes WHERE id = 'killed-idle'")
        .fetchone() == (0,),
        timeout=DEADLINE, message="the dead node is forgotten",
    )  # fmt: skip
    nodes = {r[0] for r in conn.execute("SELECT id FROM shigoto_nodes").fetchall()}
    assert leader.node in nodes, "a live node stays"
