"""The statements of operating a queue: bulk retry and cancel, status, queue settings, the
operator's counts and the test helpers' queries.

Templates name tables as `{jobs}`, `{queues}`, `{cron}`, `{nodes}` and are composed per schema
with `psycopg.sql.Identifier`; the filter of retry and cancel arrives as a composed `{where}`
built from placeholders only, so no value is ever formatted into SQL text.
"""

from __future__ import annotations

import functools

from psycopg import sql

from shigoto.job import JobState


def _tables(schema: str) -> dict[str, sql.Identifier]:
    return {
        "jobs": sql.Identifier(schema, "shigoto_jobs"),
        "queues": sql.Identifier(schema, "shigoto_queues"),
        "cron": sql.Identifier(schema, "shigoto_cron"),
        "nodes": sql.Identifier(schema, "shigoto_nodes"),
        "breakers": sql.Identifier(schema, "shigoto_breakers"),
    }


@functools.cache
def compose(template: str, schema: str) -> sql.Composed:
    """`template` with its table names filled in for `schema` (cached: schemas are few)."""
    return sql.SQL(template).format(**_tables(schema))


def with_filter(template: str, schema: str, where: sql.Composable) -> sql.Composed:
    """A bulk statement with the caller's composed filter in `{where}`."""
    return sql.SQL(template).format(where=where, **_tables(schema))


# A retried job whose attempts are used up gets exactly one more.
RETRY = """
UPDATE {jobs}
SET state = 'available', scheduled_at = now(), finished_at = NULL, completed_at = NULL,
    max_attempts = CASE WHEN max_attempts IS NOT NULL AND attempt >= max_attempts
                        THEN attempt + 1 ELSE max_attempts END
WHERE state = ANY(%(from)s) AND {where}
RETURNING id, queue
"""

# The reason is recorded as the last error, so the job's history says who stopped it.
CANCEL = """
UPDATE {jobs}
SET state = 'cancelled', finished_at = now(),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempt, 'at', now(), 'error', %(reason)s::text, 'traceback', ''))
WHERE state = ANY(%(from)s) AND {where}
RETURNING id
"""

# Runners executing one of these ids stop its perform (after reading the row); others ignore it.
NOTIFY_CANCELLED = """
SELECT pg_notify(%(channel)s, %(schema)s || '.' || i) FROM unnest(%(ids)s::bigint[]) AS i
"""

MATCHING = "SELECT id FROM {jobs} WHERE state = ANY(%(from)s) AND {where} ORDER BY id"

MATCHING_BY_STATE = "SELECT state, count(*) FROM {jobs} WHERE {where} GROUP BY state ORDER BY 1"

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


#: The order of the count columns of OPERATOR_COUNTS (after the queue name).
OPERATOR_COUNT_STATES = (
    JobState.AVAILABLE, JobState.SCHEDULED, JobState.EXECUTING, JobState.RETRYABLE,
    JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED,
)


def _count(state: JobState) -> str:
    return f"count(*) FILTER (WHERE state = '{state}') AS {state}"


# The operator's reading: one row per requested queue (zeros for queues without jobs, NULL
# settings without a settings row), each carrying now(). next_due_at: the stager makes those
# jobs available once due, and only a running runner stages, so the operator must keep one.
OPERATOR_COUNTS = f"""
WITH counts AS (
    SELECT queue,
           {", ".join(_count(s) for s in OPERATOR_COUNT_STATES)},
           min(scheduled_at) FILTER (WHERE state IN ('scheduled', 'retryable')) AS next_due_at
    FROM {{jobs}}
    WHERE queue = ANY(%(queues)s)
    GROUP BY queue
)
SELECT q.queue,
       {", ".join(f"coalesce(c.{s}, 0)" for s in OPERATOR_COUNT_STATES)},
       c.next_due_at, now(), s.paused, s.global_concurrency
FROM unnest(%(queues)s::text[]) AS q(queue)
LEFT JOIN counts c ON c.queue = q.queue
LEFT JOIN {{queues}} s ON s.name = q.queue
"""
