"""What a fair claim costs next to a plain one (docs/benchmarks.md, "Fair queues").

    .venv/bin/python -m tests.support.fair_bench [--backlog 10000] [--claims 200] [--rounds 3]

On the server of SHIGOTO_DATABASE_URL, else the embedded one, in a database of its own
(`shigoto_bench_fair`, dropped at the end). Two queues hold the same jobs: `--backlog` in one
partition and five small partitions of 10; one is claimed with the plain claim, the other
with the fair claim (without and with a partition cap). Each claim asks for 10 jobs in a
transaction that is rolled back, so every claim sees the same backlog. Then the same with
1,000 partitions of 10 jobs (the fair claim walks every key), and the cost the fair claim's
index adds to a bulk enqueue (COPY of `--backlog` jobs, with and without the index), and the
rows the fair claim's plan reads. A measurement for people; no test asserts it.
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
from shigoto.db import database, embedded, fair_statements
from shigoto.db import runtime_statements as statements
from shigoto.runtime.fair_claim import FAIR_WINDOW as WINDOW
from shigoto.runtime.liveness import GRACE, RESTART_GRACE

NAME = "shigoto_bench_fair"
NODE = "bench"
LIMIT = 10
SMALL = {f"small-{i}": 10 for i in range(5)}


def _fill(url: str, queue: str, counts: dict[str | None, int]) -> float:
    """Seconds to enqueue the jobs (one enqueue_many: a binary COPY)."""
    jobs = [{"worker": "bench.job", "queue": queue, "partition_key": key}
            for key, n in counts.items() for _ in range(n)]  # fmt: skip
    started = time.perf_counter()
    shigoto.enqueue_many(jobs, database_url=url)
    return time.perf_counter() - started


def _params(queue: str, cap: int | None) -> dict[str, Any]:
    return {"queue": queue, "limit": LIMIT, "node": NODE, "cap": cap,
            "grace": GRACE, "restart_grace": RESTART_GRACE, "window": WINDOW,
            "after": ""}  # fmt: skip


def _claim_ms(conn: psycopg.Connection[Any], statement: str, params: dict[str, Any],
              claims: int) -> float:  # fmt: skip
    """Median milliseconds of one claim of LIMIT jobs, each rolled back."""
    times = []
    for _ in range(claims):
        with conn.transaction(force_rollback=True):
            started = time.perf_counter()
            got = conn.execute(statement, params).fetchall()
            times.append(time.perf_counter() - started)
        assert len(got) == LIMIT, (params["queue"], len(got))
    return 1000 * statistics.median(times)


def _plan_rows(conn: psycopg.Connection[Any], statement: str, params: dict[str, Any]) -> dict:
    """Rows and buffers the fair claim's plan reads (EXPLAIN ANALYZE, rolled back)."""
    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement,
                            params).fetchone()[0][0]  # type: ignore[index]  # fmt: skip
    return {"execution_ms": plan["Execution Time"],
            "scanned_rows": _scanned(plan["Plan"]),
            "shared_buffers_hit": plan["Plan"].get("Shared Hit Blocks")}  # fmt: skip


def _scanned(node: dict[str, Any]) -> float:
    own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
    scans = own if "Scan" in node.get("Node Type", "") else 0
    return scans + sum(_scanned(child) for child in node.get("Plans", []))


def _round(url: str, backlog: int, claims: int) -> dict[str, Any]:
    stmts = statements.statements("public")
    fair = statements.claim("public", fair_statements.PICK, (), fair_statements.RETURNING_EXTRA)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE shigoto_jobs")
        conn.execute("INSERT INTO shigoto_nodes (id, hostname, pid) VALUES (%s, 'bench', 1) "
                     "ON CONFLICT (id) DO UPDATE SET last_seen_at = now()", (NODE,))  # fmt: skip
        copy_with_index = _fill(url, "plain", {"big": backlog, **SMALL})
        _fill(url, "fair", {"big": backlog, **SMALL})
        _fill(url, "wide", {f"t{i}": 10 for i in range(1000)})
        conn.execute("ANALYZE shigoto_jobs")
        out: dict[str, Any] = {
            "plain_claim_ms": _claim_ms(conn, stmts.claim, _params("plain", None), claims),
            "fair_claim_ms": _claim_ms(conn, fair, _params("fair", None), claims),
            "fair_capped_claim_ms": _claim_ms(conn, fair, _params("fair", 5), claims),
            "fair_claim_1000_partitions_ms":
                _claim_ms(conn, fair, _params("wide", None), max(claims // 10, 5)),
            "fair_plan": _plan_rows(conn, fair, _params("fair", None)),
            "copy_with_fair_index_s": copy_with_index,
        }  # fmt: skip
        conn.execute("TRUNCATE shigoto_jobs")
        conn.execute("DROP INDEX shigoto_jobs_fair_walk_idx")
        out["copy_without_fair_index_s"] = _fill(url, "plain", {"big": backlog, **SMALL})
        conn.execute("CREATE INDEX shigoto_jobs_fair_walk_idx ON shigoto_jobs (queue, "
                     "(coalesce(partition_key, '')), priority DESC, scheduled_at, id) "
                     "WHERE (state = 'available') IS TRUE")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    server = os.environ.get("SHIGOTO_DATABASE_URL") or embedded.start()
    url = prepare_database(server, "public", NAME)
    try:
        rounds = [_round(url, opts.backlog, opts.claims) for _ in range(opts.rounds)]
    finally:
        database.close_pools()
        drop_database(server, NAME)
    numbers = [k for k, v in rounds[0].items() if isinstance(v, float)]
    report = {
        "backlog": opts.backlog, "small_partitions": len(SMALL), "claim_limit": LIMIT,
        "claims_per_round": opts.claims, "rounds": rounds,
        "median": {k: statistics.median(r[k] for r in rounds) for k in numbers},
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
