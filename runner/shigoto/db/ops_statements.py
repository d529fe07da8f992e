"""The statements of operating a queue: bulk retry and cancel, status, queue settings, the
operator's counts and the test helpers' queries.

Templates name tables as `{jobs}`, `{queues}`, `{cron}`, `{nodes}`, `{breakers}`, `{stats}` and
are composed per schema
with `psycopg.sql.Identifier`; the filter of retry and cancel arrives as a composed `{where}`
built from placeholders only, so no value is ever formatted into SQL text.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from shigoto.job import JobState


def _tables(schema: str) -> dict[str, sql.Identifier]:
    return {
        "jobs": sql.Identifier(schema, "shigoto_jobs"),
        "archive": sql.Identifier(schema, "shigoto_jobs_archive"),
        "queues": sql.Identifier(schema, "shigoto_queues"),
        "cron": sql.Identifier(schema, "shigoto_cron"),
        "nodes": sql.Identifier(schema, "shigoto_nodes"),
        "breakers": sql.Identifier(schema, "shigoto_breakers"),
        "stats": sql.Identifier(schema, "shigoto_stats"),
        "leaders": sql.Identifier(schema, "shigoto_leaders"),
    }


@functools.cache
def compose(template: str, schema: str) -> sql.Composed:
    """`template` with its table names filled in for `schema` (cached: schemas are few)."""
    return sql.SQL(template).format(**_tables(schema))


def with_filter(template: str, schema: str, where: sql.Composable) -> sql.Composed:
    """A bulk statement with the caller's composed filter in `{where}`."""
    return sql.SQL(template).format(where=where, **_tables(schema))


# Whether a job waits on a parent that has not finished, so that a retry must leave it where it
# is: a workflow child waiting for its parents (migration 0009 marks it `scheduled` at
# 9999-12-31; only its parents' final transitions may release it), or a child with a parent
# still live in any other state (cancelled by hand while it waited; finished, and its parent
# retried since). Made available now, it would run before its parents, or beside them, without
# their results. `{{jobs}}.depends_on` is the outer row: the inner table is aliased `p`. The
# scalar subquery runs per child by primary key (as in migration 0009's release).
_WAITS_ON_PARENTS = """(depends_on IS NOT NULL AND (
    (state = 'scheduled' AND scheduled_at = '9999-12-31 00:00:00+00')
    OR coalesce((SELECT bool_or(p.state NOT IN ('completed', 'discarded', 'cancelled'){also})
                 FROM {{jobs}} AS p WHERE p.id = ANY({{jobs}}.depends_on)), false)))"""

WAITS_ON_PARENTS = _WAITS_ON_PARENTS.format(also="")

# What a retry may take: a job in the states asked for that matches the filter, unless it waits
# on a parent, including a parent this same retry makes available again (a failed workflow
# retried as a whole reruns its parent; its cancelled child waits for the next retry). Inside
# the subquery the filter's bare column names are the parent's.
RETRY_CANDIDATE = "state = ANY(%(from)s) AND {where} AND NOT " + _WAITS_ON_PARENTS.format(
    also=" OR (p.state = ANY(%(from)s) AND {where})"
)

# A retried job whose attempts are used up gets exactly one more.
RETRY = """
UPDATE {jobs}
SET state = 'available', scheduled_at = now(), finished_at = NULL, completed_at = NULL,
    max_attempts = CASE WHEN max_attempts IS NOT NULL AND attempt >= max_attempts
                        THEN attempt + 1 ELSE max_attempts END,
    -- A cancel asked of an earlier attempt is history: the new one runs (its errors keep it).
    cancel_requested_at = NULL, cancel_reason = NULL
WHERE """ + RETRY_CANDIDATE + """
RETURNING id, queue
"""

# The reason is recorded as the last error, so the job's history says who stopped it. An
# executing job is only asked to stop (migration 0023): it stays `executing`, holding its unique
# key, batch, forwarding and workflow children, until its runner has stopped the perform and
# records `cancelled` itself (or, if its runner died, the rescuer does). A second request keeps
# the time of the first. `requested` tells the two kinds apart for the caller.
CANCEL = """
UPDATE {jobs}
SET state = CASE WHEN state = 'executing' THEN state ELSE 'cancelled' END,
    finished_at = CASE WHEN state = 'executing' THEN finished_at ELSE now() END,
    errors = CASE WHEN state = 'executing' THEN errors
                  ELSE errors || jsonb_build_array(jsonb_build_object(
                      'attempt', attempt, 'at', now(), 'error', %(reason)s::text,
                      'traceback', '')) END,
    cancel_requested_at = CASE WHEN state = 'executing'
                               THEN coalesce(cancel_requested_at, now())
                               ELSE cancel_requested_at END,
    cancel_reason = CASE WHEN state = 'executing' THEN coalesce(cancel_reason, %(why)s::text)
                         ELSE cancel_reason END
WHERE state = ANY(%(from)s) AND {where}
RETURNING id, state = 'executing' AS requested
"""

# Runners executing one of these ids stop its perform (after reading the row); others ignore it.
NOTIFY_CANCELLED = """
SELECT pg_notify(%(channel)s, %(schema)s || '.' || i) FROM unnest(%(ids)s::bigint[]) AS i
"""

MATCHING = "SELECT id FROM {jobs} WHERE state = ANY(%(from)s) AND {where} ORDER BY id"

# A dry run of a retry: the ids RETRY would take, by the same condition.
RETRY_MATCHING = "SELECT id FROM {jobs} WHERE " + RETRY_CANDIDATE + " ORDER BY id"

# `shigoto status`: running jobs whose cancel was asked for and whose perform has not stopped
# yet (migration 0023), from the executing rows only.
CANCELLING = """
SELECT id, queue, worker, attempted_by, cancel_requested_at FROM {jobs}
WHERE state = 'executing' AND cancel_requested_at IS NOT NULL
ORDER BY cancel_requested_at, id
LIMIT %(limit)s
"""

# Why nothing matched: the filter's jobs by state, and how many of them wait on a parent.
MATCHING_BY_STATE = (
    "SELECT state, count(*), count(*) FILTER (WHERE " + WAITS_ON_PARENTS + ")"
    " FROM {jobs} WHERE {where} GROUP BY state ORDER BY 1"
)

# Queues at their defaults have no row worth showing.
# `shigoto status`: the queues with a setting away from its default (a settings row left at
# the defaults, as resuming a queue leaves it, is not worth a line).
SETTINGS_IN_FORCE = """
SELECT name, paused, global_concurrency, forward, fanout, fair, weight, partition_concurrency,
       rate_limit
FROM {queues}
WHERE paused OR global_concurrency IS NOT NULL OR forward IS NOT NULL OR fanout OR fair
   OR weight <> 1 OR partition_concurrency IS NOT NULL OR rate_limit IS NOT NULL
ORDER BY name
"""

# Circuit breakers away from closed (open, or probing while half-open), by the partial index.
BREAKERS_NOT_CLOSED = """
SELECT worker, partition_key, status, blocked_until, updated_at FROM {breakers}
WHERE status <> 'closed'
ORDER BY worker, partition_key NULLS FIRST
LIMIT %(limit)s
"""

# now() from the database, so the next slot is computed against the clock that fires it.
CRON_ENTRIES = """
SELECT name, expression, timezone, worker, queue, enabled, last_slot_at, last_job_id, now()
FROM {cron} ORDER BY name
"""

CRON_ROW = "SELECT * FROM {cron} WHERE name = %(name)s"

READ_SETTINGS = """
SELECT name, global_concurrency, paused, fanout FROM {queues} WHERE name = ANY(%(names)s)
"""

SET_LIMIT = """
INSERT INTO {queues} (name, global_concurrency) VALUES (%(name)s, %(limit)s)
ON CONFLICT (name) DO UPDATE SET global_concurrency = excluded.global_concurrency,
                                 updated_at = now()
"""

SET_PAUSED = """
INSERT INTO {queues} (name, paused) VALUES (%(name)s, %(paused)s)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now()
"""

# Fan-out (shigoto.runtime.fanout), written like `forward` below: only when it differs, with
# RETURNING saying whether it did, so the operator can run it on every pass.
SET_FANOUT = """
INSERT INTO {queues} AS q (name, fanout) VALUES (%(name)s, true)
ON CONFLICT (name) DO UPDATE SET fanout = true, updated_at = now()
    WHERE NOT q.fanout
RETURNING q.name
"""

# Turning fan-out off creates no settings row for a queue that has none (false is the default).
CLEAR_FANOUT = """
UPDATE {queues} SET fanout = false, updated_at = now()
WHERE name = %(name)s AND fanout
RETURNING name
"""

# Dead-letter forwarding (shigoto.relations.forwarding): the whole setting is replaced. Written
# only when it differs, and RETURNING says whether it did, so the operator can run it on every
# pass (closing drift made in the database) and report a change only when there was one.
SET_FORWARD = """
INSERT INTO {queues} AS q (name, forward) VALUES (%(name)s, %(forward)s)
ON CONFLICT (name) DO UPDATE SET forward = excluded.forward, updated_at = now()
    WHERE q.forward IS DISTINCT FROM excluded.forward
RETURNING q.name
"""

# Turning forwarding off creates no settings row for a queue that has none.
CLEAR_FORWARD = """
UPDATE {queues} SET forward = NULL, updated_at = now()
WHERE name = %(name)s AND forward IS NOT NULL
RETURNING name
"""

WAITING_STATES = (JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE)

# shigoto.testing's assertions: the jobs still waiting to run, oldest first.
WAITING_JOBS = """
SELECT * FROM {jobs}
WHERE state = ANY(%(states)s) AND (%(worker)s::text IS NULL OR worker = %(worker)s)
ORDER BY id
"""

# drain_queue runs due scheduled and retryable jobs at once: a test does not wait for backoff.
# A workflow child waiting for its parents (scheduled at 9999-12-31, migration 0009) is not
# due: only its parents' final transitions may release it.
MAKE_DUE = """
UPDATE {jobs} SET state = 'available', scheduled_at = now()
WHERE queue = %(queue)s AND state = ANY(%(states)s)
  AND NOT (depends_on IS NOT NULL AND scheduled_at = '9999-12-31 00:00:00+00')
"""


# -- counts that do not grow with the table ---------------------------------------------------
#
# `shigoto status`, the operator and the stats sampler count jobs without reading the finished
# rows a busy table is mostly made of (issue 14): the four live states through their partial
# indexes (claim: available; stage: scheduled and retryable; executing), finished ones through
# the finished index, bounded. Each WHERE spells its index's predicate exactly, so the planner
# can prove the partial index applies.

#: How many finished rows the live table may hold for their counts to be exact: up to this
#: many are counted (the newest, through the finished index); past it, the counts by queue are
#: estimates from the table's statistics (`estimate_finished`), and say so.
FINISHED_EXACT_LIMIT = 5_000

#: The order of the count columns of OPERATOR_COUNTS (after the queue name).
OPERATOR_COUNT_STATES = (
    JobState.AVAILABLE, JobState.SCHEDULED, JobState.EXECUTING, JobState.RETRYABLE,
    JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED,
)
LIVE_STATES = (JobState.AVAILABLE, JobState.SCHEDULED, JobState.EXECUTING, JobState.RETRYABLE)
FINISHED = (JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED)

# Live jobs by queue and state: (queue, state, count, first_at). first_at is the oldest
# scheduled_at of available jobs (how long the head of the queue has waited), the earliest
# scheduled_at of scheduled and retryable ones (when the next comes due), the oldest
# attempted_at of executing ones. {cond} narrows to some queues (the operator's).
_LIVE = """
SELECT queue, 'available' AS state, count(*) AS n, min(scheduled_at) AS first_at
FROM {{jobs}} WHERE state = 'available'{cond} GROUP BY queue
UNION ALL
SELECT queue, state, count(*), min(scheduled_at)
FROM {{jobs}} WHERE state IN ('scheduled', 'retryable'){cond} GROUP BY queue, state
UNION ALL
SELECT queue, 'executing', count(*), min(attempted_at)
FROM {{jobs}} WHERE state = 'executing'{cond} GROUP BY queue
"""

LIVE_COUNTS_FRAGMENT = _LIVE.format(cond="")

# `shigoto status`: the live counts with the database's now(), for the oldest available age.
LIVE_COUNTS = f"""
SELECT queue, state, n, extract(epoch FROM now() - first_at)::float8 AS age
FROM ({LIVE_COUNTS_FRAGMENT}) AS live
ORDER BY queue, state
"""

# The newest finished rows, at most %(limit)s, by the finished index (read backwards): fewer
# than the limit means these are all of them and their counts are exact. The ORDER BY is what
# makes it an index read of `limit` rows whatever the table holds.
_RECENT_FINISHED = """
SELECT queue, state FROM {{jobs}}
WHERE state IN ('completed', 'discarded', 'cancelled')
ORDER BY finished_at DESC LIMIT %(limit)s
"""

FINISHED_COUNTS = f"""
SELECT queue, state, count(*) FROM ({_RECENT_FINISHED.format()}) AS recent
GROUP BY queue, state ORDER BY queue, state
"""

# Every queue that has a job in the live table, without reading the finished rows at large:
# a loose index scan of the claim index for available jobs (one probe per queue), the other
# live states from their partial indexes (their rows are few next to the finished ones), and
# the queues of the newest finished rows (the finished index, read backwards, at most
# RECENT_QUEUE_ROWS rows) or of the stats sampled in the last day. A queue whose only rows
# finished long ago, and quietly, is not listed: nothing in it is left to run or to watch.
# No index on (queue) covers every row since migration 0028 (the hot path paid for it).
RECENT_QUEUE_ROWS = 10_000
JOB_QUEUES_CTE = f"""
available_queues AS (
    (SELECT queue FROM {{jobs}} WHERE state = 'available' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {{jobs}} AS j
            WHERE j.state = 'available' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM available_queues AS q WHERE q.queue IS NOT NULL
),
job_queues AS (
    SELECT queue FROM available_queues
    UNION SELECT queue FROM {{jobs}} WHERE state IN ('scheduled', 'retryable')
    UNION SELECT queue FROM {{jobs}} WHERE state = 'executing'
    UNION SELECT queue FROM (
        SELECT queue FROM {{jobs}} WHERE state IN ('completed', 'discarded', 'cancelled')
        ORDER BY finished_at DESC LIMIT {RECENT_QUEUE_ROWS}) AS recent
    UNION SELECT queue FROM {{stats}} WHERE at > now() - interval '1 day'
)"""

JOB_QUEUES = f"""
WITH RECURSIVE {JOB_QUEUES_CTE}
SELECT queue FROM job_queues WHERE queue IS NOT NULL
"""

# What the stats sampler (shigoto.runtime.sampler) recorded of the last hour, by queue: jobs
# finished in the minutes sampled, and how many minutes were.
FINISHED_LAST_HOUR = """
SELECT queue, sum(completed)::bigint, sum(discarded)::bigint, sum(cancelled)::bigint,
       count(*)::int
FROM {stats} WHERE at > now() - interval '1 hour'
GROUP BY queue ORDER BY queue
"""


# `shigoto status`: progress of the builder's workflows that still have work to do, oldest
# first (by their first step). Only workflows with a live step are looked at (migration
# 0021's live index), and only their own steps are counted (its index of every step).
STATUS_WORKFLOWS = """
WITH live AS (
    SELECT meta -> 'workflow' ->> 'id' AS id, min(id) AS first_live
    FROM {jobs}
    WHERE meta ? 'workflow' AND state IN ('scheduled', 'available', 'executing', 'retryable')
    GROUP BY 1
    ORDER BY 2 LIMIT %(limit)s
)
SELECT l.id, min(j.meta -> 'workflow' ->> 'name') AS name,
       count(*) AS total,
       count(*) FILTER (WHERE j.state = 'completed') AS completed,
       count(*) FILTER (WHERE j.state IN ('discarded', 'cancelled')) AS failed,
       count(*) FILTER (WHERE j.state = 'scheduled'
                          AND j.scheduled_at = '9999-12-31 00:00:00+00') AS waiting,
       count(*) FILTER (WHERE j.state = 'executing') AS executing
FROM live AS l
JOIN {jobs} AS j ON j.meta ? 'workflow' AND (j.meta -> 'workflow' ->> 'id') = l.id
GROUP BY l.id
ORDER BY min(j.id)
"""


# The table statistics the planner estimates from, for the finished counts past the exact
# limit: the table's rows at its last ANALYZE scaled to its current size (as the planner
# scales them), and the most common values of `queue` and `state` with their frequencies.
# One small read whatever the number of queues (an EXPLAIN per (queue, state) took about
# 1.7 ms per queue to plan). pg_stats shows a column to any role that may SELECT it.
TABLE_STATS = """
SELECT c.reltuples::float8, c.relpages::float8,
       (pg_relation_size(c.oid) / current_setting('block_size')::int)::float8 AS pages,
       s.attname::text, s.null_frac::float8, s.n_distinct::float8,
       s.most_common_vals::text::text[], s.most_common_freqs::float8[]
FROM pg_class AS c
LEFT JOIN pg_stats AS s
       ON s.schemaname = %(schema)s AND s.tablename = 'shigoto_jobs'
      AND s.attname IN ('queue', 'state')
WHERE c.oid = to_regclass(format('%%I.%%I', %(schema)s::text, 'shigoto_jobs'))
"""


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """One column's statistics from pg_stats: the planner's view of its values."""

    null_frac: float
    n_distinct: float
    values: tuple[str, ...]
    freqs: tuple[float, ...]

    def frequency(self, value: str, rows: float) -> float:
        """The share of rows holding `value`, as the planner's equality estimate has it: its
        frequency if it is a most common value, else an even share of what the most common
        values leave among the other distinct values."""
        if value in self.values:
            return self.freqs[self.values.index(value)]
        distinct = self.n_distinct if self.n_distinct >= 0 else -self.n_distinct * rows
        others = distinct - len(self.values)
        rest = 1.0 - sum(self.freqs) - self.null_frac
        return max(rest / others, 0.0) if others >= 1 else 0.0


def estimate_finished(
    rows: Sequence[Sequence[Any]], queues: Sequence[str]
) -> dict[str, dict[str, int]] | None:
    """TABLE_STATS's answer as {queue: {finished state: estimated jobs}}: the table's rows now
    times the share of the queue times the share of the state (the planner's independence
    assumption: on a table mostly made of finished jobs, a queue's share of all rows is about
    its share of finished ones). None when the table was never analyzed (no statistics)."""
    if not rows:
        return None
    reltuples, relpages, pages = rows[0][0], rows[0][1], rows[0][2]
    columns = {
        r[3]: ColumnStats(r[4], r[5], tuple(r[6] or ()), tuple(r[7] or ()))
        for r in rows if r[3] is not None
    }  # fmt: skip
    if reltuples < 0 or {"queue", "state"} - columns.keys():
        return None
    total = reltuples / relpages * pages if relpages > 0 else reltuples
    return {
        queue: {
            str(state): round(total * columns["queue"].frequency(queue, total)
                              * columns["state"].frequency(str(state), total))
            for state in FINISHED
        }
        for queue in queues
    }  # fmt: skip


def finished_estimate(schema: str, queues: Sequence[str]) -> tuple[sql.Composed, dict[str, str]]:
    """EXPLAIN of one count per (queue, finished state), as a UNION ALL in that order: the
    planner's row estimate of each branch is the estimate of that count (table statistics
    scaled to the table's current size; no row is read). The fallback of `estimate_finished`
    for a table without statistics yet. Read the answer with `plan_rows`."""
    branches = []
    params: dict[str, str] = {}
    for i, queue in enumerate(queues):
        params[f"q{i}"] = queue
        for state in FINISHED:
            branches.append(
                sql.SQL("SELECT 1 FROM {jobs} WHERE queue = {q} AND state = {s}").format(
                    jobs=sql.Identifier(schema, "shigoto_jobs"),
                    q=sql.Placeholder(f"q{i}"), s=sql.Literal(str(state)),
                )
            )  # fmt: skip
    query = sql.SQL(" UNION ALL ").join(branches)
    return sql.SQL("EXPLAIN (FORMAT JSON) ") + query, params


def plan_rows(plan: Any, queues: Sequence[str]) -> dict[str, dict[str, int]]:
    """`finished_estimate`'s EXPLAIN output as {queue: {state: estimated rows}}."""
    top = plan[0]["Plan"]
    branches = top["Plans"] if top["Node Type"] == "Append" else [top]
    rows = iter(int(branch["Plan Rows"]) for branch in branches)
    return {queue: {str(state): next(rows) for state in FINISHED} for queue in queues}


def _count(state: JobState) -> str:
    return f"coalesce(sum(n) FILTER (WHERE state = '{state}'), 0)::bigint AS {state}"


# The operator's reading: one row per requested queue (zeros for queues without jobs, NULL
# settings without a settings row), each carrying now(). next_due_at: the stager makes those
# jobs available once due, and only a running runner stages, so the operator must keep one.
# Finished counts are exact while the table holds fewer than %(limit)s finished rows, NULL
# past that (dbcounts then asks the planner for estimates): never a scan of finished rows.
OPERATOR_COUNTS = f"""
WITH live AS (
    SELECT queue, {", ".join(_count(s) for s in LIVE_STATES)},
           min(first_at) FILTER (WHERE state IN ('scheduled', 'retryable')) AS next_due_at
    FROM ({_LIVE.format(cond=" AND queue = ANY(%(queues)s)")}) AS l
    GROUP BY queue
),
recent AS ({_RECENT_FINISHED.format()}),
finished AS (
    SELECT queue, {", ".join(f"count(*) FILTER (WHERE state = '{s}') AS {s}" for s in FINISHED)}
    FROM recent GROUP BY queue
),
bound AS (SELECT count(*) < %(limit)s AS exact FROM recent)
SELECT q.queue,
       {", ".join(f"coalesce(l.{s}, 0)" for s in LIVE_STATES)},
       {", ".join(f"CASE WHEN b.exact THEN coalesce(f.{s}, 0) END" for s in FINISHED)},
       l.next_due_at, now(), s.paused, s.global_concurrency
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN bound AS b
LEFT JOIN live l ON l.queue = q.queue
LEFT JOIN finished f ON f.queue = q.queue
LEFT JOIN {{queues}} s ON s.name = q.queue
"""


# Whether anything knows the queue `%(queue)s`: a job (live or archived), a settings row, a
# runner serving it (stale nodes count: a runner that was there) or a cron schedule feeding it.
# Pausing a name none of these know stores a setting nothing reads (a typo) (issue 25).
QUEUE_KNOWN = """
SELECT EXISTS (SELECT 1 FROM {jobs} WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM {archive} WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM {queues} WHERE name = %(queue)s)
    OR EXISTS (SELECT 1 FROM {nodes} WHERE queues ? %(queue)s)
    OR EXISTS (SELECT 1 FROM {cron} WHERE queue = %(queue)s)
"""

# `shigoto queues list`: every queue something names (jobs, a settings row, a live runner, a
# cron schedule), with its jobs by state and its live runners. A runner counts while its
# heartbeat is under 90 s old, as the operator's runner gauge counts them. The job counts scan
# shigoto_jobs once (as `shigoto status` does); archived jobs are history and not counted.
QUEUES_LIST = """
WITH counts AS (
    SELECT queue, jsonb_object_agg(state, n) AS states
    FROM (SELECT queue, state, count(*) AS n FROM {jobs} GROUP BY queue, state) AS c
    GROUP BY queue
), runners AS (
    SELECT q.name AS queue, count(*) AS n
    FROM {nodes} AS n CROSS JOIN LATERAL jsonb_object_keys(n.queues) AS q(name)
    WHERE n.last_seen_at > now() - interval '90 seconds'
    GROUP BY q.name
), crons AS (
    SELECT queue, count(*) AS n FROM {cron} GROUP BY queue
), names AS (
    SELECT queue AS name FROM counts UNION SELECT name FROM {queues}
    UNION SELECT queue FROM runners UNION SELECT queue FROM crons
)
SELECT names.name, coalesce(counts.states, '{{}}'::jsonb), coalesce(runners.n, 0),
       coalesce(q.paused, false), q.name IS NOT NULL, coalesce(crons.n, 0)
FROM names
LEFT JOIN counts ON counts.queue = names.name
LEFT JOIN runners ON runners.queue = names.name
LEFT JOIN crons ON crons.queue = names.name
LEFT JOIN {queues} AS q ON q.name = names.name
ORDER BY names.name
"""

# `shigoto queues delete`: the queue's live jobs by state, read under the settings row's lock
# so two deletes (or a delete and a set_queue) of one queue take turns.
QUEUE_LIVE = """
SELECT state, count(*) FROM {jobs}
WHERE queue = %(queue)s AND state IN ('available', 'scheduled', 'executing', 'retryable')
GROUP BY state ORDER BY state
"""

LOCK_QUEUE_ROW = "SELECT 1 FROM {queues} WHERE name = %(queue)s FOR UPDATE"

# Other queues that forward into this one: deleting it would leave their copies nowhere.
FORWARDED_INTO = """
SELECT q.name, f.state
FROM {queues} AS q CROSS JOIN LATERAL jsonb_each_text(q.forward) AS f(state, target)
WHERE f.target = %(queue)s AND q.name <> %(queue)s ORDER BY 1, 2
"""

# The settings row goes first, so jobs cancelled by a forced delete are not forwarded.
DELETE_QUEUE_ROW = "DELETE FROM {queues} WHERE name = %(queue)s RETURNING name"

# The queue's finished jobs, as `delete_jobs` would delete them; jobs still executing (a forced
# delete asked them to stop) finish as cancelled and stay until pruned.
DELETE_QUEUE_FINISHED = """
DELETE FROM {jobs} WHERE queue = %(queue)s AND state IN ('completed', 'discarded', 'cancelled')
"""
