"""Listing jobs on a table of 10 M finished rows (issue 26): what the product's listing
statements cost server-side once migration 0028 dropped the live table's (queue, id) and
(worker, id) indexes.

    python benchmarks/listing.py populate --database-url URL [--finished 10000000]
    python benchmarks/listing.py measure  --database-url URL [--json FILE]
    python benchmarks/listing.py fixes    --database-url URL [--json FILE]

`populate` migrates the database and fills `shigoto_jobs` with `--finished` finished rows
over 19 common queues (`q00`..`q18`) and 49 common workers (`bench.w00`..`bench.w48`), plus
one rare queue (`rare`) and one rare worker (`bench.rare_worker`) of 10 rows each, spread
over the whole id range (so 20 queues and 50 workers); about 90 % completed, 7 % discarded,
3 % cancelled, finishing times spread over the last 14 days, newest ids finishing last. One
row in 100,000 is `retryable` (a rare live state among old ids), and 10,000 available and
1,000 scheduled jobs follow the history (the newest ids, as a backlog is). Chunks of one
INSERT ... SELECT each, then VACUUM ANALYZE (as autovacuum would have by then). The archive
stays empty: this is the live table's worst case, a retention long enough to keep them all.

`measure` runs each listing through the product's own code (`client.job_steps.list_steps`,
the conversation `shigoto.list_jobs` drives; `ops.operations._status_steps` for `shigoto
status`; `ops_statements.JOB_QUEUES`) on one connection. Every statement such a
conversation sends is executed once as the product sends it (warming the cache, and giving
the rows the conversation needs: a page's cursor), then once more under
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF): the execution time that reports is the server-side
time compared with the 1 s budget. TIMING OFF because per-node clocks would add their own
cost to a walk of millions of rows.

`fixes` times candidate fixes without changing the measured table: the bounded page the API
already has (`list_jobs(scan_limit=N)`), and the unbounded statements under other plans
(no parallel workers; the primary key walked backwards). Each is read-only.

Not a test and not a runtime dependency: numbers are for people (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

CHUNK = 500_000
COMMON_QUEUES = 19
COMMON_WORKERS = 49
RARE_QUEUE = "rare"
RARE_WORKER = "bench.rare_worker"
ABSENT_QUEUE = "nosuch"
ABSENT_WORKER = "bench.nosuch"
BUDGET_MS = 1000.0


def _jobs(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "shigoto_jobs")


# One row of history per g: the rare queue and worker take the g that are 1 and 2 modulo a
# tenth of the rows, so their 10 rows lie evenly from the oldest id to the newest.
_HISTORY = """
INSERT INTO {jobs} (queue, worker, args, state, attempt, max_attempts, scheduled_at,
                    inserted_at, attempted_at, completed_at, finished_at, attempted_by)
SELECT q, w, jsonb_build_object('n', g), s, 1, 3, t, t, t,
       CASE WHEN s = 'completed' THEN t END, CASE WHEN s <> 'retryable' THEN t END,
       'bench-history'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g,
LATERAL (SELECT
    CASE WHEN g %% %(tenth)s = 1 THEN 'rare'
         ELSE 'q' || lpad((g %% 19)::text, 2, '0') END AS q,
    CASE WHEN g %% %(tenth)s = 2 THEN 'bench.rare_worker'
         ELSE 'bench.w' || lpad((g %% 49)::text, 2, '0') END AS w,
    CASE WHEN g %% 100000 = 3 THEN 'retryable'
         WHEN (g / 7) %% 100 < 90 THEN 'completed'
         WHEN (g / 7) %% 100 < 97 THEN 'discarded'
         ELSE 'cancelled' END AS s,
    now() - interval '14 days' + (interval '14 days' - interval '1 minute')
                                 * (g::float8 / %(total)s::float8) AS t) AS v
"""

_BACKLOG = """
INSERT INTO {jobs} (queue, worker, args, state, scheduled_at)
SELECT 'q' || lpad((g %% 19)::text, 2, '0'), 'bench.w' || lpad((g %% 49)::text, 2, '0'),
       jsonb_build_object('n', g), %(state)s, now() + %(offset)s::interval
FROM generate_series(1, %(n)s::bigint) AS g
"""


def populate(url: str, schema: str, finished: int, append: bool) -> None:
    from shigoto.db.migrate import migrate

    migrate(url, schema=schema)
    with psycopg.connect(url, autocommit=True) as conn:
        have = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_jobs(schema))).fetchone()
        if have and have[0] and not append:
            sys.exit(f"{have[0]} jobs already in the table; pass --append to add more")
        tenth = max(finished // 10, 3)
        done = 0
        while done < finished:
            n = min(CHUNK, finished - done)
            started = time.perf_counter()
            conn.execute(sql.SQL(_HISTORY).format(jobs=_jobs(schema)),
                         {"first": done + 1, "last": done + n, "total": finished,
                          "tenth": tenth})  # fmt: skip
            done += n
            print(f"finished rows: {done:,} ({time.perf_counter() - started:.1f}s)", flush=True)
        for state, n, offset in (("available", 10_000, "-1 minute"),
                                 ("scheduled", 1_000, "1 hour")):  # fmt: skip
            conn.execute(sql.SQL(_BACKLOG).format(jobs=_jobs(schema)),
                         {"state": state, "n": n, "offset": offset})  # fmt: skip
        started = time.perf_counter()
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(_jobs(schema)))
        print(f"vacuum analyze: {time.perf_counter() - started:.1f}s", flush=True)


# -- measure -------------------------------------------------------------------------------


def _is_read(conn: psycopg.Connection[Any], query: Any) -> bool:
    text = query if isinstance(query, str) else query.as_string(conn)
    return text.lstrip().split(None, 1)[0].upper() in ("SELECT", "WITH", "(SELECT")


def _summary(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan's execution time, shared buffers and its scan nodes (what each read)."""
    scans: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        kind = node["Node Type"]
        if "Index Name" in node:
            scans.append(f"{kind} using {node['Index Name']} (rows {node.get('Actual Rows')})")
        elif "Relation Name" in node:
            scans.append(f"{kind} on {node['Relation Name']} (rows {node.get('Actual Rows')})")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    top = plan["Plan"]
    return {
        "execution_ms": round(plan["Execution Time"], 2),
        "planning_ms": round(plan["Planning Time"], 2),
        "buffers_hit": top.get("Shared Hit Blocks"), "buffers_read": top.get("Shared Read Blocks"),
        "scans": scans,
    }  # fmt: skip


def explained(conn: psycopg.Connection[Any], work: Any, record: list[dict[str, Any]]) -> Any:
    """Drive a product conversation (`shigoto.db.steps`) on `conn`, as `steps.run` does, and
    append to `record` what each read statement cost: the client-side time of its real run,
    then its server-side time under EXPLAIN ANALYZE. Writes are only executed (EXPLAIN
    ANALYZE would run them twice)."""
    from shigoto.db import steps

    try:
        query, params = next(work)
        while True:
            started = time.perf_counter()
            cur = conn.execute(query, params)
            rows = cur.fetchall() if cur.description else []
            wall = (time.perf_counter() - started) * 1000
            result = steps._result(cur.description, rows, cur.rowcount)
            if _is_read(conn, query):
                statement = sql.SQL(query) if isinstance(query, str) else query  # type: ignore[arg-type]
                plan = conn.execute(
                    sql.SQL("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) ") + statement,
                    params,
                ).fetchone()
                assert plan is not None
                record.append({"run_ms": round(wall, 2), **_summary(plan[0][0])})
            query, params = work.send(result)
    except StopIteration as done:
        return done.value


def _page(conn: psycopg.Connection[Any], schema: str, record: list[dict[str, Any]],
          after: str | None = None, limit: int = 50, scan: int | None = None,
          **filters: Any) -> Any:  # fmt: skip
    """One `list_jobs` page, built exactly as `shigoto.list_jobs` builds it."""
    from shigoto.client import job_filters as jf
    from shigoto.client.job_steps import list_steps

    f = jf.job_filter(filters.get("queue"), filters.get("worker"), filters.get("state"),
                      None, None, None)  # fmt: skip
    work = list_steps(f, jf.parse_cursor(after), jf.valid_limit(limit), jf.tables_for(None),
                      schema, jf.valid_scan_limit(scan))  # fmt: skip
    return explained(conn, work, record)


#: (label, filters, limit): each is measured on its first page and, when there is one, the
#: page after it (its `next` cursor).
CASES: list[tuple[str, dict[str, Any], int]] = [
    ("queue, common", {"queue": "q07"}, 50),
    ("queue, rare (10 rows)", {"queue": RARE_QUEUE}, 50),
    ("queue, rare, pages of 5", {"queue": RARE_QUEUE}, 5),
    ("queue, absent", {"queue": ABSENT_QUEUE}, 50),
    ("worker, common", {"worker": "bench.w07"}, 50),
    ("worker, rare (10 rows)", {"worker": RARE_WORKER}, 50),
    ("worker, absent", {"worker": ABSENT_WORKER}, 50),
    ("worker, short name (suffix)", {"worker": "w07"}, 50),
    ("state, discarded (7 %)", {"state": "discarded"}, 50),
    ("state, failed (discarded + retryable)", {"state": "failed"}, 50),
    ("state, available (backlog)", {"state": "available"}, 50),
    ("state, retryable (100 old rows)", {"state": "retryable"}, 50),
    ("queue + state, common + discarded", {"queue": "q07", "state": "discarded"}, 50),
    ("queue + state, common + available", {"queue": "q07", "state": "available"}, 50),
    ("queue + state, common + retryable", {"queue": "q07", "state": "retryable"}, 50),
    ("queue + state, rare + completed", {"queue": RARE_QUEUE, "state": "completed"}, 50),
    ("queue + state, absent + discarded", {"queue": ABSENT_QUEUE, "state": "discarded"}, 50),
]


def _statement_ms(record: list[dict[str, Any]]) -> float:
    return round(sum(r["execution_ms"] for r in record), 2)


def measure(url: str, schema: str) -> dict[str, Any]:
    from shigoto.db import ops_statements
    from shigoto.ops import operations

    report: dict[str, Any] = {"loadavg_before": os.getloadavg(), "listings": [], "ops": {}}
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT state, count(*) FROM {} GROUP BY 1 ORDER BY 1")
                            .format(_jobs(schema))).fetchall()  # fmt: skip
        report["table"] = {state: n for state, n in rows}
        size = conn.execute("SELECT pg_size_pretty(pg_table_size(%s)),"
                            " pg_size_pretty(pg_indexes_size(%s))",
                            (f"{schema}.shigoto_jobs",) * 2).fetchone()  # fmt: skip
        report["table_size"], report["indexes_size"] = size if size else (None, None)
        for label, filters, limit in CASES:
            first: list[dict[str, Any]] = []
            page = _page(conn, schema, first, limit=limit, **filters)
            entry: dict[str, Any] = {"case": label, "filters": filters, "limit": limit,
                                     "first": {"jobs": len(page.jobs), "ms": _statement_ms(first),
                                               "statements": first}}  # fmt: skip
            if page.next:
                later: list[dict[str, Any]] = []
                second = _page(conn, schema, later, after=page.next, limit=limit, **filters)
                entry["next"] = {"jobs": len(second.jobs), "ms": _statement_ms(later),
                                 "statements": later}  # fmt: skip
            report["listings"].append(entry)
            print(f"{label}: first {entry['first']['ms']} ms"
                  + (f", next {entry['next']['ms']} ms" if "next" in entry else ""),
                  file=sys.stderr, flush=True)  # fmt: skip
        queues: list[dict[str, Any]] = []
        names = explained(conn, _one(ops_statements.compose(ops_statements.JOB_QUEUES, schema)),
                          queues)  # fmt: skip
        report["ops"]["JOB_QUEUES"] = {"ms": _statement_ms(queues), "queues": len(names),
                                       "statements": queues}  # fmt: skip
        counts: list[dict[str, Any]] = []
        explained(conn, operations._counts_steps(schema), counts)
        report["ops"]["status counts (_counts_steps)"] = {"ms": _statement_ms(counts),
                                                          "statements": counts}  # fmt: skip
        status: list[dict[str, Any]] = []
        explained(conn, operations._status_steps(schema), status)
        report["ops"]["shigoto status (_status_steps, every statement)"] = {
            "ms": _statement_ms(status), "statements": status}  # fmt: skip
    report["loadavg_after"] = os.getloadavg()
    report["over_budget"] = [
        f"{e['case']} ({which})" for e in report["listings"] for which in ("first", "next")
        if which in e and e[which]["ms"] > BUDGET_MS
    ] + [name for name, o in report["ops"].items() if o["ms"] > BUDGET_MS]  # fmt: skip
    return report


def _one(statement: Any, params: Any = None) -> Any:
    """A conversation of one statement that returns its rows."""
    result = yield statement, params
    return result.rows


# -- fixes, measured on the side -------------------------------------------------------------


def fixes(url: str, schema: str) -> dict[str, Any]:
    """Server-side time of the worst cases of `measure` (a filter that matches few or no
    rows, so the page reads every row) under candidate fixes and plan choices:

    - the bounded page `list_jobs(scan_limit=N)` already offers (the dashboard uses it for
      the args filter): at most N ids searched per page, `partial` pages and a cursor that
      carries on; nothing is written anywhere;
    - the unbounded page as the planner would run it without parallel workers (a busy
      server has none to give: `max_parallel_workers_per_gather = 0`), and walking the
      primary key backwards (`enable_seqscan = off`), to show what the plan choice is worth.
    Each is read-only; the settings are local to one transaction."""
    out: dict[str, Any] = {"loadavg_before": os.getloadavg(), "bounded": [], "plans": []}
    worst = [("queue, rare", {"queue": RARE_QUEUE}), ("queue, absent", {"queue": ABSENT_QUEUE}),
             ("worker, absent", {"worker": ABSENT_WORKER})]  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn:
        for label, filters in worst:
            for scan in (100_000, 1_000_000):
                record: list[dict[str, Any]] = []
                page = _page(conn, schema, record, scan=scan, **filters)
                out["bounded"].append({"case": label, "scan_limit": scan, "ms": _statement_ms(
                    record), "jobs": len(page.jobs), "partial": page.partial,
                    "statements": record})  # fmt: skip
                print(f"{label}, scan_limit {scan:,}: {_statement_ms(record)} ms",
                      file=sys.stderr, flush=True)  # fmt: skip
        for label, filters in worst:
            for plan, setting in (("serial", "max_parallel_workers_per_gather = 0"),
                                  ("primary key walk", "enable_seqscan = off")):  # fmt: skip
                record = []
                with conn.transaction():
                    conn.execute(f"SET LOCAL {setting}")
                    page = _page(conn, schema, record, **filters)
                out["plans"].append({"case": label, "plan": plan, "ms": _statement_ms(record),
                                     "jobs": len(page.jobs), "statements": record})  # fmt: skip
                print(f"{label}, {plan}: {_statement_ms(record)} ms", file=sys.stderr,
                      flush=True)  # fmt: skip
    out["loadavg_after"] = os.getloadavg()
    return out


def _emit(report: dict[str, Any], path: str | None) -> None:
    text = json.dumps(report, indent=2, default=str)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, Callable[[argparse.Namespace], None]] = {
        "populate": lambda a: populate(a.database_url, a.schema, a.finished, a.append),
        "measure": lambda a: _emit(measure(a.database_url, a.schema), a.json),
        "fixes": lambda a: _emit(fixes(a.database_url, a.schema), a.json),
    }
    for name in commands:
        p = sub.add_parser(name)
        p.add_argument("--database-url", default=os.environ.get("SHIGOTO_DATABASE_URL"),
                       required="SHIGOTO_DATABASE_URL" not in os.environ)  # fmt: skip
        p.add_argument("--schema", default="public")
        if name == "populate":
            p.add_argument("--finished", type=int, default=10_000_000)
            p.add_argument("--append", action="store_true")
        else:
            p.add_argument("--json", metavar="FILE", help="also write the report there")
    args = parser.parse_args(argv)
    commands[args.command](args)


if __name__ == "__main__":
    main()
