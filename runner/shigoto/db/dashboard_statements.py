"""The SQL of the web dashboard (`shigoto.dashboard`): counts, charts, nodes, cron, the change
poll and the single-job actions the job API has no statement for.

Counting on a big table. `shigoto_jobs` may hold millions of finished rows; a page must never
count them. Live states are counted exactly, each through the partial index that holds only
that state (so their cost follows the backlog, not the table): the claim index for available,
the stage index for scheduled and retryable, the executing index for executing. Finished
states are counted exactly only while the table is small (`exact_finished`, through the
finished index); past that they are the planner's estimates, read from one EXPLAIN (no row is
read), and the dashboard says so (`exact: false`). Every statement's predicate is written the
way its index's is, so the planner can prove the partial index applies.

Templates name tables as `{jobs}`, `{archive}`, `{queues}`, `{nodes}`, `{cron}`, `{stats}`,
`{leaders}` and are composed per schema with `psycopg.sql.Identifier`; values reach SQL as
placeholders, except the queue names of the estimate's EXPLAIN, which are `sql.Literal`s
(EXPLAIN takes no parameters) quoted by psycopg.
"""

from __future__ import annotations

from psycopg import sql

from shigoto.db import ops_statements
from shigoto.job import JOB_COLUMNS

#: Live jobs by queue and state, each state through the partial index that holds it: the
#: statement `shigoto status` and the operator count with, without its oldest-job times.
LIVE_COUNTS = f"""
SELECT queue, state, n FROM ({ops_statements.LIVE_COUNTS_FRAGMENT}) AS live
"""

# Exact finished counts, only run while the table is small (the finished index's predicate).
FINISHED_COUNTS = """
SELECT queue, state, count(*) FROM {jobs}
WHERE state IN ('completed', 'discarded', 'cancelled') GROUP BY queue, state
"""

# The distinct queue names of the table without reading it: the skip scan of the listing
# index (queue, id) that status uses, one index probe per name (a plain DISTINCT would read
# every row), at most %(limit)s of them.
QUEUE_NAMES = f"""
WITH RECURSIVE {ops_statements.JOB_QUEUES_CTE}
SELECT queue FROM job_queues WHERE queue IS NOT NULL LIMIT %(limit)s
"""

QUEUE_SETTINGS = """
SELECT name, paused, global_concurrency, rate_limit, operator_replicas, operator_replicas_at
FROM {queues} ORDER BY name
"""

# The hour of charts: shigoto_stats's primary key (at, queue) serves the range.
SERIES = """
SELECT at, sum(available), sum(scheduled), sum(executing), sum(retryable),
       sum(completed), sum(discarded), sum(cancelled)
FROM {stats}
WHERE at > now() - interval '1 hour'
GROUP BY at ORDER BY at
"""

NOW = "SELECT now()"

# A node leads when it holds an unexpired lease of any name (runners' `leader`, the operator's
# cron lease). Its executing jobs come from the executing index (attempted_by).
NODES = """
SELECT n.id, n.hostname, n.pid, n.queues, n.started_at, n.last_seen_at,
       EXISTS (SELECT 1 FROM {leaders} AS l
               WHERE l.leader_id = n.id AND l.expires_at > now()) AS leader,
       coalesce(e.executing, 0) AS executing
FROM {nodes} AS n
LEFT JOIN (SELECT attempted_by, count(*) AS executing FROM {jobs}
           WHERE state = 'executing' GROUP BY attempted_by) AS e ON e.attempted_by = n.id
ORDER BY n.started_at, n.id
"""

NODE_COUNT = "SELECT count(*) FROM {nodes}"

# The last job of each schedule, from either table (primary key lookups).
CRON = """
SELECT c.name, c.expression, c.worker, c.queue, c.timezone, c.enabled, c.last_slot_at,
       c.last_job_id, j.state, now()
FROM {cron} AS c
LEFT JOIN LATERAL (
    SELECT state FROM {jobs} WHERE id = c.last_job_id
    UNION ALL
    SELECT state FROM {archive} WHERE id = c.last_job_id
    LIMIT 1
) AS j ON true
ORDER BY c.name
"""

# What the change poller compares every few seconds: the newest id (an enqueue), the live
# counts (any transition between live states), the newest finish (a completion), the newest
# settings change (pause, resume) and the nodes. Each part reads one index.
CHANGE_MARK = """
SELECT (SELECT max(id) FROM {jobs}),
       (SELECT count(*) FROM {jobs} WHERE state = 'available'),
       (SELECT count(*) FROM {jobs} WHERE state IN ('scheduled', 'retryable')),
       (SELECT count(*) FROM {jobs} WHERE state = 'executing'),
       (SELECT max(finished_at) FROM {jobs} WHERE state IN ('completed', 'discarded', 'cancelled')),
       (SELECT max(updated_at) FROM {queues}),
       (SELECT count(*) || ':' || coalesce(max(last_seen_at)::text, '') FROM {nodes})
"""

_COLUMNS = ", ".join(JOB_COLUMNS)

# Full rows of a few jobs by id (a job's workflow relatives), from both tables.
JOBS_BY_IDS = f"""
SELECT {_COLUMNS}, false AS archived, NULL::timestamptz AS archived_at
FROM {{jobs}} WHERE id = ANY(%(ids)s)
UNION ALL
SELECT {_COLUMNS}, true AS archived, archived_at
FROM {{archive}} WHERE id = ANY(%(ids)s)
ORDER BY id
"""

# An action's precondition: the job's state, its row locked until the action's transaction
# ends, so no runner or other request changes it between the check and the change.
LOCK_JOB = "SELECT state, queue FROM {jobs} WHERE id = %(id)s FOR UPDATE"
ARCHIVED_STATE = "SELECT state FROM {archive} WHERE id = %(id)s FOR UPDATE"

# Deleting one finished job; the state is checked again in the statement itself.
DELETE_JOB = """
DELETE FROM {jobs} WHERE id = %(id)s AND state IN ('completed', 'discarded', 'cancelled')
RETURNING id
"""
DELETE_ARCHIVED = "DELETE FROM {archive} WHERE id = %(id)s RETURNING id"

# A queue is known when it has a settings row, a job (the listing index's first entry) or a
# runner serving it: pausing a name nobody uses is refused as a probable typo.
QUEUE_KNOWN = """
SELECT EXISTS (SELECT 1 FROM {queues} WHERE name = %(name)s)
    OR EXISTS (SELECT 1 FROM {jobs} WHERE queue = %(name)s)
    OR EXISTS (SELECT 1 FROM {nodes} WHERE queues ? %(name)s)
"""

QUEUE_ROW = """
SELECT name, paused, global_concurrency, rate_limit, operator_replicas, operator_replicas_at
FROM {queues} WHERE name = %(name)s
"""


#: Templates are composed like the status statements, over the same table names.
compose = ops_statements.compose


FINISHED_STATES = ("completed", "discarded", "cancelled")


def estimates(schema: str, queues: list[str]) -> sql.Composed:
    """One EXPLAIN whose plan carries the planner's row estimate of the whole table first, then
    of each (queue, finished state) in `queues` x FINISHED_STATES order: an Append of simple
    scans, one branch each. Planning reads statistics only, never a row."""
    jobs = sql.Identifier(schema, "shigoto_jobs")
    branches = [sql.SQL("SELECT 1 FROM {}").format(jobs)]
    for queue in queues:
        for state in FINISHED_STATES:
            branches.append(
                sql.SQL("SELECT 1 FROM {} WHERE queue = {} AND state = {}").format(
                    jobs, sql.Literal(queue), sql.Literal(state)
                )
            )
    return sql.SQL("EXPLAIN (FORMAT JSON) {}").format(sql.SQL(" UNION ALL ").join(branches))
