"""Operating a queue from code or the CLI: status, health, retry and cancel in bulk.

Filters combine with AND; at least one is required for retry/cancel so a typo can never touch
every job in the table.

Telemetry (docs/telemetry.md): `operator.cancel` once per `cancel_by` that changed the table
(not for a dry run), after its transaction committed, in the calling process; `pruner.prune`
for a `prune` run from here. A job cancelled while it executed is also reported by its runner,
as `job.cancel` with `source: "operator"`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from shigoto import config, telemetry
from shigoto.client.job_filters import expand_states, worker_condition
from shigoto.cron import coverage as cron_coverage
from shigoto.db import database, migrate, ops_statements, steps
from shigoto.db import runtime_statements as statements
from shigoto.db.steps import Steps
from shigoto.errors import ValidationError
from shigoto.job import CANCELLABLE_STATES, FINISHED_STATES, JobState
from shigoto.relations import workflows

#: Most workflows `status` lists (the oldest with work left); the rest are only counted in
#: `waiting_on_parents` and the queues' counts.
STATUS_WORKFLOWS = 20
#: Most pending cancel requests `status` lists (the oldest first).
STATUS_CANCELLING = 20
#: States `retry_by` acts on when given one as `state=`: anything not already waiting to run
#: or running.
RETRYABLE_FROM = frozenset({JobState.RETRYABLE, JobState.SCHEDULED, *FINISHED_STATES})
#: States `retry_by` acts on without `state=`: the failed ones. A completed job did its work
#: (re-running it may charge a card twice), and a retryable or scheduled one runs by itself when
#: its time comes; each is retried only when its state is named.
RETRY_DEFAULT_FROM = frozenset({JobState.DISCARDED, JobState.CANCELLED})


@dataclass(frozen=True, slots=True)
class Filter:
    """Conditions combined with AND. `worker` follows `job_filters.worker_condition` (the full
    name or the last dotted part, as everywhere); `state` is one state or the alias "failed"
    (`job_filters.FAILED`), as given, and `states` the states it stands for."""

    ids: list[int] = field(default_factory=list)
    queue: str | None = None
    worker: str | None = None
    tag: str | None = None
    state: str | None = None

    @property
    def states(self) -> frozenset[JobState]:
        return frozenset(JobState(s) for s in expand_states([self.state] if self.state else []))

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
            condition, worker_params = worker_condition(self.worker)
            parts.append(sql.SQL(condition))
            params.update(worker_params)
        if self.tag:
            # The second half is the tags index's predicate (migration 0022).
            parts.append(sql.SQL("tags @> ARRAY[%(tag)s]::text[] AND cardinality(tags) > 0"))
            params["tag"] = self.tag
        if self.state:
            parts.append(sql.SQL("state = ANY(%(states)s)"))
            params["states"] = sorted(str(s) for s in self.states)
        return sql.SQL(" AND ").join(parts), params


def _filter(
    ids: Iterable[int] | None, queue: str | None, worker: str | None, tag: str | None,
    state: str | None,
) -> Filter:  # fmt: skip
    if state:
        expand_states([state])  # a ValidationError naming the states and the alias accepted
    f = Filter(ids=list(ids or []), queue=queue, worker=worker, tag=tag, state=state or None)
    if f.is_empty():
        raise ValidationError(
            "filter",
            "give at least one of ids, queue, worker, tag, state (to act on all jobs "
            "of a state, pass state= explicitly)",
        )
    return f


def retry_from(f: Filter) -> frozenset[JobState]:
    """The states a retry with filter `f` may take: those of a named state (the filter itself
    narrows them to it), else only discarded and cancelled jobs."""
    return RETRYABLE_FROM if f.state else RETRY_DEFAULT_FROM


def _retry_steps(f: Filter, schema: str) -> Steps[list[int]]:
    where, params = f.where()
    done = yield ops_statements.with_filter(ops_statements.RETRY, schema, where), {
        **params, "from": sorted(retry_from(f))
    }
    queues = sorted({row[1] for row in done.rows})
    if queues:
        yield statements.statements(schema).notify_queues, {"queues": queues}
    return sorted(row[0] for row in done.rows)


def cancel_steps(f: Filter, schema: str, reason: str) -> Steps[list[int]]:
    """`cancel_by`'s statements, for callers that cancel inside a transaction of theirs
    (`ops.queues.delete_queue`)."""
    where, params = f.where()
    done = yield ops_statements.with_filter(ops_statements.CANCEL, schema, where), {
        **params, "from": sorted(CANCELLABLE_STATES), "reason": f"Cancelled: {reason}",
        "why": reason,
    }
    ids = sorted(row[0] for row in done.rows)
    # Only running jobs have a runner to tell; the others are cancelled already.
    requested = sorted(row[0] for row in done.rows if row[1])
    if requested:
        yield ops_statements.NOTIFY_CANCELLED, {
            "channel": statements.CANCEL_CHANNEL, "schema": schema, "ids": requested
        }
    return ids


def _matching_steps(
    f: Filter, statement: str, states: Iterable[JobState], schema: str
) -> Steps[list[int]]:
    where, params = f.where()
    found = yield ops_statements.with_filter(statement, schema, where), {
        **params, "from": sorted(states)
    }
    return [row[0] for row in found.rows]


def _bulk_steps(
    action: str, f: Filter, schema: str, dry_run: bool, reason: str = ""
) -> Steps[list[int]]:
    if dry_run:  # the same condition as the change, so a dry run lists exactly what it takes
        if action == "retry":
            return _matching_steps(f, ops_statements.RETRY_MATCHING, retry_from(f), schema)
        return _matching_steps(f, ops_statements.MATCHING, CANCELLABLE_STATES, schema)
    return _retry_steps(f, schema) if action == "retry" else cancel_steps(f, schema, reason)


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
    """Make matching jobs available now; returns their ids.

    Without `state=` only discarded and cancelled jobs are taken: a completed job is re-run
    only when asked for by `state="completed"` (it did its work once), and a retryable or
    scheduled one (which will run by itself) only by its own state. Never a job waiting on a
    parent that has not finished (a workflow child, however it is named, or a child whose
    parent this same retry re-runs): it runs when its parents have. A job whose attempts are
    used up gets one more: it runs once and, failing again, is discarded again. With
    `dry_run=True` nothing changes: the ids are those it would retry.
    """
    work = _bulk_steps("retry", _filter(ids, queue, worker, tag, state), config.schema(schema),
                       dry_run)  # fmt: skip
    with _sync_transaction(database_url) as conn:
        return steps.run(conn, work)


async def aretry_by(
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
    """`retry_by` for asyncio: the same statements on an async connection."""
    work = _bulk_steps("retry", _filter(ids, queue, worker, tag, state), config.schema(schema),
                       dry_run)  # fmt: skip
    async with _async_transaction(database_url) as conn:
        return await steps.arun(conn, work)


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
    """Cancel matching unfinished jobs; returns their ids.

    A job that is not running is `cancelled` at once. An executing one is asked to stop: its
    row records the request (`cancel_requested_at`) and stays `executing` until its runner has
    stopped the perform and written `cancelled`, so no new attempt can start beside the one
    still running, and batches, forwarding, workflow children and unique keys see the cancel
    only once the work has stopped (docs/workers.md, "Cancelling a running job").
    With `dry_run=True` nothing changes: the ids are those it would cancel.
    """
    f = _filter(ids, queue, worker, tag, state)
    work = _bulk_steps("cancel", f, config.schema(schema), dry_run, reason)
    started = time.monotonic()
    with _sync_transaction(database_url) as conn:
        cancelled = steps.run(conn, work)
    if not dry_run:
        _cancelled(cancelled, f, reason, config.schema(schema), started)
    return cancelled


async def acancel_by(
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
    """`cancel_by` for asyncio: the same statements on an async connection."""
    f = _filter(ids, queue, worker, tag, state)
    work = _bulk_steps("cancel", f, config.schema(schema), dry_run, reason)
    started = time.monotonic()
    async with _async_transaction(database_url) as conn:
        cancelled = await steps.arun(conn, work)
    if not dry_run:
        _cancelled(cancelled, f, reason, config.schema(schema), started)
    return cancelled


def _cancelled(ids: list[int], f: Filter, reason: str, schema: str, started: float) -> None:
    """Announce a committed `cancel_by`: the jobs an operator took away, executing or not
    (waiting ones are never seen by a runner, so this is the only trace they leave)."""
    given = {"ids": list(f.ids), "queue": f.queue, "worker": f.worker, "tag": f.tag,
             "state": f.state}  # fmt: skip
    telemetry.emit(
        "operator.cancel", {"count": len(ids), "duration": time.monotonic() - started},
        {"job_ids": ids, "reason": reason, "schema": schema,
         "filter": {k: v for k, v in given.items() if v}},
    )  # fmt: skip


@contextlib.contextmanager
def _sync_transaction(database_url: str | None) -> Iterator[psycopg.Connection[Any]]:
    pool = database.sync_pool(config.database_url(database_url))
    with pool.connection() as conn, conn.transaction():
        yield conn


@contextlib.asynccontextmanager
async def _async_transaction(
    database_url: str | None,
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as conn, conn.transaction():
        yield conn


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
    fits the filters at all, or the ones that do are in states the action leaves alone, or (a
    retry) they wait on parents that have not finished. What a retry leaves alone by default
    is said with the way to ask for it: completed jobs only when their state is named."""
    f = _filter(ids, queue, worker, tag, state)
    where, params = f.where()
    query = ops_statements.with_filter(
        ops_statements.MATCHING_BY_STATE, config.schema(schema), where
    )
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        found = conn.execute(query, params).fetchall()
    acts_on = retry_from(f) if action == "retry" else CANCELLABLE_STATES
    if not found:
        if worker:
            also = "" if "." in worker else f" (nor a name ending in '.{worker}')"
            return (f"no job has worker {worker!r}{also} with these filters (a worker is its "
                    "full name or its last dotted part); `shigoto status` lists the "
                    "queues")  # fmt: skip
        return "no job matches these filters"
    counts = ", ".join(f"{n} {s}" for s, n, _ in found)
    states = ", ".join(sorted(str(s) for s in acts_on))
    if action != "retry":
        return f"the jobs that match are {counts}; {action} acts only on {states} jobs"
    why = [f"the jobs that match are {counts}"]
    waiting = sum(w for _, _, w in found)
    if waiting:
        verb = "depends" if waiting == 1 else "depend"
        why.append(f"{waiting} of them {verb} on parent jobs that have not finished, and no "
                   "retry starts a job before its parents (a waiting child runs once they "
                   "have; retry the others then)")  # fmt: skip
    if f.state is None:
        why.append(f"without a state, retry takes only {states} jobs")
        if any(s == JobState.COMPLETED for s, _, _ in found):
            why.append("to re-run completed jobs, name their state: state='completed' "
                       "(CLI: --state completed)")  # fmt: skip
    elif not f.states & acts_on:
        why.append(f"retry acts only on {states} jobs")
    return "; ".join(why)


#: A queue's shared settings when it has no settings row (shigoto.client.queue_settings).
DEFAULT_SETTING: dict[str, Any] = {
    "paused": False, "global_concurrency": None, "forward": None, "fanout": False,
    "fair": False, "weight": 1, "partition_concurrency": None, "rate_limit": None,
}  # fmt: skip
#: Most circuit breakers `status` lists (those not closed); a fleet-wide outage opens many.
STATUS_BREAKERS = 50


@dataclass(frozen=True, slots=True)
class Status:
    """What `shigoto status` shows. Counts never read the finished rows a busy table is mostly
    made of: live states are exact (their partial indexes); finished states are exact while the
    live table holds at most `ops_statements.FINISHED_EXACT_LIMIT` finished rows, and
    estimates from the table's statistics past that (`exact` says which).
    `finished_last_hour` is what the stats sampler recorded (shigoto.runtime.sampler): exact,
    for the minutes a runner sampled."""

    counts: dict[str, dict[str, int]]
    oldest_available_age: dict[str, float]
    nodes: list[dict[str, Any]]
    cron: list[dict[str, Any]] = field(default_factory=list)
    #: Shared settings by queue, for the queues with one away from its default:
    #: {"paused": bool, "global_concurrency": int | None, "forward": {state: queue} | None,
    #: "fanout": bool}.
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Builder workflows with work left, oldest first: {"id", "name", "total", "completed",
    #: "failed" (discarded or cancelled), "waiting" (for a parent), "executing"}.
    workflows: list[dict[str, Any]] = field(default_factory=list)
    #: Jobs waiting for a parent to finish (workflow steps and plain `depends_on` jobs).
    waiting_on_parents: int = 0
    #: Circuit breakers not closed: {"worker", "partition_key", "status" (open | half_open),
    #: "blocked_until", "since"} (docs/flow-control.md).
    breakers: list[dict[str, Any]] = field(default_factory=list)
    #: Whether the finished counts (completed, discarded, cancelled) are exact; False: they
    #: are estimates (the table holds more finished rows than status counts one by one).
    finished_exact: bool = True
    #: Jobs finished in the last hour by queue, from the sampler's per-minute stats:
    #: {"completed", "discarded", "cancelled", "minutes" (how many minutes were sampled)}.
    finished_last_hour: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Executing jobs an operator asked to cancel whose perform has not stopped yet, oldest
    #: request first: {"id", "queue", "worker", "node", "since"}.
    cancelling: list[dict[str, Any]] = field(default_factory=list)
    #: Migrations this code has that the database lacks, oldest first: {"version", "name",
    #: "steps", "steps_done"} (steps done so far by an upgrade under way or interrupted).
    pending_migrations: list[dict[str, Any]] = field(default_factory=list)

    def setting(self, queue: str) -> dict[str, Any]:
        return self.settings.get(queue, dict(DEFAULT_SETTING))

    def exact(self, state: str) -> bool:
        """Whether the counts of `state` are exact (live states always are)."""
        return self.finished_exact or JobState(state) not in FINISHED_STATES

    def as_dict(self) -> dict[str, Any]:
        exact = {s.value: self.exact(s.value) for s in JobState}
        return {
            "queues": {
                q: {
                    "counts": self.counts.get(q, {s.value: 0 for s in JobState}),
                    "exact": exact,
                    "finished_last_hour": self.finished_last_hour.get(q),
                    "oldest_available_age": self.oldest_available_age.get(q),
                    **self.setting(q),
                }
                for q in sorted(self.counts.keys() | self.settings.keys())
            },
            "nodes": self.nodes,
            "cron": self.cron,
            "workflows": self.workflows,
            "waiting_on_parents": self.waiting_on_parents,
            "breakers": self.breakers,
            "cancelling": self.cancelling,
            "pending_migrations": self.pending_migrations,
        }


@dataclass(slots=True)
class _Counts:
    by_queue: dict[str, dict[str, int]] = field(default_factory=dict)
    ages: dict[str, float] = field(default_factory=dict)
    exact: bool = True
    last_hour: dict[str, dict[str, int]] = field(default_factory=dict)

    def of(self, queue: str) -> dict[str, int]:
        return self.by_queue.setdefault(queue, {s.value: 0 for s in JobState})


def _counts_steps(schema: str) -> Steps[_Counts]:
    """Counts by queue and state without a scan of the finished rows (issue 14): live states
    by their partial indexes; finished ones counted from at most FINISHED_EXACT_LIMIT + 1 of
    the newest (all of them, when there are no more), else estimated from table statistics."""
    out = _Counts()
    for queue, state, count, age in (
        yield ops_statements.compose(ops_statements.LIVE_COUNTS, schema), None
    ).rows:
        out.of(queue)[state] = int(count)
        if state == JobState.AVAILABLE and age is not None:
            out.ages[queue] = float(age)
    finished = (yield ops_statements.compose(ops_statements.FINISHED_COUNTS, schema),
                {"limit": ops_statements.FINISHED_EXACT_LIMIT + 1}).rows  # fmt: skip
    if sum(int(row[2]) for row in finished) <= ops_statements.FINISHED_EXACT_LIMIT:
        for queue, state, count in finished:
            out.of(queue)[state] = int(count)
    else:
        out.exact = False
        queues = [row[0] for row in (
            yield ops_statements.compose(ops_statements.JOB_QUEUES, schema), None
        ).rows]  # fmt: skip
        if queues:
            for queue, estimates in (yield from _estimates_steps(schema, queues)).items():
                out.of(queue).update(estimates)
    for queue, completed, discarded, cancelled, minutes in (
        yield ops_statements.compose(ops_statements.FINISHED_LAST_HOUR, schema), None
    ).rows:
        out.last_hour[queue] = {"completed": int(completed), "discarded": int(discarded),
                                "cancelled": int(cancelled), "minutes": int(minutes)}  # fmt: skip
    return out


def _estimates_steps(schema: str, queues: list[str]) -> Steps[dict[str, dict[str, int]]]:
    """Finished counts by queue, estimated from the table's statistics (the planner's, by
    EXPLAIN, when the table has none yet)."""
    stats = (yield ops_statements.TABLE_STATS, {"schema": schema}).rows
    estimates = ops_statements.estimate_finished(stats, queues)
    if estimates is None:
        explain, params = ops_statements.finished_estimate(schema, queues)
        plan = (yield explain, params).one()
        assert plan is not None
        estimates = ops_statements.plan_rows(plan[0], queues)
    return estimates


def _status_steps(schema: str) -> Steps[Status]:
    stmts = statements.statements(schema)
    counted = yield from _counts_steps(schema)
    # What each node leads: the leases carry the node id of its heartbeat row.
    leads = dict((yield ops_statements.compose(cron_coverage.LEASES_BY_NODE, schema), None).rows)
    nodes = []
    for row in (yield stmts.nodes, None).rows:
        node_id, host, pid, queues, started, seen, silent = row
        nodes.append({
            "id": node_id, "hostname": host, "pid": pid, "queues": queues,
            "started_at": started.isoformat(), "last_seen_at": seen.isoformat(),
            "silent_for": round(float(silent), 3),
            "leader": node_id in leads, "leads": list(leads.get(node_id) or []),
        })  # fmt: skip
    # Queues at their defaults are left out of the settings.
    settings = {
        name: {"paused": paused, "global_concurrency": limit, "forward": forward,
               "fanout": fanout, "fair": fair, "weight": weight,
               "partition_concurrency": per_partition, "rate_limit": rate_limit}
        for name, paused, limit, forward, fanout, fair, weight, per_partition, rate_limit in (
            yield ops_statements.compose(ops_statements.SETTINGS_IN_FORCE, schema), None
        ).rows
    }  # fmt: skip
    breakers = [
        {"worker": worker, "partition_key": partition, "status": state,
         "blocked_until": until.isoformat() if until else None, "since": since.isoformat()}
        for worker, partition, state, until, since in (
            yield ops_statements.compose(ops_statements.BREAKERS_NOT_CLOSED, schema),
            {"limit": STATUS_BREAKERS},
        ).rows
    ]  # fmt: skip
    cron = _cron_entries((yield ops_statements.compose(ops_statements.CRON_ENTRIES, schema),
                          None).rows)  # fmt: skip
    # A schedule no live process fires (no cron lease held) is marked, as on the dashboard.
    _enabled, schedulers = (yield ops_statements.compose(cron_coverage.COVERAGE, schema),
                           cron_coverage.coverage_params()).one() or ([], [])  # fmt: skip
    for entry in cron:
        entry["unscheduled"] = bool(entry["enabled"] and not schedulers)
    flows = (yield ops_statements.compose(ops_statements.STATUS_WORKFLOWS, schema),
             {"limit": STATUS_WORKFLOWS}).dicts()  # fmt: skip
    waiting = (yield statements.compose(workflows.WAITING_COUNT, schema), None).one()
    cancelling = [
        {"id": job_id, "queue": queue, "worker": worker, "node": node, "since": since.isoformat()}
        for job_id, queue, worker, node, since in (
            yield ops_statements.compose(ops_statements.CANCELLING, schema),
            {"limit": STATUS_CANCELLING},
        ).rows
    ]  # fmt: skip
    pending = yield from migrate.pending_steps(schema)
    return Status(counted.by_queue, counted.ages, nodes, cron, settings,
                  [{k: v if k in ("id", "name") else int(v) for k, v in f.items()} for f in flows],
                  int(waiting[0]) if waiting else 0, breakers, counted.exact,
                  counted.last_hour, cancelling, pending)  # fmt: skip


def _cron_entries(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Each schedule with its next slot; an invalid stored expression shows as such."""
    from shigoto.cron import expression

    entries = []
    for name, expr, tz, worker, queue, enabled, last, last_job, now in rows:
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
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        return steps.run(conn, _status_steps(config.schema(schema)))


async def astatus(*, database_url: str | None = None, schema: str | None = None) -> Status:
    """`status` for asyncio: the same statements on an async connection."""
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as conn:
        return await steps.arun(conn, _status_steps(config.schema(schema)))


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
            st = steps.run(conn, _status_steps(stmts.schema))
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


def _prune_steps(after: float, keep: float, schema: str) -> Steps[dict[str, int]]:
    from shigoto.runtime.pruner import PRUNE_BATCH

    stmts = statements.statements(schema)
    done = {"archived": 0, "deleted": 0}
    for key, statement, age in (("archived", stmts.archive, after),
                                ("deleted", stmts.delete_archived, keep)):  # fmt: skip
        while True:
            count = (yield statement, {"after": age, "limit": PRUNE_BATCH}).rowcount
            done[key] += count
            if count < PRUNE_BATCH:
                break
    return done


def _prune_ages(prune_after: float | None, archive_retention: float | None) -> tuple[float, float]:
    defaults = config.RunnerSettings()
    after = defaults.prune_after if prune_after is None else prune_after
    keep = defaults.archive_retention if archive_retention is None else archive_retention
    for name, value in (("prune_after", after), ("archive_retention", keep)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValidationError(name, f"must be zero or more seconds, got {value!r}")
    return after, keep


def _pruned(done: dict[str, int], started: float) -> dict[str, int]:
    telemetry.emit("pruner.prune", {"duration": time.monotonic() - started, **done},
                   {"node": "shigoto prune"})  # fmt: skip
    return done


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
    after, keep = _prune_ages(prune_after, archive_retention)
    started = time.monotonic()
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        done = steps.run(conn, _prune_steps(after, keep, config.schema(schema)))
    return _pruned(done, started)


async def aprune(
    *,
    prune_after: float | None = None,
    archive_retention: float | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> dict[str, int]:
    """`prune` for asyncio: the same statements on an async connection."""
    after, keep = _prune_ages(prune_after, archive_retention)
    started = time.monotonic()
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as conn:
        done = await steps.arun(conn, _prune_steps(after, keep, config.schema(schema)))
    return _pruned(done, started)
