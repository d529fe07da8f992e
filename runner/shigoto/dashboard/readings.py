"""What each read endpoint fetches, on one connection: counts, the hour of charts, queues,
nodes, cron schedules. Each function runs a few statements of `db.dashboard_statements` and
returns plain values; turning them into the page's JSON is left to the caller and `views`.

Counts (see `db.dashboard_statements`): live states exact from their partial indexes; finished
states exact while the table holds at most `EXACT_FINISHED_LIMIT` rows (the planner's
estimate decides), else the planner's estimates, flagged `exact=False`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from shigoto.client.jobs import JobRecord
from shigoto.cron import coverage
from shigoto.db import dashboard_statements as ds
from shigoto.job import FINISHED_STATES, JOB_COLUMNS, JobState

#: Up to this many rows in shigoto_jobs (planner's estimate), finished jobs are counted exactly.
EXACT_FINISHED_LIMIT = 100_000
#: Most queue names read from the jobs table's index (a table with more is unusual).
MAX_QUEUES = 500

STATES = [str(s) for s in JobState]
_FINISHED = {str(s) for s in FINISHED_STATES}


@dataclass(slots=True)
class Counts:
    """Jobs by queue and state, and whether each state's counts are exact."""

    by_queue: dict[str, dict[str, int]] = field(default_factory=dict)
    exact: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(STATES, True))

    def add(self, queue: str, state: str, n: int) -> None:
        self.by_queue.setdefault(queue, dict.fromkeys(STATES, 0))[state] += n

    def totals(self) -> dict[str, int]:
        sums = dict.fromkeys(STATES, 0)
        for counts in self.by_queue.values():
            for state, n in counts.items():
                sums[state] += n
        return sums


def _rows(conn: psycopg.Connection[Any], template: str, schema: str,
          params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:  # fmt: skip
    return conn.execute(ds.compose(template, schema), params).fetchall()


def counts(conn: psycopg.Connection[Any], schema: str) -> Counts:
    """Counts by queue and state of every queue with jobs in shigoto_jobs."""
    found = Counts()
    for queue, state, n in _rows(conn, ds.LIVE_COUNTS, schema):
        found.add(queue, state, int(n))
    queues = [row[0] for row in _rows(conn, ds.QUEUE_NAMES, schema, {"limit": MAX_QUEUES})]
    for queue in queues:
        found.by_queue.setdefault(queue, dict.fromkeys(STATES, 0))
    total, per_pair = _estimates(conn, schema, queues)
    if total <= EXACT_FINISHED_LIMIT:
        for queue, state, n in _rows(conn, ds.FINISHED_COUNTS, schema):
            found.add(queue, state, int(n))
        return found
    for (queue, state), n in per_pair.items():
        found.add(queue, state, n)
    found.exact.update(dict.fromkeys(_FINISHED, False))
    return found


def _estimates(
    conn: psycopg.Connection[Any], schema: str, queues: list[str]
) -> tuple[int, dict[tuple[str, str], int]]:
    """The planner's row estimate for the whole table, and for each (queue, finished state)."""
    plan = conn.execute(ds.estimates(schema, queues)).fetchone()
    assert plan is not None
    root = plan[0][0]["Plan"]
    branches = root.get("Plans", []) if root.get("Node Type") == "Append" else [root]
    rows = [int(branch.get("Plan Rows", 0)) for branch in branches]
    pairs = [(q, s) for q in queues for s in ds.FINISHED_STATES]
    if len(rows) != len(pairs) + 1:  # an unexpected plan shape: no estimate beats a wrong one
        return int(root.get("Plan Rows", 0)), {}
    return rows[0], dict(zip(pairs, rows[1:], strict=True))


def now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute(ds.NOW).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def series(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    """The last hour of per-minute samples, summed over queues, oldest first."""
    names = ["available", "scheduled", "executing", "retryable", "completed", "discarded",
             "cancelled"]  # fmt: skip
    return [
        {"at": row[0], **{name: int(v or 0) for name, v in zip(names, row[1:], strict=True)}}
        for row in _rows(conn, ds.SERIES, schema)
    ]


def node_count(conn: psycopg.Connection[Any], schema: str) -> int:
    return int(_rows(conn, ds.NODE_COUNT, schema)[0][0])


def nodes(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    """Live nodes; `leader`: whether the node holds any live lease, `leads`: which ones
    (`leader` for rescue, pruning and the stager's peers, `cron` for a runner with --cron).
    Leases carry the node id of the heartbeat row (`shigoto.runtime.elector`), so the two
    join on it."""
    names = ("id", "hostname", "pid", "queues", "started_at", "last_seen_at", "leader",
             "executing")  # fmt: skip
    leads = dict(_rows(conn, coverage.LEASES_BY_NODE, schema))
    return [
        {**dict(zip(names, row, strict=True)), "leads": list(leads.get(row[0]) or [])}
        for row in _rows(conn, ds.NODES, schema)
    ]


def queue_settings(conn: psycopg.Connection[Any], schema: str) -> dict[str, dict[str, Any]]:
    return {row[0]: setting_of(row) for row in _rows(conn, ds.QUEUE_SETTINGS, schema)}


def queue_setting(conn: psycopg.Connection[Any], schema: str, name: str) -> dict[str, Any]:
    rows = _rows(conn, ds.QUEUE_ROW, schema, {"name": name})
    return setting_of(rows[0] if rows else None)


def setting_of(row: tuple[Any, ...] | None) -> dict[str, Any]:
    """A settings row as the page shows it; None: a queue without a row (the defaults)."""
    empty = (None, False, None, None, None, None)
    _, paused, limit, rate_limit, replicas, replicas_at = row or empty
    return {
        "paused": bool(paused), "global_concurrency": limit,
        "rate_limit": describe_rate_limit(rate_limit), "operator_replicas": replicas,
        "operator_replicas_at": replicas_at,
    }  # fmt: skip


def describe_rate_limit(value: Any) -> str | None:
    """A stored rate limit ({"limit", "per", "algorithm", "burst", "by_partition"}) as one
    line: "100 per 60 s (gcra, burst 10, per partition)"."""
    if not value:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    per = value.get("per", 1)
    extras = [str(value.get("algorithm", "gcra"))]
    if value.get("burst"):
        extras.append(f"burst {value['burst']}")
    if value.get("by_partition"):
        extras.append("per partition")
    return f"{value.get('limit')} per {per:g} s ({', '.join(extras)})"


def runners_by_queue(node_rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many live nodes serve each queue (a node's `queues` maps names to concurrency)."""
    served: dict[str, int] = {}
    for node in node_rows:
        for queue in node.get("queues") or {}:
            served[queue] = served.get(queue, 0) + 1
    return served


def cron(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    """Each schedule, with its next slot (computed here, on the database's clock) and the
    state of the last job it enqueued; `unscheduled`: enabled, but no live process holds a
    cron lease, so its slots are not being enqueued (`shigoto.cron.coverage`)."""
    from shigoto.cron import expression
    from shigoto.errors import ValidationError

    unscheduled = set(coverage.coverage(conn, schema).unscheduled)
    schedules = []
    for row in _rows(conn, ds.CRON, schema):
        name, expr, worker, queue, tz, enabled, last_slot, last_id, last_state, at = row
        try:
            upcoming = expression.parse(expr, tz).next_after(at) if enabled else None
        except ValidationError:
            upcoming = None
        schedules.append({
            "name": name, "expression": expr, "worker": worker, "queue": queue,
            "timezone": tz, "paused": not enabled, "next_at": upcoming,
            "last_slot_at": last_slot,
            "last_job": {"id": last_id, "state": last_state} if last_id is not None else None,
            "unscheduled": name in unscheduled,
        })  # fmt: skip
    return schedules


def change_mark(conn: psycopg.Connection[Any], schema: str) -> tuple[Any, ...]:
    """A value that changes whenever the counts do (see CHANGE_MARK)."""
    row = _rows(conn, ds.CHANGE_MARK, schema)[0]
    return tuple(row)


def jobs_by_ids(conn: psycopg.Connection[Any], schema: str, ids: list[int]) -> dict[int, JobRecord]:
    """Whole rows of the jobs `ids` (a job's workflow relatives), live or archived."""
    n = len(JOB_COLUMNS)
    found = {}
    for row in _rows(conn, ds.JOBS_BY_IDS, schema, {"ids": ids}):
        values = list(row[:n])
        values[4] = JobState(values[4])
        found[row[0]] = JobRecord(*values, archived=row[n], archived_at=row[n + 1])
    return found
