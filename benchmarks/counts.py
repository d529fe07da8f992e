"""Counts that must not grow with the table (issue 14 point 4): `shigoto status`'s queries and
the operator's per-database count, timed on a table of millions of finished jobs.

    python benchmarks/counts.py populate --database-url URL [--finished 10000000]
                                          [--pending 100000]
    python benchmarks/counts.py measure  --database-url URL [--repeat 10] [--explain]
    python benchmarks/counts.py processing --database-url URL [--jobs 20000]
                                          [--concurrency 50] [--repeat 3]

`populate` migrates the database and fills `shigoto_jobs` with `--finished` finished rows
(completed, discarded and cancelled across three queues, finishing times spread over the
last 14 days, as the pruner's default retention leaves them) and `--pending` available jobs,
in chunks of one INSERT ... SELECT each, then VACUUM ANALYZE (as autovacuum would have by
then). It refuses a database that already holds jobs unless `--append` is given.

`measure` times, `--repeat` times each, the whole `shigoto.status()` (every statement it
runs), the live-state counts alone, and the operator's counting query for the three queues
(`shigoto_operator.dbcounts.fetch`), and prints the medians; `--explain` adds an
EXPLAIN (ANALYZE, BUFFERS) summary (plan nodes, rows, buffers, time) of each counting
statement.

`processing` runs no-op jobs through one in-process Runner (the same phase as
`shigoto bench`), alternating a fresh database without finished rows and the populated one,
and prints jobs/s of each: it takes the populated database's URL and creates (and drops) a
sibling database `<name>_empty` on the same server for the empty table.

Not a test and not a runtime dependency: numbers are for people (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

QUEUES = ("default", "emails", "reports")
CHUNK = 500_000


def _jobs(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "shigoto_jobs")


def populate(url: str, schema: str, finished: int, pending: int, append: bool) -> None:
    from shigoto.db.migrate import migrate

    migrate(url, schema=schema)
    with psycopg.connect(url, autocommit=True) as conn:
        have = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_jobs(schema))).fetchone()
        if have and have[0] and not append:
            sys.exit(f"{have[0]} jobs already in the table; pass --append to add more")
        done = 0
        while done < finished:
            n = min(CHUNK, finished - done)
            started = time.perf_counter()
            # ~90 % completed, 7 % discarded, 3 % cancelled; queues in 6:3:1 shares; finished
            # over the last 14 days, newest ids finishing last (as a real table fills).
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, worker, args, state, attempt, max_attempts,"
                    " scheduled_at, inserted_at, attempted_at, completed_at, finished_at,"
                    " attempted_by)"
                    " SELECT q, 'bench.noop', jsonb_build_object('n', g), s, 1, 3, t, t, t,"
                    "        CASE WHEN s = 'completed' THEN t END, t, 'bench-history'"
                    " FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g,"
                    " LATERAL (SELECT CASE WHEN g %% 10 < 6 THEN 'default'"
                    "                      WHEN g %% 10 < 9 THEN 'emails' ELSE 'reports' END AS q,"
                    "                 CASE WHEN (g / 7) %% 100 < 90 THEN 'completed'"
                    "                      WHEN (g / 7) %% 100 < 97 THEN 'discarded'"
                    "                      ELSE 'cancelled' END AS s,"
                    "                 now() - interval '14 days'"
                    "                   + (interval '14 days' - interval '1 minute')"
                    "                     * (g::float8 / %(total)s::float8) AS t) AS v"
                ).format(_jobs(schema)),
                {"first": done + 1, "last": done + n, "total": finished},
            )
            done += n
            print(f"finished rows: {done:,} ({time.perf_counter() - started:.1f}s)", flush=True)
        if pending:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, worker, args, state, scheduled_at)"
                    " SELECT CASE WHEN g %% 10 < 6 THEN 'default' WHEN g %% 10 < 9 THEN 'emails'"
                    "             ELSE 'reports' END,"
                    "        'bench.noop', jsonb_build_object('n', g), 'available',"
                    "        now() - interval '1 minute'"
                    " FROM generate_series(1, %(n)s::bigint) AS g"
                ).format(_jobs(schema)),
                {"n": pending},
            )
            print(f"pending rows: {pending:,}", flush=True)
        started = time.perf_counter()
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(_jobs(schema)))
        print(f"vacuum analyze: {time.perf_counter() - started:.1f}s", flush=True)


# -- measure -------------------------------------------------------------------------------


def _median_ms(fn: Callable[[], Any], repeat: int) -> tuple[float, list[float]]:
    fn()  # warm: connection, plan cache, buffers
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), [round(t, 2) for t in times]


def _operator_count(url: str, schema: str) -> Callable[[], float]:
    """One `dbcounts.fetch` of the three queues per call, on one kept connection (the
    operator's pool keeps its connections too); returns its seconds."""
    from shigoto_operator import dbcounts

    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(psycopg.AsyncConnection.connect(url, autocommit=True))

    async def once() -> float:
        started = time.perf_counter()
        await dbcounts.fetch(conn, schema, QUEUES)
        return time.perf_counter() - started

    return lambda: loop.run_until_complete(once())


def _explain(conn: psycopg.Connection[Any], statement: Any, params: Any) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one statement, summarised: its plan nodes (relation,
    index), execution time and shared buffers hit/read."""
    if isinstance(statement, str):
        statement = sql.SQL(statement)  # type: ignore[arg-type]
    row = conn.execute(
        sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + statement, params
    ).fetchone()
    assert row is not None
    plan = row[0][0]
    nodes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        label = node["Node Type"]
        if "Index Name" in node:
            label += f" using {node['Index Name']}"
        elif "Relation Name" in node:
            label += f" on {node['Relation Name']}"
        nodes.append(f"{label} (rows {node.get('Actual Rows')})")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    top = plan["Plan"]
    return {
        "execution_ms": plan["Execution Time"], "planning_ms": plan["Planning Time"],
        "shared_hit": top.get("Shared Hit Blocks"), "shared_read": top.get("Shared Read Blocks"),
        "nodes": nodes,
    }  # fmt: skip


def _statements(schema: str) -> list[tuple[str, Any, Any]]:
    """Every counting statement `shigoto status`, the operator and the sampler run, with
    parameters (before the change: the old ones, found by name)."""
    from shigoto.db import ops_statements
    from shigoto.db import runtime_statements as statements
    from shigoto.relations import workflows

    out: list[tuple[str, Any, Any]] = []
    stmts = statements.statements(schema)
    limit = getattr(ops_statements, "FINISHED_EXACT_LIMIT", 0) + 1
    if hasattr(ops_statements, "LIVE_COUNTS"):
        for name in ("LIVE_COUNTS", "FINISHED_COUNTS", "JOB_QUEUES", "FINISHED_LAST_HOUR"):
            out.append((name, ops_statements.compose(getattr(ops_statements, name), schema),
                        {"limit": limit}))  # fmt: skip
    if hasattr(ops_statements, "TABLE_STATS"):
        out.append(("TABLE_STATS", ops_statements.TABLE_STATS, {"schema": schema}))
    else:
        out.append(("statements._COUNTS", stmts.counts, None))
        out.append(("statements._OLDEST_AVAILABLE", stmts.oldest_available, None))
    out.append(("OPERATOR_COUNTS", ops_statements.compose(ops_statements.OPERATOR_COUNTS, schema),
                {"queues": list(QUEUES), "limit": limit}))  # fmt: skip
    if hasattr(ops_statements, "STATUS_WORKFLOWS"):
        out.append(("STATUS_WORKFLOWS",
                    ops_statements.compose(ops_statements.STATUS_WORKFLOWS, schema),
                    {"limit": 20}))  # fmt: skip
    else:
        out.append(("workflows.WORKFLOW_PROGRESS",
                    statements.compose(workflows.WORKFLOW_PROGRESS, schema), {"limit": 20}))
    try:
        from datetime import UTC, datetime, timedelta

        from shigoto.db import stats_statements
    except ImportError:
        return out
    at = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1)
    out.append(("stats_statements.SAMPLE (one minute)",
                ops_statements.compose(stats_statements.SAMPLE, schema),
                {"minutes": [at], "depth_at": at}))  # fmt: skip
    return out


def measure(url: str, schema: str, repeat: int, explain: bool) -> dict[str, Any]:
    import shigoto
    from shigoto.db import database

    os.environ["SHIGOTO_DATABASE_URL"] = url
    report: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT state, count(*) FROM {} GROUP BY 1 ORDER BY 1").format(_jobs(schema))
        ).fetchall()
        report["table"] = {state: n for state, n in rows}
        report["loadavg"] = os.getloadavg()
        median, times = _median_ms(lambda: shigoto.status(schema=schema), repeat)
        report["status_ms"] = {"median": round(median, 2), "runs": times}
        op = _operator_count(url, schema)
        op_times = []
        op()
        for _ in range(repeat):
            op_times.append(op() * 1000)
        report["operator_count_ms"] = {"median": round(statistics.median(op_times), 2),
                                       "runs": [round(t, 2) for t in op_times]}  # fmt: skip
        for name, statement, params in _statements(schema):
            median, times = _median_ms(lambda s=statement, p=params: conn.execute(s, p).rowcount,
                                       repeat)  # fmt: skip
            entry: dict[str, Any] = {"median_ms": round(median, 2), "runs": times}
            if explain:
                entry["explain"] = _explain(conn, statement, params)
            report.setdefault("statements", {})[name] = entry
    database.close_pools()
    return report


# -- processing ----------------------------------------------------------------------------


def _sibling(url: str, name: str) -> str:
    from shigoto.db import embedded

    return embedded.with_database(url, name)


def processing(url: str, schema: str, jobs: int, concurrency: int, repeat: int) -> dict[str, Any]:
    """jobs/s of the bench's processing phase on an empty table and on the populated one,
    alternating, `repeat` times each. The empty table is truncated before each run; on the
    populated one the phase's jobs stay, finished, as a real table keeps them (deleting them
    would leave dead rows a table that size is not vacuumed for). The populated table is
    vacuumed once first, as autovacuum would have done since it was filled."""
    from shigoto.cli import bench
    from shigoto.db import database
    from shigoto.db.migrate import migrate

    with psycopg.connect(url, autocommit=True) as conn:
        dbname = conn.info.dbname
        started = time.perf_counter()
        conn.execute(sql.SQL("VACUUM {}").format(_jobs(schema)))
        print(f"vacuum: {time.perf_counter() - started:.1f}s", flush=True)
    empty = f"{dbname}_empty"
    empty_url = _sibling(url, empty)
    with psycopg.connect(_sibling(url, "postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(empty)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(empty)))
    try:
        migrate(empty_url, schema=schema)
        cfg = bench.BenchConfig(process_jobs=jobs, concurrency=concurrency, schema=schema)
        results: dict[str, list[float]] = {"empty": [], "finished": []}
        for _ in range(repeat):
            for label, target in (("empty", empty_url), ("finished", url)):
                if label == "empty":
                    with psycopg.connect(target, autocommit=True) as conn:
                        conn.execute(sql.SQL("TRUNCATE {}").format(_jobs(schema)))
                bench._preload(target, cfg, jobs)
                result = asyncio.run(bench._process(target, cfg, lambda *_, **__: None))
                results[label].append(result["jobs_per_s"])
                database.close_pools()
                print(f"{label}: {result['jobs_per_s']} jobs/s", flush=True)
        empty_rate = statistics.median(results["empty"])
        full_rate = statistics.median(results["finished"])
        return {"jobs": jobs, "concurrency": concurrency, "runs": results,
                "empty_median": empty_rate, "finished_median": full_rate,
                "ratio": round(full_rate / empty_rate, 3), "loadavg": os.getloadavg()}  # fmt: skip
    finally:
        database.close_pools()
        with psycopg.connect(_sibling(url, "postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(empty)))


# -- write cost of migration 0021's indexes --------------------------------------------------

_WORKFLOW_INDEXES = ("shigoto_jobs_workflow_live_idx", "shigoto_jobs_workflow_idx")


def _timed(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> float:
    started = time.perf_counter()
    conn.execute(statement, params)
    return time.perf_counter() - started


def _lifecycle(conn: psycopg.Connection[Any], rows: int, workflow: bool) -> dict[str, float]:
    """Insert `rows` jobs, then move them available -> executing -> completed, one statement
    each (a job's three row versions, as the runner writes them); seconds per step."""
    conn.execute("TRUNCATE shigoto_jobs")
    meta = ('jsonb_build_object(\'workflow\', jsonb_build_object(\'id\', (g / 10)::text,'
            ' \'name\', \'wf\', \'step\', g::text))' if workflow else "'{}'::jsonb")
    out = {"insert": _timed(conn, "INSERT INTO shigoto_jobs (queue, worker, meta) SELECT 'q',"
                                  f" 'w', {meta} FROM generate_series(1, %s) AS g", (rows,))}
    out["claim"] = _timed(conn, "UPDATE shigoto_jobs SET state = 'executing', attempt = 1,"
                                " attempted_at = now(), attempted_by = 'n'")
    out["complete"] = _timed(conn, "UPDATE shigoto_jobs SET state = 'completed',"
                                   " completed_at = now(), finished_at = now()")
    return out


def index_cost(url: str, rows: int, repeat: int) -> dict[str, Any]:
    """Seconds of each step with and without migration 0021's two indexes, for plain jobs
    (which only test the indexes' predicate) and workflow steps (which get entries), on a
    scratch database `<name>_idx` next to `url`'s (created, migrated and dropped here)."""
    from shigoto.db.migrate import migrate

    with psycopg.connect(url, autocommit=True) as conn:
        scratch = f"{conn.info.dbname}_idx"
    scratch_url = _sibling(url, scratch)
    with psycopg.connect(_sibling(url, "postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(scratch)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(scratch)))
    try:
        migrate(scratch_url)
        migration = next(p for p in _migrations() if p.name.startswith("0021_"))
        runs: dict[str, list[dict[str, float]]] = {}
        with psycopg.connect(scratch_url, autocommit=True) as conn:
            for _ in range(repeat):
                for indexes in (True, False):
                    if indexes:
                        conn.execute(migration.read_text())
                    else:
                        for name in _WORKFLOW_INDEXES:
                            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(
                                sql.Identifier(name)))
                    for workflow in (False, True):
                        key = f"{'workflow' if workflow else 'plain'} jobs, " + (
                            "with 0021" if indexes else "without 0021")
                        runs.setdefault(key, []).append(_lifecycle(conn, rows, workflow))
        return {"rows": rows, "loadavg": os.getloadavg(), "median_seconds": {
            key: {step: round(statistics.median(r[step] for r in values), 3)
                  for step in values[0]} for key, values in runs.items()}}  # fmt: skip
    finally:
        with psycopg.connect(_sibling(url, "postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(scratch)))


def _migrations() -> list[Any]:
    from pathlib import Path

    return sorted((Path(__file__).resolve().parents[1] / "migrations").glob("*.sql"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("populate", "measure", "processing", "indexcost"):
        p = sub.add_parser(name)
        p.add_argument("--database-url", default=os.environ.get("SHIGOTO_DATABASE_URL"),
                       required="SHIGOTO_DATABASE_URL" not in os.environ)  # fmt: skip
        p.add_argument("--schema", default="public")
        if name == "populate":
            p.add_argument("--finished", type=int, default=10_000_000)
            p.add_argument("--pending", type=int, default=100_000)
            p.add_argument("--append", action="store_true")
        elif name == "measure":
            p.add_argument("--repeat", type=int, default=10)
            p.add_argument("--explain", action="store_true")
        elif name == "indexcost":
            p.add_argument("--rows", type=int, default=200_000)
            p.add_argument("--repeat", type=int, default=3)
        else:
            p.add_argument("--jobs", type=int, default=20_000)
            p.add_argument("--concurrency", type=int, default=50)
            p.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.command == "populate":
        populate(args.database_url, args.schema, args.finished, args.pending, args.append)
    elif args.command == "measure":
        print(json.dumps(measure(args.database_url, args.schema, args.repeat, args.explain),
                         indent=2, default=str))  # fmt: skip
    elif args.command == "indexcost":
        print(json.dumps(index_cost(args.database_url, args.rows, args.repeat), indent=2))
    else:
        print(json.dumps(processing(args.database_url, args.schema, args.jobs, args.concurrency,
                                    args.repeat), indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
