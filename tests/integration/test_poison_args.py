"""One job's unreadable args never wedge the jobs claimed with it (issue 9).

A value nested deeper than Python's JSON decoder goes used to raise while the claim's rows were
decoded, after the claim had committed: every co-claimed job stayed executing.
"""

from __future__ import annotations

import asyncio
import os

import psycopg
import pytest

import shigoto
from shigoto.errors import ValidationError
from shigoto.jobspec import MAX_DEPTH
from tests.support.waiting import count, row, until

MODULE = __name__
DEADLINE = 30.0


@shigoto.worker(name="poison.args_ok")
def args_ok(n: int) -> int:
    return n


def nested(depth: int) -> str:
    """JSON text of objects nested `depth` levels deep."""
    return '{"a": ' * depth + "1" + "}" * depth


def insert_raw(conn: psycopg.Connection, args_json: str, meta_json: str = "{}") -> int:
    """A row written by hand, past every check of the client."""
    found = conn.execute(
        "INSERT INTO shigoto_jobs (worker, args, meta) VALUES (%s, %s::jsonb, %s::jsonb) "
        "RETURNING id",
        (args_ok.name, args_json, meta_json),
    ).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.parametrize("column", ["args", "meta"])
async def test_an_undecodable_row_is_discarded_alone(
    conn: psycopg.Connection, column: str
) -> None:
    goods = [shigoto.enqueue(args_ok, {"n": n}) for n in range(5)]
    poison = insert_raw(conn, nested(3000)) if column == "args" else insert_raw(
        conn, '{"n": 1}', nested(3000))  # fmt: skip
    runner = shigoto.Runner({"default": 10}, imports=[MODULE], poll_interval=0.2)
    task = asyncio.create_task(runner.run())  # started after the inserts: one claim takes all
    try:
        await until(lambda: count(conn, "state IN ('completed', 'discarded')") == 6,
                    timeout=DEADLINE, message="the good jobs ran, the poison one was discarded")
    finally:
        await runner.stop()
        await asyncio.wait_for(task, DEADLINE)
    assert [row(conn, j.id)["result"] for j in goods] == list(range(5))
    found = conn.execute(  # not args or meta: this process could not decode them either
        "SELECT state, attempt, errors FROM shigoto_jobs WHERE id = %s", (poison,)
    ).fetchone()
    assert found is not None
    state, attempt, errors = found
    assert (state, attempt) == ("discarded", 1)
    assert f"{column} not decodable" in errors[-1]["error"]


def test_enqueue_refuses_args_nested_too_deep(db_url: str) -> None:
    deep: dict = {}
    inner = deep
    for _ in range(MAX_DEPTH):
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(ValidationError, match="deeper than 64"):
        shigoto.enqueue(args_ok, deep)
    with pytest.raises(ValidationError, match="meta"):
        shigoto.enqueue(args_ok, {"n": 1}, meta={"m": deep})


def test_enqueue_accepts_args_at_the_depth_bound(conn: psycopg.Connection) -> None:
    value: dict = {"n": 1}
    inner: dict = {}
    value["deep"] = inner
    for _ in range(MAX_DEPTH - 2):
        inner["a"] = {}
        inner = inner["a"]
    job = shigoto.enqueue("poison.anything", value)
    assert row(conn, job.id)["args"]["n"] == 1


def test_the_table_refuses_oversized_json(conn: psycopg.Connection) -> None:
    big = '{"x": "' + os.urandom(20 * 1024 * 1024).hex() + '"}'  # 40 MiB, incompressible
    with pytest.raises(psycopg.errors.CheckViolation, match="args_size"):
        insert_raw(conn, big)
    with pytest.raises(psycopg.errors.CheckViolation, match="result_size"):
        conn.execute(
            "INSERT INTO shigoto_jobs (worker, result) VALUES ('w', %s::jsonb)", (big,)
        )
