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
#: Names rescued jobs whose `on_discard` is still to be called ("<schema>.<id>").
DISCARD_CHANNEL = "shigoto_discard"
#: The `meta` key marking a rescued, discarded job whose `on_discard` has not been called yet.
ON_DISCARD_PENDING = "on_discard_pending"

# Named, not `*`: the archive's columns are the jobs table's plus archived_at, and columns added
# by later migrations land in a different position in each table.
_COLUMNS = ", ".join(JOB_COLUMNS)

_INSERT_ONE = """
WITH input AS (
    SELECT coalesce(%(scheduled_at)s::timestamptz,
                    now() + make_interval(secs => %(delay)s::float8)) AS at
), ins AS (
    INSERT INTO {jobs} (queue, worker, args, state, priority, max_attempts, timeout,
                        scheduled_at, tags, meta, depends_on, on_parent_failure, batch_id,
                        partition_key)
    SELECT %(queue)s, %(worker)s, %(args)s,
           CASE WHEN input.at <= now() THEN {available} ELSE {scheduled} END,
           %(priority)s, %(max_attempts)s, %(timeout)s, input.at, %(tags)s, %(meta)s,
           %(depends_on)s::bigint[], %(on_parent_failure)s, %(batch_id)s, %(partition_key)s
    FROM input
    RETURNING id, queue, state, scheduled_at, inserted_at
)
-- The NOTIFY is delivered at commit, so a rolled-back enqueue wakes nobody. Only what the
-- database assigned comes back: the client knows the rest (client._job).
SELECT ins.id, ins.state, ins.scheduled_at, ins.inserted_at,
       CASE WHEN ins.state = {available}
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
             scheduled_at, inserted_at, tags, meta, depends_on, on_parent_failure, batch_id,
             partition_key)
FROM STDIN (FORMAT BINARY)
"""

_NOTIFY_QUEUES = """
SELECT pg_notify({channel}, {schema_name} || '.' || q) FROM unnest(%(queues)s::text[]) AS q
"""

# Returns JOB_COLUMNS in order, so the runner builds each Job positionally (Job.from_values).
# Two optional parts make its four variants (see `_claim_parts`): `{exclude}` leaves out the
# jobs of workers at their global limit, so other jobs of the queue run instead of being claimed
# and handed straight back; `{limit}` caps the claim at the room a queue's global limit has left.
# `{min_priority}` is load shedding's floor (NULL: every priority), a range on the claim index.
_CLAIM = f"""
WITH picked AS (
    SELECT id FROM {{jobs}}
    WHERE state = {{available}} AND queue = %(queue)s{{exclude}}
      AND priority >= {{min_priority}}
    ORDER BY priority DESC, scheduled_at, id
    LIMIT {{limit}}
    FOR UPDATE SKIP LOCKED
)
UPDATE {{jobs}} AS j
SET state = {{executing}}, attempt = j.attempt + 1, attempted_at = now(),
    attempted_by = %(node)s, progress = NULL
FROM picked
WHERE j.id = picked.id
RETURNING {", ".join(f"j.{c}" for c in JOB_COLUMNS)}
"""

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
# The guard is written `(...) IS TRUE` so that no index can serve it, leaving the batch's ids
# as the only way into the table (one primary-key probe per outcome). Written plainly, it
# matches shigoto_jobs_executing_idx; where the statistics say the table is (nearly) empty,
# after a TRUNCATE or a bulk load not yet analysed, the prepared plan then walks all this
# node's executing rows and rescans the whole batch for each: batch x executing row
# comparisons, seconds per write, and it stays until the next ANALYZE.
_COMPLETE = """
UPDATE {jobs} AS j
SET state = u.state,
    attempt = CASE WHEN u.snooze THEN j.attempt - 1 ELSE j.attempt END,
    scheduled_at = CASE WHEN u.delay IS NULL THEN j.scheduled_at
                        ELSE now() + make_interval(secs => u.delay) END,
    completed_at = CASE WHEN u.state = {completed} THEN now() ELSE j.completed_at END,
    finished_at = CASE WHEN u.state IN {finished} THEN now() END,
    result = CASE WHEN u.state = {completed} THEN u.result ELSE j.result END,
    errors = CASE WHEN u.error IS NULL THEN j.errors
                  ELSE j.errors || jsonb_build_array(u.error || jsonb_build_object('at', now()))
             END,
    progress = coalesce(u.progress, j.progress)
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(states)s::text[], %(delays)s::float8[],
            %(results)s::jsonb[], %(errors)s::jsonb[], %(snoozes)s::bool[],
            %(progresses)s::int[])
     AS u(id, attempt, state, delay, result, error, snooze, progress)
WHERE j.id = u.id AND j.attempt = u.attempt
  AND (j.state = {executing} AND j.attempted_by = %(node)s) IS TRUE
RETURNING j.id
"""

# Shutdown hands unfinished jobs back without consuming the attempt they were given.
_PUT_BACK = """
UPDATE {jobs}
SET state = {available}, attempt = attempt - 1, attempted_by = NULL, scheduled_at = now()
WHERE id = ANY(%(ids)s) AND state = {executing} AND attempted_by = %(node)s
RETURNING id, queue
"""

_PROGRESS = """
UPDATE {jobs} SET progress = %(progress)s
WHERE id = %(id)s AND state = {executing} AND attempt = %(attempt)s
"""

# Time decisions take the clock's `%(now)s` (NULL: the database's own clock; see shigoto.clock),
# so tests move time instead of sleeping.
_STAGE = """
WITH due AS (
    SELECT id FROM {jobs}
    WHERE state IN ({scheduled}, {retryable}) AND scheduled_at <= {now}
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), staged AS (
    UPDATE {jobs} AS j SET state = {available}
    FROM due WHERE j.id = due.id
    RETURNING j.queue
)
SELECT queue, count(*) AS count,
       pg_notify({channel}, {schema_name} || '.' || queue) IS NULL AS _woke
FROM staged GROUP BY queue
"""

# Ages count from when a job finished, not from when it was inserted. `{now}` is the database's
# now() for `shigoto prune` (ops) and the clock's for the pruner service.
_ARCHIVE = f"""
WITH old AS (
    SELECT id FROM {{jobs}}
    WHERE state IN {{finished}} AND finished_at < {{now}} - make_interval(secs => %(after)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM {{jobs}} AS j USING old WHERE j.id = old.id RETURNING j.*
)
INSERT INTO {{archive}} ({_COLUMNS}, archived_at)
SELECT {_COLUMNS}, {{now}} FROM moved
ON CONFLICT (id) DO NOTHING
"""

_DELETE_ARCHIVED = """
DELETE FROM {archive} WHERE id IN (
    SELECT id FROM {archive}
    WHERE archived_at < {now} - make_interval(secs => %(after)s)
    LIMIT %(limit)s
)
"""

# The heartbeat: the rescuer reads `last_seen_at` against the same clock.
_NODE_UPSERT = """
INSERT INTO {nodes} (id, hostname, pid, queues, last_seen_at)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, {now})
ON CONFLICT (id) DO UPDATE SET queues = excluded.queues, last_seen_at = excluded.last_seen_at
"""

_NODE_DELETE = "DELETE FROM {nodes} WHERE id = %(id)s"

_OLDEST_AVAILABLE = """
SELECT queue, extract(epoch FROM now() - min(scheduled_at))::float8 AS age
FROM {jobs} WHERE state = {available} GROUP BY queue
"""

_NODES = """
SELECT id, hostname, pid, queues, started_at, last_seen_at,
       extract(epoch FROM now() - last_seen_at)::float8 AS silent_for
FROM {nodes} ORDER BY started_at
"""

_STALE_EXECUTING = """
SELECT j.id, j.queue, j.worker, j.attempted_by, j.attempted_at
FROM {jobs} AS j LEFT JOIN {nodes} AS n ON n.id = j.attempted_by
WHERE j.state = {executing}
  AND (n.id IS NULL OR n.last_seen_at < now() - make_interval(secs => %(stale_after)s))
ORDER BY j.attempted_at
"""

_GET_JOB = "SELECT * FROM {jobs} WHERE id = %(id)s"

# Read before acting on a cancel notification: any role that can connect may NOTIFY, so the
# notification is only a hint and the row decides.
_JOB_STATE = "SELECT state FROM {jobs} WHERE id = %(id)s"

# -- rescue (see shigoto.runtime.rescuer for the rules) ---------------------------------------

# One statement finds, decides and moves the stale jobs. `dead` tells the two kinds apart for
# the error entry; the next state comes from the row alone, so any leader decides alike.
_RESCUE = """
WITH stale AS (
    SELECT j.id, (n.id IS NULL OR n.last_seen_at < {now} - make_interval(secs => %(after)s))
                 AS dead
    FROM {jobs} AS j LEFT JOIN {nodes} AS n ON n.id = j.attempted_by
    WHERE j.state = {executing}
      AND j.attempted_at < {now} - make_interval(secs => %(after)s)
      AND (n.id IS NULL OR n.last_seen_at < {now} - make_interval(secs => %(after)s)
           OR j.attempted_at < {now} - make_interval(
                  secs => coalesce(j.timeout + %(after)s, %(stuck_after)s)))
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), decided AS (
    SELECT j.id, s.dead,
           CASE WHEN j.attempt >= coalesce(j.max_attempts, %(default_max)s)
                THEN {discarded} ELSE {available} END AS state
    FROM {jobs} AS j JOIN stale AS s ON s.id = j.id
)
UPDATE {jobs} AS j
SET state = d.state,
    scheduled_at = {now},
    finished_at = CASE WHEN d.state = {discarded} THEN {now} END,
    meta = CASE WHEN d.state = {discarded}
                THEN j.meta || jsonb_build_object({pending}, true) ELSE j.meta END,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', {now}, 'traceback', '',
        'error', 'rescued from node ' || coalesce(j.attempted_by, '?') || CASE WHEN d.dead
            THEN ': it stopped heartbeating while executing this job'
            ELSE ': executing for longer than its timeout plus rescue_after (or stuck_after '
                 || 'without a timeout of its own), while the node lives' END))
FROM decided AS d
WHERE j.id = d.id
RETURNING j.id, j.queue, j.state, j.attempted_by, d.dead
"""

# Nodes silent past rescue_after are dead, whether or not they left jobs behind.
_FORGET_NODES = """
DELETE FROM {nodes} WHERE last_seen_at < {now} - make_interval(secs => %(after)s)
RETURNING id
"""

_PENDING_WORKERS = """
SELECT id, worker FROM {jobs}
WHERE id = ANY(%(ids)s) AND state = {discarded} AND meta ? {pending}
"""

# Removing the mark is the claim: of all runners trying, exactly one gets the row back.
_TAKE_PENDING = f"""
UPDATE {{jobs}} SET meta = meta - {{pending}}
WHERE id = ANY(%(ids)s) AND state = {{discarded}} AND meta ? {{pending}}
RETURNING {", ".join(JOB_COLUMNS)}
"""

# Announces pending on_discard calls to runners that may know the worker.
_NOTIFY_DISCARDS = """
SELECT pg_notify({discard_channel}, {schema_name} || '.' || id)
FROM unnest(%(ids)s::bigint[]) AS id
"""

# -- global limits (see shigoto.runtime.limiter for the rules) ---------------------------------

# A session advisory lock per node (bigint key, so objsubid 1 in pg_locks): held by the node's
# limiter connection for as long as the process lives. `_BUSY` computes the same key.
_TAKE_LIVENESS = """
SELECT pg_try_advisory_lock(hashtextextended({schema_name} || ':' || %(node)s, 0))
"""

# Proves the node alive between heartbeats; same clock as the heartbeat.
_PROVE = "UPDATE {nodes} SET last_seen_at = {now} WHERE id = %(node)s"

# Whether the runner of executing row `j` (joined to its node `n`, with `locked` the granted
# advisory locks) may still be running it; see shigoto.runtime.limiter.
_RUNNER_MAY_LIVE = """(
    n.last_seen_at > now() - make_interval(secs => %(grace)s)
    OR pg_postmaster_start_time() > now() - make_interval(secs => %(restart_grace)s)
    OR (((hashtextextended({schema_name} || ':' || j.attempted_by, 0) >> 32)
          & 4294967295)::oid,
        (hashtextextended({schema_name} || ':' || j.attempted_by, 0) & 4294967295)::oid)
       IN (SELECT classid, objid FROM locked))"""

# Executing rows of the scope (`{column}`: queue or worker) whose runner may still be running
# them: its liveness lock is held, or it proved itself within `grace`, or the server restarted
# so recently that nobody had the time to take their lock again. Measured on the database's
# clock: the liveness rules compare against pg_postmaster_start_time() and live locks.
_BUSY = """
WITH locked AS MATERIALIZED (
    SELECT classid, objid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT {column}, count(*) AS busy
FROM {jobs} AS j LEFT JOIN {nodes} AS n ON n.id = j.attempted_by
WHERE j.state = {executing} AND {column} = ANY(%(names)s::text[])
  AND """ + _RUNNER_MAY_LIVE + """
GROUP BY {column}
"""

# The fair claim (a queue with `fair`): round-robin across partition keys. A partition's
# `turn` for its n-th job offered is n plus its jobs executing now, so the first job of every
# partition is claimed before the second of any, and a partition whose jobs already fill the
# runners waits behind one with none (claims of one slot stay fair); within a turn, claim
# order.
# - `keys` walks the distinct keys of the queue's available jobs, one index probe per key (a
#   skip scan on shigoto_jobs_fair_claim_idx), never reading a partition's backlog; a job
#   without a key is in partition ''. At most `window` keys per claim, from just after
#   `{after}` (the last key the runner's previous claim walked), so a queue with thousands of
#   keys costs the same per claim; the claimer starts again from the first key once a walk
#   reaches the end, so every key gets its turn.
# - Each partition offers its first `share` jobs in claim order (LIMIT, SKIP LOCKED: rows other
#   claims hold are passed over, never waited for), so the rows read and locked stay near
#   `limit` plus one per partition. Each row also returns `share` (the claimer asks again
#   when a partition gave its whole share and the claim is still short), the last key walked
#   and whether the walk reached the end.
# - `busy` counts the queue's executing jobs per partition (a scan of the executing rows only).
#   `cap` (partition_concurrency, NULL: none) lowers each partition's share to the room its
#   executing jobs leave, those counted like a global limit's (their runner may live); the
#   claimer takes the queue's transaction lock first, so the count and the claim are one
#   decision.
_CLAIM_FAIR = (
    """
WITH RECURSIVE keys(k, n) AS (
    (SELECT coalesce(partition_key, ''), 1 FROM {jobs}
     WHERE state = {available} AND queue = %(queue)s{after}
     ORDER BY coalesce(partition_key, '') LIMIT 1)
    UNION ALL
    SELECT (SELECT coalesce(j.partition_key, '') FROM {jobs} AS j
            WHERE j.state = {available} AND j.queue = %(queue)s
              AND coalesce(j.partition_key, '') > keys.k
            ORDER BY coalesce(j.partition_key, '') LIMIT 1),
           keys.n + 1
    FROM keys WHERE keys.k IS NOT NULL AND keys.n < %(window)s
), parts AS MATERIALIZED (
    SELECT k FROM keys WHERE k IS NOT NULL
), share AS (
    SELECT greatest(1, ceil(%(limit)s::numeric / greatest(count(*), 1)))::int AS n FROM parts
), locked AS MATERIALIZED (
    SELECT classid, objid FROM pg_locks
    WHERE %(cap)s::int IS NOT NULL AND locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), busy AS (
    SELECT coalesce(j.partition_key, '') AS k, count(*) AS running,
           count(*) FILTER (WHERE %(cap)s::int IS NOT NULL AND """
    + _RUNNER_MAY_LIVE
    + f""") AS n
    FROM {{jobs}} AS j LEFT JOIN {{nodes}} AS n ON n.id = j.attempted_by
    WHERE j.state = {{executing}} AND j.queue = %(queue)s
    GROUP BY 1
), offered AS (
    SELECT c.id, c.priority, c.scheduled_at,
           coalesce(b.running, 0)
           + row_number() OVER (PARTITION BY p.k
                                ORDER BY c.priority DESC, c.scheduled_at, c.id) AS turn
    FROM parts AS p
    CROSS JOIN share AS s
    LEFT JOIN busy AS b ON b.k = p.k
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.scheduled_at FROM {{jobs}} AS j
        WHERE j.state = {{available}} AND j.queue = %(queue)s
          AND coalesce(j.partition_key, '') = p.k
          AND j.priority >= {{min_priority}}{{exclude}}
        ORDER BY j.priority DESC, j.scheduled_at, j.id
        LIMIT greatest(0, least(s.n, coalesce(%(cap)s::int - b.n, %(cap)s::int, s.n)))
        FOR UPDATE OF j SKIP LOCKED
    ) AS c
), picked AS (
    SELECT id FROM offered ORDER BY turn, priority DESC, scheduled_at, id LIMIT %(limit)s
)
UPDATE {{jobs}} AS j
SET state = {{executing}}, attempt = j.attempt + 1, attempted_at = now(),
    attempted_by = %(node)s, progress = NULL
FROM picked
WHERE j.id = picked.id
RETURNING {", ".join(f"j.{c}" for c in JOB_COLUMNS)}, (SELECT n FROM share) AS share,
          (SELECT max(k) FROM parts) AS last_key,
          (SELECT count(*) < %(window)s FROM parts) AS walked_to_the_end
"""
)

# Serialises the admissions of one limit until the end of the transaction (objsubid 2: the
# two-int form, apart from the liveness locks).
_LOCK_SCOPE = "SELECT pg_advisory_xact_lock(%(scope)s, -1)"

# -- leadership (see shigoto.runtime.elector) --------------------------------------------------

# Take the lease if it is free, expired or already ours; renew it if ours. No row back means
# someone else holds a live lease.
_ACQUIRE = """
INSERT INTO {leaders} AS l (name, leader_id, elected_at, expires_at)
VALUES (%(name)s, %(id)s, {now}, {now} + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE
    SET leader_id = excluded.leader_id,
        elected_at = CASE WHEN l.leader_id = excluded.leader_id
                          THEN l.elected_at ELSE excluded.elected_at END,
        expires_at = excluded.expires_at
    WHERE l.leader_id = excluded.leader_id OR l.expires_at < {now}
RETURNING leader_id
"""

# Only our own row: a stopping node must not end a lease someone else took meanwhile.
_RESIGN = "DELETE FROM {leaders} WHERE name = %(name)s AND leader_id = %(id)s"


def listen(channel: str) -> sql.Composed:
    """`LISTEN` on `channel` (an identifier, never a parameter in PostgreSQL)."""
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel))


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
    claim_limited: str
    claim_excluding_limited: str
    claim_fair: str
    claim_fair_excluding: str
    claim_fair_after: str
    claim_fair_excluding_after: str
    slots_held: str
    complete: str
    put_back: str
    progress: str
    stage: str
    archive: str
    delete_archived: str
    archive_at: str
    delete_archived_at: str
    node_upsert: str
    node_delete: str
    oldest_available: str
    nodes: str
    stale_executing: str
    get_job: str
    job_state: str
    rescue: str
    forget_nodes: str
    pending_workers: str
    take_pending: str
    notify_discards: str
    take_liveness: str
    prove: str
    busy_by_queue: str
    busy_by_worker: str
    lock_scope: str
    acquire_lease: str
    resign_lease: str

    @property
    def jobs_table(self) -> sql.Identifier:
        return sql.Identifier(self.schema, "shigoto_jobs")


def _literal(state: JobState) -> sql.Literal:
    return sql.Literal(state.value)


# Placeholders every template may use besides the tables: each state by its name (so no state is
# spelled out in SQL), the finished states as one list in JobState's order (matching the partial
# indexes' predicates), the time of a decision, and the optional parts of the claim.
_FIXED_PARTS: dict[str, sql.Composable] = {
    **{state.value: _literal(state) for state in JobState},
    "finished": sql.SQL("({})").format(
        sql.SQL(", ").join(_literal(s) for s in JobState if s in FINISHED_STATES)
    ),
    "now": sql.SQL("coalesce(%(now)s::timestamptz, now())"),
    "exclude": sql.SQL(""),
    "limit": sql.SQL("%(limit)s"),
    "min_priority": sql.SQL("coalesce(%(min_priority)s::int, -2147483648)"),
    "after": sql.SQL(""),
    "pending": sql.Literal(ON_DISCARD_PENDING),
    "discard_channel": sql.Literal(DISCARD_CHANNEL),
}

# The claim's variants: leaving saturated workers out, and capped by a queue's global limit.
_EXCLUDE = sql.SQL(" AND worker <> ALL(%(exclude)s::text[])")
_LIMITED = sql.SQL("least(%(limit)s, %(room)s)")
# The fair claim's walk over keys, continued after the previous claim's last key.
_AFTER = sql.SQL(" AND coalesce(partition_key, '') > %(after)s")
# The database's own clock, for statements that ops runs outside any service.
_DB_NOW = sql.SQL("now()")


def _compose(template: str, schema: str, **parts: sql.Composable) -> str:
    return (
        sql.SQL(template)
        .format(
            jobs=sql.Identifier(schema, "shigoto_jobs"),
            archive=sql.Identifier(schema, "shigoto_jobs_archive"),
            nodes=sql.Identifier(schema, "shigoto_nodes"),
            cron=sql.Identifier(schema, "shigoto_cron"),
            queues=sql.Identifier(schema, "shigoto_queues"),
            leaders=sql.Identifier(schema, "shigoto_leaders"),
            jobs_name=sql.Literal(f'"{schema}".shigoto_jobs'),
            schema_name=sql.Literal(schema),
            channel=sql.Literal(INSERT_CHANNEL),
            **{**_FIXED_PARTS, **parts},
        )
        .as_string(None)
    )


@functools.cache
def compose(template: str, schema: str) -> str:
    """Fill a template's table names, channel and states for `schema`."""
    return _compose(template, schema)


@functools.cache
def statements(schema: str) -> Statements:
    """Compose (once) every statement for `schema`."""
    templates = {
        "insert_one": _INSERT_ONE,
        "reserve_ids": _RESERVE_IDS,
        "copy_jobs": _COPY_JOBS,
        "notify_queues": _NOTIFY_QUEUES,
        "claim": _CLAIM,
        "claim_fair": _CLAIM_FAIR,
        "slots_held": _SLOTS_HELD,
        "complete": _COMPLETE,
        "put_back": _PUT_BACK,
        "progress": _PROGRESS,
        "stage": _STAGE,
        "archive_at": _ARCHIVE,
        "delete_archived_at": _DELETE_ARCHIVED,
        "node_upsert": _NODE_UPSERT,
        "node_delete": _NODE_DELETE,
        "oldest_available": _OLDEST_AVAILABLE,
        "nodes": _NODES,
        "stale_executing": _STALE_EXECUTING,
        "get_job": _GET_JOB,
        "job_state": _JOB_STATE,
        "rescue": _RESCUE,
        "forget_nodes": _FORGET_NODES,
        "pending_workers": _PENDING_WORKERS,
        "take_pending": _TAKE_PENDING,
        "notify_discards": _NOTIFY_DISCARDS,
        "take_liveness": _TAKE_LIVENESS,
        "prove": _PROVE,
        "lock_scope": _LOCK_SCOPE,
        "acquire_lease": _ACQUIRE,
        "resign_lease": _RESIGN,
    }
    variants = {
        "claim_excluding": _compose(_CLAIM, schema, exclude=_EXCLUDE),
        "claim_limited": _compose(_CLAIM, schema, limit=_LIMITED),
        "claim_excluding_limited": _compose(_CLAIM, schema, exclude=_EXCLUDE, limit=_LIMITED),
        "claim_fair_excluding": _compose(_CLAIM_FAIR, schema, exclude=_EXCLUDE),
        "claim_fair_after": _compose(_CLAIM_FAIR, schema, after=_AFTER),
        "claim_fair_excluding_after": _compose(
            _CLAIM_FAIR, schema, exclude=_EXCLUDE, after=_AFTER
        ),
        "archive": _compose(_ARCHIVE, schema, now=_DB_NOW),
        "delete_archived": _compose(_DELETE_ARCHIVED, schema, now=_DB_NOW),
        "busy_by_queue": _compose(_BUSY, schema, column=sql.Identifier("j", "queue")),
        "busy_by_worker": _compose(_BUSY, schema, column=sql.Identifier("j", "worker")),
    }
    composed = {k: compose(v, schema) for k, v in templates.items()}
    return Statements(schema=schema, **composed, **variants)
