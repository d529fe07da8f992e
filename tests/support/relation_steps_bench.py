"""What migration 0024's dispatchers cost next to 0023's per-relation triggers
(docs/benchmarks.md, "Relation steps in one order").

    .venv/bin/python -m tests.support.relation_steps_bench [--rounds 9]

On the server of SHIGOTO_DATABASE_URL, else the embedded one, in two databases of its own:
`shigoto_bench_steps_0023` (the repository's migrations up to 0023) and
`shigoto_bench_steps_0024` (all of them), both dropped at the end. Each round, in both (which
goes first alternates), for each kind of transition: executing rows are written, a CHECKPOINT
evens out full-page writes, and the completer's own statement acknowledges them all, 500 per
statement. Measured per job: the server's execution time of those statements (EXPLAIN ANALYZE,
TIMING OFF), the WAL they wrote (pg_current_wal_lsn around them, so on a quiet server only),
and, in a second pass with timing on, the time spent inside AFTER row triggers. Then inserts
(plain, into a batch, as the child of a live parent): the time inside their row triggers.
Medians of the rounds. A measurement for people; no test asserts it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import shigoto
from shigoto.cli.bench import drop_database, prepare_database
from shigoto.db import embedded
from shigoto.db import migration_files as migrate_module
from shigoto.db import runtime_statements as statements

BEFORE, AFTER = "shigoto_bench_steps_0023", "shigoto_bench_steps_0024"
BATCH = 500
ERROR = Jsonb({"attempt": 1, "error": "RuntimeError: bench", "traceback": ""})

#: kind -> (jobs, final state, queue, in a sealed batch)
TRANSITIONS: dict[str, tuple[int, str, str, bool]] = {
    "completed, plain": (20000, "completed", "plain", False),
    "discarded, queue without forward": (5000, "discarded", "plain", False),
    "discarded and forwarded": (5000, "discarded", "pay", False),
    "completed, in a batch": (5000, "completed", "plain", True),
}
#: kind -> (rows, INSERT ... SELECT, {batch} and {parent} filled in)
INSERTS: dict[str, tuple[int, str]] = {
    "plain": (10000, "INSERT INTO shigoto_jobs (worker, args) "
                     "SELECT 'bench.job', jsonb_build_object('n', g) "
                     "FROM generate_series(1, 10000) g"),
    "into a batch": (10000, "INSERT INTO shigoto_jobs (worker, args, batch_id) "
                            "SELECT 'bench.job', jsonb_build_object('n', g), {batch} "
                            "FROM generate_series(1, 10000) g"),
    "child of a live parent": (2000, "INSERT INTO shigoto_jobs (worker, args, depends_on) "
                                     "SELECT 'bench.job', jsonb_build_object('n', g), "
                                     "ARRAY[{parent}::bigint] FROM generate_series(1, 2000) g"),
}  # fmt: skip


def _up_to_0023(server: str) -> str:
    """BEFORE, migrated by migrate itself, from a copy of migrations/ that stops at 0023."""
    with tempfile.TemporaryDirectory() as tmp:
        for path in migrate_module.migrations_dir().glob("*.sql"):
            if int(path.name[:4]) <= 23:
                shutil.copy(path, Path(tmp) / path.name)
        real = migrate_module.migrations_dir
        migrate_module.migrations_dir = lambda: Path(tmp)
        try:
            return prepare_database(server, "public", BEFORE)
        finally:
            migrate_module.migrations_dir = real


def _fill(conn: psycopg.Connection[Any], jobs: int, queue: str, in_batch: bool) -> list[int]:
    conn.execute("TRUNCATE shigoto_jobs, shigoto_batches")
    batch = None
    with conn.transaction():
        if in_batch:
            found = conn.execute(
                "INSERT INTO shigoto_batches (callbacks) VALUES (%s) RETURNING id",
                (Jsonb([{"when": "finished", "worker": "bench.done", "queue": "plain",
                         "args": {}}]),),
            ).fetchone()  # fmt: skip
            assert found is not None
            batch = found[0]
        ids = [r[0] for r in conn.execute(
            "INSERT INTO shigoto_jobs (queue, worker, args, state, attempt, max_attempts, "
            "attempted_by, attempted_at, batch_id) SELECT %s, 'bench.job', '{\"n\": 1}', "
            "'executing', 1, 1, 'bench', now(), %s FROM generate_series(1, %s) RETURNING id",
            (queue, batch, jobs),
        ).fetchall()]  # fmt: skip
        if batch is not None:
            conn.execute("SELECT shigoto_batch_seal(%s)", (batch,))
    conn.execute("VACUUM ANALYZE shigoto_jobs")
    conn.execute("CHECKPOINT")
    return ids


def _params(ids: list[int], state: str) -> dict[str, Any]:
    n, failed = len(ids), state != "completed"
    return {"ids": ids, "attempts": [1] * n, "states": [state] * n, "delays": [None] * n,
            "results": [None if failed else Jsonb({"ok": True})] * n,
            "errors": [ERROR if failed else None] * n, "snoozes": [False] * n,
            "progresses": [None] * n, "node": "bench"}  # fmt: skip


def _plans(conn: psycopg.Connection[Any], ids: list[int], state: str, timing: bool) -> list[Any]:
    explain = f"EXPLAIN (ANALYZE, TIMING {'ON' if timing else 'OFF'}, FORMAT JSON) "
    complete = statements.statements("public").complete
    plans = []
    for i in range(0, len(ids), BATCH):
        found = conn.execute(explain + complete, _params(ids[i : i + BATCH], state)).fetchone()
        assert found is not None
        plans.append(found[0][0])
    return plans


def _trigger_ms(plans: list[Any]) -> float:
    return sum(t["Time"] for p in plans for t in p.get("Triggers", [])
               if "encrypted" not in t["Trigger Name"])  # fmt: skip


def _transition(url: str, jobs: int, state: str, queue: str, in_batch: bool) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        ids = _fill(conn, jobs, queue, in_batch)
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        plans = _plans(conn, ids, state, timing=False)
        wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", lsn).fetchone()
        assert wal is not None
        finished = conn.execute("SELECT count(*) FROM shigoto_jobs WHERE id = ANY(%s) "
                                "AND state = %s", (ids, state)).fetchone()  # fmt: skip
        assert finished == (jobs,), finished
        triggers = _trigger_ms(_plans(conn, _fill(conn, jobs, queue, in_batch), state, True))
    return {"server_us": 1000 * sum(p["Execution Time"] for p in plans) / jobs,
            "trigger_us": 1000 * triggers / jobs, "wal_bytes": float(wal[0]) / jobs}  # fmt: skip


def _insert(url: str, rows: int, statement: str) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE shigoto_jobs, shigoto_batches")
        batch = conn.execute("INSERT INTO shigoto_batches DEFAULT VALUES RETURNING id").fetchone()
        parent = conn.execute("INSERT INTO shigoto_jobs (worker) VALUES ('bench.parent') "
                              "RETURNING id").fetchone()  # fmt: skip
        assert batch is not None and parent is not None
        query = statement.format(batch=batch[0], parent=parent[0])
        with conn.transaction():
            found = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query).fetchone()
        assert found is not None
        plan = found[0][0]
    return {"server_us": 1000 * plan["Execution Time"] / rows,
            "trigger_us": 1000 * _trigger_ms([plan]) / rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    opts = parser.parse_args()
    server = os.environ.get("SHIGOTO_DATABASE_URL") or embedded.start()
    urls = {"0023": _up_to_0023(server), "0024": prepare_database(server, "public", AFTER)}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    try:
        for url in urls.values():
            shigoto.set_queue("pay", forward={"discarded": "pay-dead"}, database_url=url)
        for r in range(opts.rounds):
            order = sorted(urls, reverse=bool(r % 2))
            for kind, spec in TRANSITIONS.items():
                for version in order:
                    runs.setdefault(kind, {}).setdefault(version, []).append(
                        _transition(urls[version], *spec)
                    )
            for kind, (rows, statement) in INSERTS.items():
                for version in order:
                    runs.setdefault(f"insert, {kind}", {}).setdefault(version, []).append(
                        _insert(urls[version], rows, statement)
                    )
    finally:
        drop_database(server, BEFORE)
        drop_database(server, AFTER)
    medians = {kind: {version: {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]}
                      for version, rs in by.items()}
               for kind, by in runs.items()}  # fmt: skip
    print(json.dumps({"rounds": opts.rounds, "batch": BATCH, "medians_per_job": medians,
                      "runs": runs}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
