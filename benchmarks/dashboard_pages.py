"""The dashboard stays fast on a big table (issue 13 point 5): every read endpoint timed
server-side on 1,000,000 finished jobs and 100,000 pending ones.

    python benchmarks/dashboard_pages.py populate --database-url URL [--finished 1000000]
                                                  [--pending 100000]
    python benchmarks/dashboard_pages.py measure  --database-url URL [--repeat 20] [--json]
    python benchmarks/dashboard_pages.py walk-args --database-url URL [--customer c43]

`populate` migrates the database and fills it with `--finished` finished jobs (completed 90%,
discarded 7%, cancelled 3%; six queues, ten workers, eight runner nodes; finishing times
spread over the last 24 hours) and `--pending` waiting ones (available, scheduled, retryable),
each set with one INSERT ... SELECT over generate_series, an hour of per-minute samples in
shigoto_stats, a few nodes, cron schedules and queue settings, then VACUUM ANALYZE (as
autovacuum would have by then). It refuses a database that already holds jobs.

`measure` builds a `Dashboard` in this process (no sockets, no browser: the server-side time
of each page) and calls each read endpoint `--repeat` times, printing the median and the 95th
percentile; then one EXPLAIN (ANALYZE, BUFFERS) of each dashboard statement and of the job
lists' statement, summarised as its plan nodes and indexes, so it shows that no page reads the
finished rows, except an args search, which reads at most ARGS_SCAN ids of them per page.

`walk-args` follows every page of the args search (queue billing, one customer) to its end,
each page searching ARGS_SCAN ids, and prints the number of pages and their times.

Not a test and not a runtime dependency: numbers are for people (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

import shigoto
from shigoto.client import jobs as job_api
from shigoto.dashboard import Dashboard, Request, Source
from shigoto.dashboard.app import ARGS_SCAN
from shigoto.db import dashboard_statements as ds
from shigoto.db import job_statements

QUEUES = ["default", "emails", "reports", "billing", "images", "webhooks"]
CHUNK = 200_000
TOKEN = "benchmark-token-0123456789"


def _jobs(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "shigoto_jobs")


def populate(url: str, schema: str, finished: int, pending: int) -> None:
    shigoto.migrate(url, schema=schema)
    with psycopg.connect(url, autocommit=True) as conn:
        have = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_jobs(schema))).fetchone()
        if have and have[0]:
            sys.exit(f"{url}: shigoto_jobs already holds {have[0]} jobs; use an empty database")
        started = time.perf_counter()
        done = 0
        while done < finished:
            n = min(CHUNK, finished - done)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, worker, args, state, attempt, max_attempts,"
                    " scheduled_at, inserted_at, attempted_at, completed_at, finished_at,"
                    " attempted_by, tags, errors)"
                    " SELECT (%(queues)s::text[])[1 + g %% 6], 'app.workers.w' || (g %% 10),"
                    "        jsonb_build_object('n', g, 'customer', 'c' || (g %% 5000)), s,"
                    "        1, 3, t, t, t, CASE WHEN s = 'completed' THEN t END, t,"
                    "        'node-' || (g %% 8), ARRAY['t' || (g %% 20)],"
                    "        CASE WHEN s = 'discarded' THEN jsonb_build_array(jsonb_build_object("
                    "          'attempt', 1, 'at', t, 'error', 'ValueError: boom',"
                    "          'traceback', 'Traceback ...')) ELSE '[]'::jsonb END"
                    " FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g,"
                    " LATERAL (SELECT CASE WHEN (g / 7) %% 100 < 90 THEN 'completed'"
                    "                      WHEN (g / 7) %% 100 < 97 THEN 'discarded'"
                    "                      ELSE 'cancelled' END AS s,"
                    "                 now() - interval '24 hours'"
                    "                   + interval '24 hours' * (g::float8 / %(total)s) AS t) AS v"
                ).format(_jobs(schema)),
                {"first": done + 1, "last": done + n, "total": finished, "queues": QUEUES},
            )
            done += n
            print(f"finished rows: {done:,} ({time.perf_counter() - started:.0f}s)", flush=True)
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, worker, args, state, attempt, scheduled_at)"
                " SELECT (%(queues)s::text[])[1 + g %% 6], 'app.workers.w' || (g %% 10),"
                "        jsonb_build_object('n', g), s,"
                "        CASE WHEN s = 'retryable' THEN 1 ELSE 0 END,"
                "        CASE WHEN s = 'available' THEN now() - interval '1 minute'"
                "             ELSE now() + interval '1 hour' END"
                " FROM generate_series(1, %(n)s::bigint) AS g,"
                " LATERAL (SELECT CASE WHEN g %% 10 < 5 THEN 'available'"
                "                      WHEN g %% 10 < 8 THEN 'scheduled'"
                "                      ELSE 'retryable' END AS s) AS v"
            ).format(_jobs(schema)),
            {"n": pending, "queues": QUEUES},
        )
        print(f"pending rows: {pending:,}", flush=True)
        _extras(conn, schema)
        started = time.perf_counter()
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(_jobs(schema)))
        print(f"vacuum analyze: {time.perf_counter() - started:.1f}s", flush=True)


def _extras(conn: psycopg.Connection[Any], schema: str) -> None:
    """An hour of samples, eight nodes (some jobs executing on them), cron, settings."""
    table = sql.Identifier(schema, "shigoto_stats")
    conn.execute(sql.SQL(
        "INSERT INTO {} (at, queue, available, scheduled, executing, retryable, completed,"
        " discarded, cancelled)"
        " SELECT date_trunc('minute', now()) - m * interval '1 minute', q, 8000 + m, 5000, 40,"
        "        3000, 600, 45, 20"
        " FROM generate_series(0, 59) AS m, unnest(%(queues)s::text[]) AS q"
        " ON CONFLICT DO NOTHING"
    ).format(table), {"queues": QUEUES})  # fmt: skip
    nodes = sql.Identifier(schema, "shigoto_nodes")
    conn.execute(sql.SQL(
        "INSERT INTO {} (id, hostname, pid, queues)"
        " SELECT 'node-' || i, 'host-' || i, 1000 + i,"
        "        jsonb_build_object(%(q1)s::text, 10, %(q2)s::text, 5)"
        " FROM generate_series(0, 7) AS i"
    ).format(nodes), {"q1": QUEUES[0], "q2": QUEUES[1]})  # fmt: skip
    conn.execute(sql.SQL(
        "UPDATE {} SET state = 'executing', attempted_by = 'node-' || mod(id, 8),"
        " attempted_at = now() WHERE id IN (SELECT id FROM {} WHERE state = 'available'"
        " ORDER BY id LIMIT 200)"
    ).format(_jobs(schema), _jobs(schema)))  # fmt: skip
    cron = sql.Identifier(schema, "shigoto_cron")
    conn.execute(sql.SQL(
        "INSERT INTO {} (name, expression, worker, queue, last_slot_at, last_job_id)"
        " SELECT 'schedule-' || i, '*/5 * * * *', 'app.workers.w1', 'reports', now(), i * 1000"
        " FROM generate_series(1, 10) AS i"
    ).format(cron))  # fmt: skip
    queues = sql.Identifier(schema, "shigoto_queues")
    conn.execute(sql.SQL(
        "INSERT INTO {} (name, paused, global_concurrency) VALUES ('reports', true, 20)"
        " ON CONFLICT DO NOTHING"
    ).format(queues))  # fmt: skip


def _pages(dashboard: Dashboard, url: str, schema: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        finished_id = conn.execute(sql.SQL(
            "SELECT id FROM {} WHERE state = 'discarded' ORDER BY id DESC LIMIT 1"
        ).format(_jobs(schema))).fetchone()  # fmt: skip
    assert finished_id is not None
    first = dashboard.handle(Request("GET", "/api/jobs")).json()
    by_args = '/api/jobs?queue=billing&args={"customer":"c42"}'
    signed_in = {"Authorization": f"Bearer {TOKEN}"}
    # The first page of an args search reads the newest ids (the pending jobs); the next one
    # (its cursor) reads the finished rows below them.
    args_next = dashboard.handle(Request("GET", by_args, signed_in)).json()["next"]
    return {
        "session": "/api/session",
        "overview": "/api/overview",
        "queues": "/api/queues",
        "jobs (first page)": "/api/jobs",
        "jobs (second page)": f"/api/jobs?after={first['next']}",
        "jobs by queue": "/api/jobs?queue=reports",
        "jobs by worker": "/api/jobs?worker=app.workers.w3",
        "jobs by tag": "/api/jobs?tag=t7",
        "jobs by state (available)": "/api/jobs?state=available",
        "failures": "/api/jobs?state=discarded,retryable",
        "jobs by args (signed in)": by_args,
        "jobs by args, next page": f"{by_args}&after={args_next}" if args_next else by_args,
        "job detail": f"/api/jobs/{finished_id[0]}",
        "cron": "/api/cron",
        "nodes": "/api/nodes",
        "index.html": "/",
    }


def measure(url: str, schema: str, repeat: int, as_json: bool) -> None:
    dashboard = Dashboard([Source("default", url, schema)], token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    results: dict[str, dict[str, float]] = {}
    try:
        for name, target in _pages(dashboard, url, schema).items():
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                response = dashboard.handle(Request("GET", target, headers))
                times.append((time.perf_counter() - started) * 1000)
                assert response.status == 200, (target, response.status, response.body[:300])
            times.sort()
            p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
            results[name] = {"median_ms": round(statistics.median(times), 1),
                             "p95_ms": round(p95, 1)}  # fmt: skip
        overview = dashboard.handle(Request("GET", "/api/overview")).json()
    finally:
        dashboard.close()
    plans = explain_all(url, schema)
    if as_json:
        print(json.dumps({"pages": results, "plans": plans, "overview": overview}, indent=2))
        return
    print(f"{'page':32} {'median ms':>10} {'p95 ms':>8}")
    for name, r in results.items():
        print(f"{name:32} {r['median_ms']:>10} {r['p95_ms']:>8}")
    print(f"\noverview counts: {overview['counts']}\nexact: {overview['exact']}\n")
    for name, plan in plans.items():
        print(f"{name}: {plan}")


def _summary(node: dict[str, Any], out: list[str]) -> None:
    label = node["Node Type"]
    if "Index Name" in node:
        label += f" on {node['Index Name']}"
    elif "Relation Name" in node:
        label += f" on {node['Relation Name']}"
    if "Actual Rows" in node:
        label += f" (rows {int(node['Actual Rows'] * node.get('Actual Loops', 1))})"
    out.append(label)
    for child in node.get("Plans", []):
        _summary(child, out)


def _args_search(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[Any, Any]]:
    """The statements of the second page of the benchmark's args search: where the search
    starts (id_bounds), then the ARGS_SCAN ids below the first page's (the finished rows)."""
    tables = (False, True)
    bounds = conn.execute(job_statements.id_bounds(schema, tables)).fetchone()
    assert bounds is not None and bounds[0] is not None
    below = bounds[0] + 1 - ARGS_SCAN
    where, params = job_api.JobFilter(queue="billing", args_contains={"customer": "c42"}).where(
        below=below, above=below - ARGS_SCAN - 1
    )
    return {
        "id_bounds (args search)": (job_statements.id_bounds(schema, tables), None),
        "list_jobs (args search, next page)": (
            job_statements.list_jobs(schema, where, tables), {**params, "limit": 51}),
    }  # fmt: skip


def explain_all(url: str, schema: str) -> dict[str, str]:
    """Each statement's plan nodes, with the indexes they use and the rows they returned."""
    where, params = job_api.JobFilter(states=["discarded", "retryable"]).where()
    statements: dict[str, tuple[Any, Any]] = {
        "LIVE_COUNTS": (ds.compose(ds.LIVE_COUNTS, schema), None),
        "QUEUE_NAMES": (ds.compose(ds.QUEUE_NAMES, schema), {"limit": 500}),
        "SERIES": (ds.compose(ds.SERIES, schema), None),
        "NODES": (ds.compose(ds.NODES, schema), None),
        "CRON": (ds.compose(ds.CRON, schema), None),
        "CHANGE_MARK": (ds.compose(ds.CHANGE_MARK, schema), None),
        "QUEUE_SETTINGS": (ds.compose(ds.QUEUE_SETTINGS, schema), None),
        "list_jobs (failures page)": (
            job_statements.list_jobs(schema, where, (False, True)), {**params, "limit": 51}),
    }  # fmt: skip
    plans: dict[str, str] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        statements.update(_args_search(conn, schema))
        for name, (query, args) in statements.items():
            row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}").format(query),
                               args).fetchone()  # fmt: skip
            assert row is not None
            top = row[0][0]
            nodes: list[str] = []
            _summary(top["Plan"], nodes)
            plans[name] = f"{top['Execution Time']:.1f} ms: " + " > ".join(nodes)
        started = time.perf_counter()
        conn.execute(ds.estimates(schema, QUEUES)).fetchone()
        plans["estimates (EXPLAIN only)"] = f"{(time.perf_counter() - started) * 1000:.1f} ms"
    return plans


def walk_args(url: str, schema: str, customer: str) -> None:
    """Every page of the args search for `customer` in queue billing, following `next` until
    it is null: how many pages, how many matches, and each page's time."""
    dashboard = Dashboard([Source("default", url, schema)], token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    base = "/api/jobs?queue=billing&args=" + json.dumps({"customer": customer})
    target, times, found = base, [], 0
    try:
        while True:
            started = time.perf_counter()
            answer = dashboard.handle(Request("GET", target, headers)).json()
            times.append((time.perf_counter() - started) * 1000)
            found += len(answer["jobs"])
            if answer["next"] is None:
                break
            target = f"{base}&after={answer['next']}"
    finally:
        dashboard.close()
    print(f"{customer}: {len(times)} pages of {ARGS_SCAN:,} ids, {found} jobs found; per page "
          f"median {statistics.median(times):.1f} ms, slowest {max(times):.1f} ms; "
          f"{sum(times):.0f} ms in all")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["populate", "measure", "walk-args"])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--schema", default="public")
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--customer", default="c43", help="walk-args: whose jobs to search")
    args = parser.parse_args()
    if args.command == "populate":
        populate(args.database_url, args.schema, args.finished, args.pending)
    elif args.command == "walk-args":
        walk_args(args.database_url, args.schema, args.customer)
    else:
        measure(args.database_url, args.schema, args.repeat, args.json)


if __name__ == "__main__":
    main()
