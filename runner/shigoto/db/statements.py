"""Every runtime SQL statement, named, composed once per schema.

Table names go through `psycopg.sql.Identifier`; nothing user-supplied is ever formatted into
SQL text. Statements are plain strings afterwards so psycopg can prepare them server-side.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from psycopg import sql

from shigoto.job import FINISHED_STATES, JOB_COLUMNS, JobState

#: LISTEN/NOTIFY channels. Payloads are "<schema>.<rest>" so several schemas can share a
#: database without waking each other's runners for nothing.
INSERT_CHANNEL = "shigoto_insert"
CANCEL_CHANNEL = "shigoto_cancel"

# In JobState's order, so the text matches the partial indexes' predicates word for word.
_FINISHED = "(" + ", ".join(f"'{s}'" for s in JobState if s in FINISHED_STATES) + ")"
# Named, not `*`: the archive's columns are the jobs table's plus archived_at, and columns added
# by later migrations land in a different position in each table.
_COLUMNS = ", ".join(JOB_COLUMNS)

_INSERT_ONE = """
WITH input AS (
    SELECT coalesce(%(scheduled_at)s::timestamptz,
                    now() + make_interval(secs => %(delay)s::float8)) AS at
), ins AS (
    INSERT INTO {jobs} (queue, worker, args, state, priority, max_attempts, timeout,
                        scheduled_at, tags, meta)
    SELECT %(queue)s, %(worker)s, %(args)s,
           CASE WHEN input.at <= now() THEN 'available' ELSE 'scheduled' END,
           %(priority)s, %(max_attempts)s, %(timeout)s, input.at, %(tags)s, %(meta)s
    FROM input
    RETURNING id, queue, state, scheduled_at, inserted_at
)
-- The NOTIFY is delivered at commit, so a rolled-back enqueue wakes nobody. Only what the
-- database assigned comes back: the client knows the rest (client._job).
SELECT ins.id, ins.state, ins.scheduled_at, ins.inserted_at,
       CASE WHEN ins.state = 'available'
            THEN pg_notify({channel}, {schema_name} || '.' || ins.queue) END IS NULL AS _woke
FROM ins
"""

# One round trip reserves ids and reads the database clock, so bulk inserts are timed by the
# database, never by the client's clock.
_RESERVE_IDS = """
SELECT now() AS now,
       array(SELECT nextval(pg_get_serial_sequence({jobs_name}, 'id'))
             FROM generate_series(1, %(count)s)) AS ids
"""

# Binary: the client sends typed values (see client._COPY_TYPES), nothing to escape or parse.
_COPY_JOBS = """
COPY {jobs} (id, queue, worker, args, state, priority, max_attempts, timeout,
             scheduled_at, inserted_at, tags, meta) FROM STDIN (FORMAT BINARY)
"""

_NOTIFY_QUEUES = """
SELECT pg_notify({channel}, {schema_name} || '.' || q) FROM unnest(%(queues)s::text[]) AS q
"""

# Returns JOB_COLUMNS in order, so the runner builds each Job positionally (Job.from_values).
_CLAIM = f"""
WITH picked AS (
    SELECT id FROM {{jobs}}
    WHERE state = 'available' AND queue = %(queue)s
    ORDER BY priority DESC, scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {{jobs}} AS j
SET state = 'executing', attempt = j.attempt + 1, attempted_at = now(),
    attempted_by = %(node)s, progress = NULL
FROM picked
WHERE j.id = picked.id
RETURNING {", ".join(f"j.{c}" for c in JOB_COLUMNS)}
"""

# The claim while some workers are at their global limit: their jobs are left for later, so
# other jobs of the queue run instead of being claimed and handed straight back.
_CLAIM_EXCLUDING = _CLAIM.replace(
    "WHERE state = 'available' AND queue = %(queue)s",
    "WHERE state = 'available' AND queue = %(queue)s AND worker <> ALL(%(exclude)s::text[])",
)

# Slots of global limits held right now, across every session of this database.
_SLOTS_HELD = """
SELECT s.scope, count(l.pid) AS held
FROM unnest(%(scopes)s::int[]) AS s(scope)
LEFT JOIN pg_locks AS l
       ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.classid = (s.scope::bigint & 4294967295)::oid
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY s.scope
"""

# One statement acknowledges a whole batch of outcomes. The guard (still executing, same
# attempt, same node) makes it idempotent: a retried write, a job cancelled meanwhile or a job
# rescued and re-claimed elsewhere is left untouched.
_COMPLETE = f"""
UPDATE {{jobs}} AS j
SET state = u.state,
    attempt = CASE WHEN u.snooze THEN j.attempt - 1 ELSE j.attempt END,
    scheduled_at = CASE WHEN u.delay IS NULL THEN j.scheduled_at
                        ELSE now() + make_interval(secs => u.delay) END,
    completed_at = CASE WHEN u.state = 'completed' THEN now() ELSE j.completed_at END,
    finished_at = CASE WHEN u.state IN {_FINISHED} THEN now() END,
    result = CASE WHEN u.state = 'completed' THEN u.result ELSE j.result END,
    errors = CASE WHEN u.error IS NULL THEN j.errors
                  ELSE j.errors || jsonb_build_array(u.error || jsonb_build_object('at', now()))
             END,
    progress = coalesce(u.progress, j.progress)
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(states)s::text[], %(delays)s::float8[],
            %(results)s::jsonb[], %(errors)s::jsonb[], %(snoozes)s::bool[],
            %(progresses)s::int[])
     AS u(id, attempt, state, delay, result, error, snooze, progress)
WHERE j.id = u.id AND j.state = 'executing' AND j.attempt = u.attempt
  AND j.attempted_by = %(node)s
RETURNING j.id
"""

# Shutdown hands unfinished jobs back without consuming the attempt they were given.
_PUT_BACK = """
UPDATE {jobs}
SET state = 'available', attempt = attempt - 1, attempted_by = NULL, scheduled_at = now()
WHERE id = ANY(%(ids)s) AND state = 'executing' AND attempted_by = %(node)s
RETURNING id, queue
"""

_PROGRESS = """
UPDATE {jobs} SET progress = %(progress)s
WHERE id = %(id)s AND state = 'executing' AND attempt = %(attempt)s
"""

_STAGE = """
WITH due AS (
    SELECT id FROM {jobs}
    WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), staged AS (
    UPDATE {jobs} AS j SET state = 'available'
    FROM due WHERE j.id = due.id
    RETURNING j.queue
)
SELECT queue, count(*) AS count,
       pg_notify({channel}, {schema_name} || '.' || queue) IS NULL AS _woke
FROM staged GROUP BY queue
"""

_ARCHIVE = f"""
WITH old AS (
    SELECT id FROM {{jobs}}
    WHERE state IN {_FINISHED} AND finished_at < now() - make_interval(secs => %(after)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM {{jobs}} AS j USING old WHERE j.id = old.id RETURNING j.*
)
INSERT INTO {{archive}} ({_COLUMNS}, archived_at)
SELECT {_COLUMNS}, now() FROM moved
ON CONFLICT (id) DO NOTHING
"""

_DELETE_ARCHIVED = """
DELETE FROM {archive} WHERE id IN (
    SELECT id FROM {archive}
    WHERE archived_at < now() - make_interval(secs => %(after)s)
    LIMIT %(limit)s
)
"""

_NODE_UPSERT = """
INSERT INTO {nodes} (id, hostname, pid, queues)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s)
ON CONFLICT (id) DO UPDATE SET queues = excluded.queues, last_seen_at = now()
"""

_NODE_DELETE = "DELETE FROM {nodes} WHERE id = %(id)s"

_COUNTS = """
SELECT queue, state, count(*) AS count FROM {jobs} GROUP BY queue, state ORDER BY queue, state
"""

_OLDEST_AVAILABLE = """
SELECT queue, extract(epoch FROM now() - min(scheduled_at))::float8 AS age
FROM {jobs} WHERE state = 'available' GROUP BY queue
"""

_NODES = """
SELECT id, hostname, pid, queues, started_at, last_seen_at,
       extract(epoch FROM now() - last_seen_at)::float8 AS silent_for
FROM {nodes} ORDER BY started_at
"""

_STALE_EXECUTING = """
SELECT j.id, j.queue, j.worker, j.attempted_by, j.attempted_at
FROM {jobs} AS j LEFT JOIN {nodes} AS n ON n.id = j.attempted_by
WHERE j.state = 'executing'
  AND (n.id IS NULL OR n.last_seen_at < now() - make_interval(secs => %(stale_after)s))
ORDER BY j.attempted_at
"""

_GET_JOB = "SELECT * FROM {jobs} WHERE id = %(id)s"


@dataclass(frozen=True, slots=True)
class Statements:
    """The runtime statements of one schema."""

    schema: str
    insert_one: str
    reserve_ids: str
    copy_jobs: str
    notify_queues: str
    claim: str
    claim_excluding: str
    slots_held: str
    complete: str
    put_back: str
    progress: str
    stage: str
    archive: str
    delete_archived: str
    node_upsert: str
    node_delete: str
    counts: str
    oldest_available: str
    nodes: str
    stale_executing: str
    get_job: str

    @property
    def jobs_table(self) -> sql.Identifier:
        return sql.Identifier(self.schema, "shigoto_jobs")


@functools.cache
def compose(template: str, schema: str) -> str:
    """Fill a template's table names and channel for `schema`."""
    return (
        sql.SQL(template)
        .format(
            jobs=sql.Identifier(schema, "shigoto_jobs"),
            archive=sql.Identifier(schema, "shigoto_jobs_archive"),
            nodes=sql.Identifier(schema, "shigoto_nodes"),
            cron=sql.Identifier(schema, "shigoto_cron"),
            queues=sql.Identifier(schema, "shigoto_queues"),
            jobs_name=sql.Literal(f'"{schema}".shigoto_jobs'),
            schema_name=sql.Literal(schema),
            channel=sql.Literal(INSERT_CHANNEL),
        )
        .as_string(None)
    )


@functools.cache
def statements(schema: str) -> Statements:
    """Compose (once) every statement for `schema`."""
    templates = {
        "insert_one": _INSERT_ONE,
        "reserve_ids": _RESERVE_IDS,
        "copy_jobs": _COPY_JOBS,
        "notify_queues": _NOTIFY_QUEUES,
        "claim": _CLAIM,
        "claim_excluding": _CLAIM_EXCLUDING,
        "slots_held": _SLOTS_HELD,
        "complete": _COMPLETE,
        "put_back": _PUT_BACK,
        "progress": _PROGRESS,
        "stage": _STAGE,
        "archive": _ARCHIVE,
        "delete_archived": _DELETE_ARCHIVED,
        "node_upsert": _NODE_UPSERT,
        "node_delete": _NODE_DELETE,
        "counts": _COUNTS,
        "oldest_available": _OLDEST_AVAILABLE,
        "nodes": _NODES,
        "stale_executing": _STALE_EXECUTING,
        "get_job": _GET_JOB,
    }
    return Statements(schema=schema, **{k: compose(v, schema) for k, v in templates.items()})
