"""What dead-letter forwarding costs per finished job (docs/benchmarks.md, "Forwarding").

    .venv/bin/python -m tests.support.forward_bench [--jobs 5000] [--rounds 3]

On the server of SHIGOTO_DATABASE_URL, else the embedded one, in a database of its own
(`shigoto_bench_forwarding`, dropped at the end). Each round acknowledges `--jobs` executing
jobs with the completer's own statement, in batches of 100 as a busy completer does, four ways:
completed (the baseline: the trigger's WHEN clause keeps them from calling the function),
discarded in a queue without a forward setting (the function runs, finds nothing), discarded in
a queue that forwards discards (the function inserts a copy and NOTIFYs), and, for the bulk
path, the same jobs cancelled in one `cancel_by`-style UPDATE with forwarding on. A
measurement for people; no test asserts it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from shigoto.cli.bench import drop_database, prepare_database
from shigoto.db import embedded
from shigoto.db import runtime_statements as statements

NAME = "shigoto_bench_forwarding"
BATCH = 100
ERROR = Jsonb({"attempt": 1, "error": "RuntimeError: bench", "traceback": ""})


def _executing(conn: psycopg.Connection[Any], queue: str, count: int) -> list[int]:
    rows = conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, args, state, attempt, max_attempts, "
        "attempted_by, attempted_at) SELECT %s, 'bench.job', '{\"n\": 1}', 'executing', 1, 1, "
        "'bench', now() FROM generate_series(1, %s) RETURNING id", (queue, count),
    ).fetchall()  # fmt: skip
    return [r[0] for r in rows]


def _finish_all(conn: psycopg.Connection[Any], ids: list[int], state: str) -> float:
    """Seconds to acknowledge `ids` in `state` with the completer's statement."""
    complete = statements.statements("public").complete
    failed = state != "completed"
    started = time.perf_counter()
    for i in range(0, len(ids), BATCH):
        batch = ids[i:i + BATCH]
        n = len(batch)
        with conn.transaction():
            conn.execute(complete, {
                "ids": batch, "attempts": [1] * n, "states": [state] * n,
                "delays": [None] * n, "results": [None if failed else Jsonb({"ok": True})] * n,
                "errors": [ERROR if failed else None] * n, "snoozes": [False] * n,
                "progresses": [None] * n, "node": "bench",
            })  # fmt: skip
    return time.perf_counter() - started


def _cancel_all(conn: psycopg.Connection[Any], queue: str) -> float:
    started = time.perf_counter()
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'cancelled', finished_at = now() "
        "WHERE queue = %s AND state = 'executing'", (queue,),
    )  # fmt: skip
    return time.perf_counter() - started


def _round(conn: psycopg.Connection[Any], jobs: int) -> dict[str, float]:
    out = {}
    for kind, queue, state in (
        ("completed", "plain", "completed"),
        ("discarded_unset", "plain", "discarded"),
        ("discarded_forwarded", "pay", "discarded"),
        ("cancelled_bulk_unset", "plain", "cancelled"),
        ("cancelled_bulk_forwarded", "pay", "cancelled"),
    ):
        conn.execute("TRUNCATE shigoto_jobs")
        ids = _executing(conn, queue, jobs)
        conn.execute("ANALYZE shigoto_jobs")
        if kind.startswith("cancelled_bulk"):
            out[kind] = _cancel_all(conn, queue)
        else:
            out[kind] = _finish_all(conn, ids, state)
        copies = conn.execute(
            "SELECT count(*) FROM shigoto_jobs WHERE meta ? 'forwarded_from'"
        ).fetchone()
        assert copies == ((jobs,) if kind.endswith("forwarded") else (0,)), (kind, copies)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    server = os.environ.get("SHIGOTO_DATABASE_URL") or embedded.start()
    url = prepare_database(server, "public", NAME)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO shigoto_queues (name, forward) VALUES "
                "('pay', '{\"discarded\": \"pay-dead\", \"cancelled\": \"pay-dead\"}')"
            )
            rounds = [_round(conn, opts.jobs) for _ in range(opts.rounds)]
    finally:
        drop_database(server, NAME)
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    per = {k: 1000 * v / opts.jobs for k, v in median.items()}
    report = {
        "jobs": opts.jobs, "batch": BATCH, "rounds": rounds,
        "ms_per_job": per,
        "forwarding_ms_per_job": {
            "discarded_unset_over_completed": per["discarded_unset"] - per["completed"],
            "discarded_forwarded_over_unset": per["discarded_forwarded"] - per["discarded_unset"],
            "cancelled_bulk_forwarded_over_unset":
                per["cancelled_bulk_forwarded"] - per["cancelled_bulk_unset"],
        },
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
