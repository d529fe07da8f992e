"""What dependency resolution costs per finished parent (docs/benchmarks.md, "Workflows").

    .venv/bin/python -m tests.support.workflow_bench [--parents 5000] [--rounds 3]

On the server of SHIGOTO_DATABASE_URL, else the embedded one, in a database of its own
(`shigoto_bench_workflows`, dropped at the end). Each round finishes `--parents` executing jobs
with the completer's own statement, in batches of 100 as a busy completer does, three ways:
jobs nobody waits for (the baseline: the trigger's WHEN clause keeps them from calling the
function), jobs that each release one waiting child, and pairs of jobs whose child waits for
both (a join: the second parent's check sees the first). The cost of resolution is the time
over the baseline divided by the parents finished. It also times 1,000 single enqueues, plain
and with a live parent. A measurement for people; no test asserts it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import psycopg

import shigoto
from shigoto.cli.bench import drop_database, prepare_database
from shigoto.db import database, embedded
from shigoto.db import runtime_statements as statements

NAME = "shigoto_bench_workflows"
BATCH = 100


def _executing(conn: psycopg.Connection[Any], count: int) -> list[int]:
    rows = conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, args, state, attempt, attempted_by, "
        "attempted_at) SELECT 'bench', 'bench.parent', '{}', 'executing', 1, 'bench', now() "
        "FROM generate_series(1, %s) RETURNING id", (count,),
    ).fetchall()  # fmt: skip
    return [r[0] for r in rows]


def _children(conn: psycopg.Connection[Any], parent_sets: list[list[int]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO shigoto_jobs (queue, worker, args, depends_on, on_parent_failure) "
            "VALUES ('bench', 'bench.child', '{}', %s, 'cancel')",
            [(ps,) for ps in parent_sets],
        )


def _finish_all(conn: psycopg.Connection[Any], ids: list[int]) -> float:
    """Seconds to acknowledge `ids` as completed with the completer's statement."""
    complete = statements.statements("public").complete
    started = time.perf_counter()
    for i in range(0, len(ids), BATCH):
        batch = ids[i:i + BATCH]
        n = len(batch)
        with conn.transaction():
            conn.execute(complete, {
                "ids": batch, "attempts": [1] * n, "states": ["completed"] * n,
                "delays": [None] * n, "results": ['{"ok": true}'] * n, "errors": [None] * n,
                "snoozes": [False] * n, "progresses": [None] * n, "node": "bench",
            })  # fmt: skip
    return time.perf_counter() - started


def _round(conn: psycopg.Connection[Any], parents: int) -> dict[str, float]:
    out = {}
    for kind in ("plain", "one_child", "join_of_two"):
        conn.execute("TRUNCATE shigoto_jobs")
        ids = _executing(conn, parents)
        if kind == "one_child":
            _children(conn, [[p] for p in ids])
        elif kind == "join_of_two":
            _children(conn, [ids[i:i + 2] for i in range(0, len(ids), 2)])
        conn.execute("ANALYZE shigoto_jobs")
        out[kind] = _finish_all(conn, ids)
        waiting = conn.execute(
            "SELECT count(*) FROM shigoto_jobs WHERE worker = 'bench.child' "
            "AND state <> 'available'").fetchone()  # fmt: skip
        assert waiting == (0,), f"{kind}: children left waiting: {waiting}"
    return out


def _enqueue_cost(url: str, calls: int) -> dict[str, float]:
    """Mean ms of one `shigoto.enqueue` (own transaction), plain and with a live parent."""

    out = {}
    parent = shigoto.enqueue("bench.parent", {}, queue="bench", database_url=url)
    for kind, options in (("plain", {}), ("with_parent", {"depends_on": [parent.id]})):
        started = time.perf_counter()
        for _ in range(calls):
            shigoto.enqueue("bench.child", {}, queue="bench", database_url=url, **options)
        out[kind] = 1000 * (time.perf_counter() - started) / calls
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parents", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    server = os.environ.get("SHIGOTO_DATABASE_URL") or embedded.start()
    url = prepare_database(server, "public", NAME)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            rounds = [_round(conn, opts.parents) for _ in range(opts.rounds)]
            conn.execute("TRUNCATE shigoto_jobs")
        enqueue = _enqueue_cost(url, 1000)
        database.close_pools()
    finally:
        drop_database(server, NAME)
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    per = {k: 1000 * v / opts.parents for k, v in median.items()}
    report = {
        "parents": opts.parents, "batch": BATCH, "rounds": rounds,
        "enqueue_ms": enqueue, "load_average": os.getloadavg(),
        "ms_per_parent": per,
        "resolution_ms_per_parent": {
            "one_child": per["one_child"] - per["plain"],
            "join_of_two": per["join_of_two"] - per["plain"],
        },
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
