"""The runner's SQL: the statements of a job's life in the engine (claim, complete, put back,
stage, rescue, archive) and of its services (nodes, leadership, global limits), named and
composed once per schema. The insert path keeps its own in `insert_statements`, and features
theirs beside it, one `<feature>_statements` module each.

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

_NOTIFY_QUEUES = """
SELECT pg_notify({channel}, {schema_name} || '.' || q) FROM unnest(%(queues)s::text[]) AS q
"""

# The claim: one statement for every queue. `{pick}` is a CTE chain ending in `picked` (the ids
# to take, locked FOR UPDATE SKIP LOCKED so runners never wait on each other's rows): `_PICK`,
# priority order, or a shape's own (the fair round robin, db/fair_statements.PICK). Every pick
# has a `{filters}` slot where the claim plugins' conditions go (shigoto.runtime.plugins), each
# on the candidate row `j`, and takes `%(limit)s` rows at most. `{returning}` adds a shape's own
# columns after JOB_COLUMNS, which come first and in order, so the runner builds each Job
# positionally (Job.from_values). RECURSIVE is harmless for a pick that does not recurse.
_CLAIM = f"""
WITH RECURSIVE {{pick}}
UPDATE {{jobs}} AS j
SET state = {{executing}}, attempt = j.attempt + 1, attempted_at = now(),
    attempted_by = %(node)s, progress = NULL
FROM picked
WHERE j.id = picked.id
RETURNING {", ".join(f"j.{c}" for c in JOB_COLUMNS)}{{returning}}
"""

# The plain pick: the queue's available jobs by priority, then due time, then id (the claim
# index's order, so the plan is a range scan that stops at `limit`).
PICK = """picked AS (
    SELECT j.id FROM {jobs} AS j
    WHERE j.state = {available} AND j.queue = %(queue)s{filters}
    ORDER BY j.priority DESC, j.scheduled_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)"""

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
# attempt, same node) makes it idempotent: a retried write, or a job rescued and re-claimed
# elsewhere, is left untouched. A job an operator asked to cancel while it ran (migration 0023)
# ends `cancelled` whatever its attempt's outcome, unless that attempt completed: the work is
# done, and a cancel that came too late must not make a retry run it again (`{final}`).
# The guard is written `(...) IS TRUE` so that no index can serve it, leaving the batch's ids
# as the only way into the table (one primary-key probe per outcome). Written plainly, it
# matches shigoto_jobs_executing_idx; where the statistics say the table is (nearly) empty,
# after a TRUNCATE or a bulk load not yet analysed, the prepared plan then walks all this
# node's executing rows and rescans the whole batch for each: batch x executing row
# comparisons, seconds per write, and it stays until the next ANALYZE.
_COMPLETE = """
UPDATE {jobs} AS j
SET state = {final},
    attempt = CASE WHEN u.snooze AND {final} = u.state THEN j.attempt - 1 ELSE j.attempt END,
    scheduled_at = CASE WHEN u.delay IS NULL OR {final} <> u.state THEN j.scheduled_at
                        ELSE now() + make_interval(secs => u.delay) END,
    completed_at = CASE WHEN u.state = {completed} THEN now() ELSE j.completed_at END,
    finished_at = CASE WHEN {final} IN {finished} THEN now() END,
    result = CASE WHEN u.state = {completed} THEN u.result ELSE j.result END,
    errors = CASE WHEN u.error IS NULL AND j.cancel_requested_at IS NULL THEN j.errors
                  ELSE j.errors
                       || CASE WHEN u.error IS NULL THEN '[]'::jsonb
                          ELSE jsonb_build_array(u.error || jsonb_build_object('at', now())) END
                       || CASE WHEN {final} = u.state THEN '[]'::jsonb
                          ELSE jsonb_build_array(jsonb_build_object(
                              'attempt', j.attempt, 'at', now(), 'traceback', '',
                              'error', 'Cancelled: ' || coalesce(j.cancel_reason, 'cancelled')))
                          END
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

# Shutdown hands unfinished jobs back without consuming the attempt they were given; one an
# operator asked to cancel is cancelled instead: its perform has stopped.
_PUT_BACK = """
UPDATE {jobs}
SET state = CASE WHEN cancel_requested_at IS NULL THEN {available} ELSE {cancelled} END,
    attempt = CASE WHEN cancel_requested_at IS NULL THEN attempt - 1 ELSE attempt END,
    attempted_by = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE attempted_by END,
    scheduled_at = now(),
    finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE now() END,
    errors = CASE WHEN cancel_requested_at IS NULL THEN errors
                  ELSE errors || jsonb_build_array(jsonb_build_object(
                      'attempt', attempt, 'at', now(), 'traceback', '',
                      'error', 'Cancelled: ' || coalesce(cancel_reason, 'cancelled'))) END
WHERE id = ANY(%(ids)s) AND state = {executing} AND attempted_by = %(node)s
RETURNING id, queue
"""

# Cancels asked of jobs this node executes (`shigoto cancel`, migration 0023): read when a
# cancel NOTIFY names one (`ids`; any role that can connect may NOTIFY, so the row decides),
# and polled for all (`ids` NULL), so a notification lost with a connection is not a cancel
# lost. Served by shigoto_jobs_executing_idx (attempted_by, on executing rows).
_CANCEL_REQUESTS = """
SELECT id, coalesce(cancel_reason, 'cancelled') FROM {jobs}
WHERE state = {executing} AND attempted_by = %(node)s AND cancel_requested_at IS NOT NULL
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
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


# -- rescue (see shigoto.runtime.rescuer for the rules) ---------------------------------------

# Granted session advisory locks of this database (the liveness locks are the bigint form,
# objsubid 1), for `_liveness_held`.
_LOCKED = """locked AS MATERIALIZED (
    SELECT classid, objid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
)"""


def _liveness_held(node: str) -> str:
    """Whether the node named by the SQL expression `node` holds its liveness lock (the key of
    `_TAKE_LIVENESS`), as SQL over a `locked` CTE (`_LOCKED`)."""
    key = f"hashtextextended({{schema_name}} || ':' || coalesce({node}, ''), 0)"
    return (f"((({key} >> 32) & 4294967295)::oid, ({key} & 4294967295)::oid) "
            "IN (SELECT classid, objid FROM locked)")  # fmt: skip


def _rescued_state(job: str) -> str:
    """Where a rescued job of alias `job` goes, from its row alone (so any runner decides
    alike): cancelled if an operator asked, discarded once its attempts are used up, else
    available again."""
    return (f"CASE WHEN {job}.cancel_requested_at IS NOT NULL THEN {{cancelled}} "
            f"WHEN {job}.attempt >= coalesce({job}.max_attempts, %(default_max)s) "
            "THEN {discarded} ELSE {available} END")  # fmt: skip


# What every rescue sets besides its error entry, for the next state `d.state`.
_RESCUED = """
SET state = d.state,
    scheduled_at = {now},
    finished_at = CASE WHEN d.state IN ({discarded}, {cancelled}) THEN {now} END,
    meta = CASE WHEN d.state = {discarded}
                THEN j.meta || jsonb_build_object({pending}, true) ELSE j.meta END,"""


# One statement finds, decides and moves the stale jobs. `dead` tells the two kinds apart for
# the error entry; the next state comes from the row alone, so any leader decides alike. A node
# that still holds its liveness lock (its process is up, its session open) is never rescued,
# however long its heartbeat has been silent: a worker blocking the event loop stops the
# heartbeat, not the work, and a rescue would run the job a second time beside it. A job an
# operator asked to cancel is cancelled, not run again.
_RESCUE = (
    "WITH " + _LOCKED + """, stale AS (
    SELECT j.id, (n.id IS NULL OR n.last_seen_at < {now} - make_interval(secs => %(after)s))
                 AS dead
    FROM {jobs} AS j LEFT JOIN {nodes} AS n ON n.id = j.attempted_by
    WHERE j.state = {executing}
      AND j.attempted_at < {now} - make_interval(secs => %(after)s)
      AND (n.id IS NULL OR n.last_seen_at < {now} - make_interval(secs => %(after)s)
           OR j.attempted_at < {now} - make_interval(
                  secs => coalesce(j.timeout + %(after)s, %(stuck_after)s)))
      AND NOT """ + _liveness_held("j.attempted_by") + """
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), decided AS (
    SELECT j.id, s.dead, """ + _rescued_state("j") + """ AS state
    FROM {jobs} AS j JOIN stale AS s ON s.id = j.id
)
UPDATE {jobs} AS j""" + _RESCUED + """
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', {now}, 'traceback', '',
        'error', CASE WHEN d.state = {cancelled}
                      THEN 'Cancelled: ' || coalesce(j.cancel_reason, 'cancelled') || '; '
                      ELSE '' END
                 || 'rescued from node ' || coalesce(j.attempted_by, '?') || CASE WHEN d.dead
            THEN ': it stopped heartbeating while executing this job'
            ELSE ': executing for longer than its timeout plus rescue_after (or stuck_after '
                 || 'without a timeout of its own), and it holds no liveness lock' END))
FROM decided AS d
WHERE j.id = d.id
RETURNING j.id, j.queue, j.state, j.attempted_by, d.dead
"""
)

# A runner's own executing rows claimed more than `after` ago (shigoto.runtime.rescuer's
# OrphanSweep keeps those it holds no task for), through shigoto_jobs_executing_idx.
_OWN_EXECUTING = """
SELECT id, attempt FROM {jobs}
WHERE state = {executing} AND attempted_by = %(node)s
  AND attempted_at < {now} - make_interval(secs => %(after)s)
"""

# Returns a runner's own orphans as the rescue does (same next state, attempt counted),
# guarded by node and attempt so a row written or re-claimed meanwhile is left alone.
_RESCUE_OWN = (
    "UPDATE {jobs} AS j" + _RESCUED + """
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', {now}, 'traceback', '',
        'error', 'returned by its own node ' || j.attempted_by
                 || ': no task of it held this job any more'))
FROM (
    SELECT j2.id, """ + _rescued_state("j2") + """ AS state
    FROM {jobs} AS j2
    JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS o(id, attempt)
      ON o.id = j2.id AND o.attempt = j2.attempt
    WHERE j2.state = {executing} AND j2.attempted_by = %(node)s
    FOR UPDATE OF j2
) AS d
WHERE j.id = d.id
RETURNING j.id
"""
)

# Nodes silent past rescue_after are dead, whether or not they left jobs behind, unless they
# still hold their liveness lock (a blocked event loop): those stay listed, silent.
_FORGET_NODES = (
    "WITH " + _LOCKED + """
DELETE FROM {nodes} AS n
WHERE n.last_seen_at < {now} - make_interval(secs => %(after)s)
  AND NOT """ + _liveness_held("n.id") + """
RETURNING n.id
"""
)

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

# -- global limits (see shigoto.runtime.global_limits and .liveness) --------------------------

# A session advisory lock per node (bigint key, so objsubid 1 in pg_locks): held by the node's
# limiter connection for as long as the process lives. `_BUSY` computes the same key.
_TAKE_LIVENESS = """
SELECT pg_try_advisory_lock(hashtextextended({schema_name} || ':' || %(node)s, 0))
"""

# Proves the node alive between heartbeats; same clock as the heartbeat. Its lease (`_BUSY`'s
# `grace`) runs from its commit, never earlier than the runner sent it: the runner's fence
# counts from the sending.
_PROVE = "UPDATE {nodes} SET last_seen_at = {now} WHERE id = %(node)s"

# The rows of jobs a fenced runner stopped that may be put back: the very attempts it stopped,
# still executing on it (the rescuer may have returned one meanwhile, and this node claimed it
# again), locked until the put-back in the same transaction.
_LOCK_STOPPED_ATTEMPTS = """
SELECT j.id FROM {jobs} AS j
JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS s(id, attempt)
  ON j.id = s.id AND j.attempt = s.attempt
WHERE j.state = {executing} AND j.attempted_by = %(node)s
ORDER BY j.id
FOR UPDATE OF j
"""

# Whether the runner of executing row `j` (joined to its node `n`, with `locked` the granted
# advisory locks) may still be running it; see shigoto.runtime.liveness.
RUNNER_MAY_LIVE = """(
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
  AND """ + RUNNER_MAY_LIVE + """
GROUP BY {column}
"""

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
    notify_queues: str
    claim: str
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
    cancel_requests: str
    own_executing: str
    rescue_own: str
    rescue: str
    forget_nodes: str
    pending_workers: str
    take_pending: str
    notify_discards: str
    take_liveness: str
    prove: str
    lock_stopped_attempts: str
    busy_by_queue: str
    busy_by_worker: str
    lock_scope: str
    acquire_lease: str
    resign_lease: str

    @property
    def jobs_table(self) -> sql.Identifier:
        return sql.Identifier(self.schema, "shigoto_jobs")


def _state_literal(state: JobState) -> sql.Literal:
    return sql.Literal(state.value)


# Placeholders every template may use besides the tables: each state by its name (so no state is
# spelled out in SQL), the finished states as one list in JobState's order (matching the partial
# indexes' predicates), and the time of a decision.
_FIXED_PARTS: dict[str, sql.Composable] = {
    **{state.value: _state_literal(state) for state in JobState},
    "finished": sql.SQL("({})").format(
        sql.SQL(", ").join(_state_literal(s) for s in JobState if s in FINISHED_STATES)
    ),
    "now": sql.SQL("coalesce(%(now)s::timestamptz, now())"),
    "pending": sql.Literal(ON_DISCARD_PENDING),
    "final": sql.SQL(
        "(CASE WHEN j.cancel_requested_at IS NOT NULL AND u.state <> {c} THEN {x} "
        "ELSE u.state END)"
    ).format(c=_state_literal(JobState.COMPLETED), x=_state_literal(JobState.CANCELLED)),
    "discard_channel": sql.Literal(DISCARD_CHANNEL),
}

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
def claim(
    schema: str, pick: str = PICK, filters: tuple[str, ...] = (), returning: str = ""
) -> str:
    """The claim for `schema` with `pick`, its `{filters}` slot holding each condition of
    `filters` (claim plugins' `Fragment.where`, which may use the same placeholders as any
    template), and `returning` after the job's columns. Cached: the variants a runner uses
    are few, and each stays one prepared statement."""
    where = "".join(f"\n      AND ({condition})" for condition in filters)
    picked = _compose(pick, schema, filters=sql.SQL(_compose(where, schema)))
    return _compose(_CLAIM, schema, pick=sql.SQL(picked), returning=sql.SQL(returning))


@functools.cache
def statements(schema: str) -> Statements:
    """Compose (once) every statement for `schema`."""
    templates = {
        "notify_queues": _NOTIFY_QUEUES,
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
        "cancel_requests": _CANCEL_REQUESTS,
        "own_executing": _OWN_EXECUTING,
        "rescue_own": _RESCUE_OWN,
        "rescue": _RESCUE,
        "forget_nodes": _FORGET_NODES,
        "pending_workers": _PENDING_WORKERS,
        "take_pending": _TAKE_PENDING,
        "notify_discards": _NOTIFY_DISCARDS,
        "take_liveness": _TAKE_LIVENESS,
        "prove": _PROVE,
        "lock_stopped_attempts": _LOCK_STOPPED_ATTEMPTS,
        "lock_scope": _LOCK_SCOPE,
        "acquire_lease": _ACQUIRE,
        "resign_lease": _RESIGN,
    }
    variants = {
        "claim": claim(schema),
        "archive": _compose(_ARCHIVE, schema, now=_DB_NOW),
        "delete_archived": _compose(_DELETE_ARCHIVED, schema, now=_DB_NOW),
        "busy_by_queue": _compose(_BUSY, schema, column=sql.Identifier("j", "queue")),
        "busy_by_worker": _compose(_BUSY, schema, column=sql.Identifier("j", "worker")),
    }
    composed = {k: compose(v, schema) for k, v in templates.items()}
    return Statements(schema=schema, **composed, **variants)
