"""Operating a queue from code or the CLI: status, health, retry and cancel in bulk.

Filters combine with AND; at least one is required for retry/cancel so a typo can never touch
every job in the table.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from shigoto import config
from shigoto.db import database, statements
from shigoto.errors import ValidationError
from shigoto.job import CANCELLABLE_STATES, FINISHED_STATES, JobState

#: States `retry_by` acts on: anything not already waiting to run or running.
RETRYABLE_FROM = frozenset({JobState.RETRYABLE, JobState.SCHEDULED, *FINISHED_STATES})


@dataclass(frozen=True, slots=True)
class Filter:
    ids: list[int] = field(default_factory=list)
    queue: str | None = None
    worker: str | None = None
    tag: str | None = None
    state: JobState | None = None

    def is_empty(self) -> bool:
        return not (self.ids or self.queue or self.worker or self.tag or self.state)

    def where(self) -> tuple[sql.Composable, dict[str, Any]]:
        parts: list[sql.Composable] = []
        params: dict[str, Any] = {}
        if self.ids:
            parts.append(sql.SQL("id = ANY(%(ids)s)"))
            params["ids"] = list(self.ids)
        if self.queue:
            parts.append(sql.SQL("queue = %(queue)s"))
            params["queue"] = self.queue
        if self.worker:
            # The full name, or its last part(s): `send_welcome` finds myapp.workers.send_welcome.
            parts.append(sql.SQL(
                "(worker = %(worker)s OR right(worker, %(worker_len)s) = '.' || %(worker)s)"
            ))  # fmt: skip
            params["worker"] = self.worker
            params["worker_len"] = len(self.worker) + 1
        if self.tag:
            parts.append(sql.SQL("tags @> ARRAY[%(tag)s]::text[]"))
            params["tag"] = self.tag
        if self.state:
            parts.append(sql.SQL("state = %(state)s"))
            params["state"] = str(self.state)
        return sql.SQL(" AND ").join(parts), params


def _filter(
    ids: Iterable[int] | None, queue: str | None, worker: str | None, tag: str | None,
    state: str | None,
) -> Filter:  # fmt: skip
    try:
        parsed_state = JobState(state) if state else None
    except ValueError:
        raise ValidationError(
            "state", f"{state!r} is not a job state; use one of {', '.join(JobState)}"
        ) from None
    f = Filter(ids=list(ids or []), queue=queue, worker=worker, tag=tag, state=parsed_state)
    if f.is_empty():
        raise ValidationError(
            "filter",
            "give at least one of ids, queue, worker, tag, state (to act on all jobs "
            "of a state, pass state= explicitly)",
        )
    return f


def retry_by(
    *,
    ids: Iterable[int] | None = None,
    queue: str | None = None,
    worker: str | None = None,
    tag: str | None = None,
    state: str | None = None,
    dry_run: bool = False,
    database_url: str | None = None,
    schema: str | None = None,
) -> list[int]:
    """Make matching jobs available now (retryable, scheduled or finished ones); returns ids.

    A job whose attempts are used up gets one more: it runs once and, failing again, is
    discarded again. With `dry_run=True` nothing changes: the ids are those it would retry.
    """
    f = _filter(ids, queue, worker, tag, state)
    stmts = statements.statements(config.schema(schema))
    if dry_run:
        return _matching(f, RETRYABLE_FROM, stmts, database_url)
    where, params = f.where()
    query = sql.SQL(
        "UPDATE {jobs} SET state = 'available', scheduled_at = now(), finished_at = NULL,"
        " completed_at = NULL,"
        " max_attempts = CASE WHEN max_attempts IS NOT NULL AND attempt >= max_attempts"
        "                     THEN attempt + 1 ELSE max_attempts END"
        " WHERE state = ANY(%(from)s) AND {where}"
        " RETURNING id, queue"
    ).format(jobs=stmts.jobs_table, where=where)
    params["from"] = sorted(RETRYABLE_FROM)
    pool = database.sync_pool(config.database_url(database_url))
    with pool.connection() as conn, conn.transaction():
        rows = conn.execute(query, params).fetchall()
        queues = sorted({r[1] for r in rows})
        if queues:
            conn.execute(stmts.notify_queues, {"queues": queues})
    return sorted(r[0] for r in rows)


def cancel_by(
    *,
    ids: Iterable[int] | None = None,
    queue: str | None = None,
    worker: str | None = None,
    tag: str | None = None,
    state: str | None = None,
    reason: str = "cancelled by operator",
    dry_run: bool = False,
    database_url: str | None = None,
    schema: str | None = None,
) -> list[int]:
    """Cancel matching unfinished jobs; executing ones are also stopped on their runner.

    With `dry_run=True` nothing changes: the ids are those it would cancel.
    """
    f = _filter(ids, queue, worker, tag, state)
    schema_name = config.schema(schema)
    stmts = statements.statements(schema_name)
    if dry_run:
        return _matching(f, CANCELLABLE_STATES, stmts, database_url)
    where, params = f.where()
    query = sql.SQL(
        "UPDATE {jobs} SET state = 'cancelled', finished_at = now(),"
        " errors = errors || jsonb_build_array(jsonb_build_object("
        "   'attempt', attempt, 'at', now(), 'error', %(reason)s::text, 'traceback', ''))"
        " WHERE state = ANY(%(from)s) AND {where}"
        " RETURNING id"
    ).format(jobs=stmts.jobs_table, where=where)
    params["from"] = sorted(CANCELLABLE_STATES)
    params["reason"] = f"Cancelled: {reason}"
    pool = database.sync_pool(config.database_url(database_url))
    with pool.connection() as conn, conn.transaction():
        ids_done = sorted(r[0] for r in conn.execute(query, params).fetchall())
        if ids_done:
            # Runners executing any of these stop the perform; others ignore the notice.
            conn.execute(
                "SELECT pg_notify(%s, %s || '.' || i) FROM unnest(%s::bigint[]) AS i",
                (statements.CANCEL_CHANNEL, schema_name, ids_done),
            )
    return ids_done


def _matching(
    f: Filter, states: Iterable[JobState], stmts: statements.Statements, database_url: str | None
) -> list[int]:
    where, params = f.where()
    query = sql.SQL("SELECT id FROM {jobs} WHERE state = ANY(%(from)s) AND {where} ORDER BY id")
    params["from"] = sorted(states)
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        rows = conn.execute(query.format(jobs=stmts.jobs_table, where=where), params).fetchall()
    return [r[0] for r in rows]


def explain_no_match(
    action: str,
    *,
    ids: Iterable[int] | None = None,
    queue: str | None = None,
    worker: str | None = None,
    tag: str | None = None,
    state: str | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> str:
    """Why `retry_by` / `cancel_by` (`action` "retry" or "cancel") matched nothing: no job
    fits the filters at all, or the ones that do are in states the action leaves alone."""
    f = _filter(ids, queue, worker, tag, state)
    stmts = statements.statements(config.schema(schema))
    where, params = f.where()
    query = sql.SQL("SELECT state, count(*) FROM {jobs} WHERE {where} GROUP BY state ORDER BY 1")
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        found = conn.execute(query.format(jobs=stmts.jobs_table, where=where), params).fetchall()
    acts_on = RETRYABLE_FROM if action == "retry" else CANCELLABLE_STATES
    if not found:
        if worker:
            return (f"no job has worker {worker!r} (nor a name ending in '.{worker}') with these "
                    "filters; `shigoto status` lists the queues")  # fmt: skip
        return "no job matches these filters"
    counts = ", ".join(f"{n} {s}" for s, n in found)
    return (
        f"the jobs that match are {counts}; {action} acts only on "
        f"{', '.join(sorted(str(s) for s in acts_on))} jobs"
    )


@dataclass(frozen=True, slots=True)
class Status:
    counts: dict[str, dict[str, int]]
    oldest_available_age: dict[str, float]
    nodes: list[dict[str, Any]]
    cron: list[dict[str, Any]] = field(default_factory=list)
    #: Shared settings by queue: {"paused": bool, "global_concurrency": int | None}.
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def setting(self, queue: str) -> dict[str, Any]:
        return self.settings.get(queue, {"paused": False, "global_concurrency": None})

    def as_dict(self) -> dict[str, Any]:
        return {
            "queues": {
                q: {
                    "counts": self.counts.get(q, {s.value: 0 for s in JobState}),
                    "oldest_available_age": self.oldest_available_age.get(q),
                    **self.setting(q),
                }
                for q in sorted(self.counts.keys() | self.settings.keys())
            },
            "nodes": self.nodes,
            "cron": self.cron,
        }


def _status(conn: psycopg.Connection[Any], stmts: statements.Statements) -> Status:
    counts: dict[str, dict[str, int]] = {}
    for queue, state, count in conn.execute(stmts.counts).fetchall():
        counts.setdefault(queue, {s.value: 0 for s in JobState})[state] = int(count)
    ages = {q: float(a) for q, a in conn.execute(stmts.oldest_available).fetchall()}
    nodes = []
    for row in conn.execute(stmts.nodes).fetchall():
        node_id, host, pid, queues, started, seen, silent = row
        nodes.append({
            "id": node_id, "hostname": host, "pid": pid, "queues": queues,
            "started_at": started.isoformat(), "last_seen_at": seen.isoformat(),
            "silent_for": round(float(silent), 3),
        })  # fmt: skip
    return Status(counts, ages, nodes, _cron_entries(conn, stmts.schema),
                  _queue_settings(conn, stmts.schema))  # fmt: skip


def _queue_settings(conn: psycopg.Connection[Any], schema: str) -> dict[str, dict[str, Any]]:
    """Queues that are paused or globally limited; queues at their defaults are left out."""
    query = sql.SQL(
        "SELECT name, paused, global_concurrency FROM {} "
        "WHERE paused OR global_concurrency IS NOT NULL ORDER BY name"
    ).format(sql.Identifier(schema, "shigoto_queues"))
    return {
        name: {"paused": paused, "global_concurrency": limit}
        for name, paused, limit in conn.execute(query)
    }


def _cron_entries(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    """Each schedule with its next slot; an invalid stored expression shows as such."""
    from shigoto.cron import expression

    query = sql.SQL(
        "SELECT name, expression, timezone, worker, queue, enabled, last_slot_at, last_job_id,"
        " now() FROM {} ORDER BY name"
    ).format(sql.Identifier(schema, "shigoto_cron"))
    entries = []
    for name, expr, tz, worker, queue, enabled, last, last_job, now in conn.execute(query):
        try:
            upcoming = expression.parse(expr, tz).next_after(now).isoformat() if enabled else None
        except ValidationError:
            upcoming = "invalid expression"
        entries.append({
            "name": name, "schedule": expr, "timezone": tz, "worker": worker, "queue": queue,
            "enabled": enabled, "last_slot_at": last.isoformat() if last else None,
            "last_job_id": last_job, "next_slot_at": upcoming,
        })  # fmt: skip
    return entries


def status(*, database_url: str | None = None, schema: str | None = None) -> Status:
    """Counts by queue and state, age of the oldest available job per queue, live nodes."""
    stmts = statements.statements(config.schema(schema))
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        return _status(conn, stmts)


#: A node that has not heartbeat for this long (seconds) counts as gone when judging stale jobs.
DEFAULT_STALE_AFTER = 90.0
#: A queue whose oldest available job waited longer than this (seconds) is reported degraded.
DEFAULT_BACKLOG_WARNING = 300.0
#: How long (seconds) `health()` waits for a connection; the pool's own default is 30 s, too
#: long for a probe to learn that the database is down.
DEFAULT_HEALTH_TIMEOUT = 5.0


def health(
    *,
    database_url: str | None = None,
    schema: str | None = None,
    stale_after: float = DEFAULT_STALE_AFTER,
    backlog_warning: float = DEFAULT_BACKLOG_WARNING,
    timeout: float = DEFAULT_HEALTH_TIMEOUT,
) -> dict[str, Any]:
    """A health report: database pool, job counts, stale executing jobs, per-queue health.

    An unreachable database is reported as unhealthy within `timeout` seconds.
    """
    stmts = statements.statements(config.schema(schema))
    url = config.database_url(database_url)
    try:
        pool = database.sync_pool(url)  # connects once at first use: may fail too
        with pool.connection(timeout=timeout) as conn:
            st = _status(conn, stmts)
            stale = conn.execute(stmts.stale_executing, {"stale_after": stale_after}).fetchall()
    except psycopg.Error as exc:
        return {"status": "unhealthy", "database": {"reachable": False, "error": str(exc)}}
    queues = {}
    for queue, counts in st.counts.items():
        age = st.oldest_available_age.get(queue)
        queues[queue] = {
            "status": "degraded" if age is not None and age > backlog_warning else "ok",
            "counts": counts,
            "oldest_available_age": age,
        }
    stats = pool.get_stats()
    stale_jobs = [
        {"id": r[0], "queue": r[1], "worker": r[2], "node": r[3], "attempted_at": r[4].isoformat()}
        for r in stale
    ]
    degraded = stale_jobs or any(q["status"] != "ok" for q in queues.values())
    return {
        "status": "degraded" if degraded else "ok",
        "database": {"reachable": True},
        "pool": {k: stats.get(k) for k in ("pool_size", "pool_available", "requests_waiting")},
        "queues": queues,
        "stale_jobs": stale_jobs,
        "nodes": st.nodes,
    }


def prune(
    *,
    prune_after: float | None = None,
    archive_retention: float | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> dict[str, int]:
    """Run the pruner once, now: finished jobs older than `prune_after` seconds (default 14
    days) move to the archive; archived ones older than `archive_retention` (default 30 days)
    are deleted. Returns {"archived": n, "deleted": m}. Runners do this hourly on their own."""
    from shigoto import telemetry
    from shigoto.runtime.pruner import PRUNE_BATCH

    defaults = config.RunnerSettings()
    after = defaults.prune_after if prune_after is None else prune_after
    keep = defaults.archive_retention if archive_retention is None else archive_retention
    for name, value in (("prune_after", after), ("archive_retention", keep)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValidationError(name, f"must be zero or more seconds, got {value!r}")
    stmts = statements.statements(config.schema(schema))
    done = {"archived": 0, "deleted": 0}
    started = time.monotonic()
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        for key, statement, age in (("archived", stmts.archive, after),
                                    ("deleted", stmts.delete_archived, keep)):  # fmt: skip
            while True:
                count = conn.execute(statement, {"after": age, "limit": PRUNE_BATCH}).rowcount
                done[key] += count
                if count < PRUNE_BATCH:
                    break
    telemetry.emit("pruner.prune", {"duration": time.monotonic() - started, **done},
                   {"node": "shigoto prune"})  # fmt: skip
    return done
