"""The completion write's plan (issue 14's slow outliers): a batch of outcomes must cost one
primary-key probe per outcome, whatever the table's statistics say. With statistics that say
the table is empty (after a TRUNCATE, or a bulk load autovacuum has not analysed yet), the
old statement's prepared plan walked every job this node was executing and rescanned the
whole batch for each one: 2,000-outcome writes took seconds. Asserted from EXPLAIN ANALYZE's
row counts, never its timings."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from shigoto.db import runtime_statements as statements
from tests.support.plans import rows_compared_in_joins, rows_read_from

NODE = "node-1"


def executing_jobs(conn: psycopg.Connection[Any], count: int) -> list[int]:
    rows = conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, state, attempt, attempted_by, attempted_at)"
        " SELECT 'q', 'w', 'executing', 1, %s, now() FROM generate_series(1, %s)"
        " RETURNING id",
        (NODE, count),
    ).fetchall()
    return sorted(r[0] for r in rows)


def finished_jobs(conn: psycopg.Connection[Any], count: int) -> None:
    conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, state, finished_at)"
        " SELECT 'q', 'w', 'completed', now() FROM generate_series(1, %s)",
        (count,),
    )


def prepared_generic(conn: psycopg.Connection[Any], name: str, query: str) -> str:
    """PREPARE `query` under `name`, planned once for any parameters (as a prepared
    statement's plan is once PostgreSQL stops re-planning it), and return the EXECUTE text,
    keeping each parameter's cast."""
    names: list[str] = []
    casts: dict[str, str] = {}

    def number(match: re.Match[str]) -> str:
        key, cast = match.group(1), match.group(2) or ""
        if key not in names:
            names.append(key)
            casts[key] = cast
        return f"${names.index(key) + 1}{cast}"

    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE {name} AS " + re.sub(r"%\((\w+)\)s(::[\w\[\]]+)?", number, query))
    return f"EXECUTE {name}(" + ", ".join(f"%({k})s{casts[k]}" for k in names) + ")"


def outcomes(ids: list[int]) -> dict[str, Any]:
    n = len(ids)
    return {
        "ids": ids, "attempts": [1] * n, "states": ["completed"] * n, "delays": [None] * n,
        "results": [None] * n, "errors": [None] * n, "snoozes": [False] * n,
        "progresses": [None] * n, "node": NODE,
    }  # fmt: skip


def test_a_completion_batch_probes_only_its_own_jobs_when_the_statistics_say_empty(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("ALTER TABLE shigoto_jobs SET (autovacuum_enabled = off)")
    conn.execute("ANALYZE shigoto_jobs")  # empty now, and the statistics will keep saying so
    ids = executing_jobs(conn, 300)
    finished_jobs(conn, 20_000)  # a table too big to read whole for a batch of 40
    batch = ids[:40]
    execute = prepared_generic(conn, "complete_batch", statements.statements("public").complete)

    # Client-side binding: EXPLAIN passes no parameter types on to the EXECUTE inside it.
    explain = psycopg.ClientCursor(conn).execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + execute, outcomes(batch)
    )
    row = explain.fetchone()

    assert row is not None
    plan = row[0][0]["Plan"]
    assert rows_read_from(plan) == len(batch)  # not the 300 this node is executing
    assert rows_compared_in_joins(plan) == 0  # the batch is not rescanned per executing job
    completed = conn.execute(
        "SELECT array_agg(id ORDER BY id) FROM shigoto_jobs"
        " WHERE state = 'completed' AND attempted_by = %s",
        (NODE,),
    ).fetchone()
    assert completed is not None and completed[0] == batch


def test_the_completion_guard_still_skips_jobs_another_node_or_attempt_owns(
    conn: psycopg.Connection[Any],
) -> None:
    """The guard moved into one expression; it must still leave alone a job rescued and
    re-claimed elsewhere, a later attempt, and a job no longer executing."""
    ids = executing_jobs(conn, 4)
    conn.execute("UPDATE shigoto_jobs SET attempted_by = 'node-2' WHERE id = %s", (ids[0],))
    conn.execute("UPDATE shigoto_jobs SET attempt = 2 WHERE id = %s", (ids[1],))
    conn.execute("UPDATE shigoto_jobs SET state = 'cancelled' WHERE id = %s", (ids[2],))

    written = conn.execute(statements.statements("public").complete, outcomes(ids)).fetchall()

    assert [r[0] for r in written] == [ids[3]]
    states = dict(conn.execute("SELECT id, state FROM shigoto_jobs").fetchall())
    assert [states[i] for i in ids] == ["executing", "executing", "cancelled", "completed"]
