"""The statements of the queue settings flow control reads (fair, weight,
partition_concurrency, rate_limit; migration 0017), composed per schema and column.

The fair claim's pick (`PICK`, which the claim of `runtime_statements` wraps), the writes of
`set_queue` and the watcher's read.
"""

from __future__ import annotations

import functools

from psycopg import sql

from shigoto.db.runtime_statements import RUNNER_MAY_LIVE

#: The settings columns these statements may name, with the value a queue without a settings
#: row has: writing that value creates no row, as turning fan-out or forwarding off does not.
FLOW_DEFAULTS: dict[str, object] = {
    "fair": False,
    "weight": 1,
    "partition_concurrency": None,
    "rate_limit": None,
}

#: The queue's job defaults (migration 0029, `shigoto.client.queue_defaults`), written by the
#: same statements as the flow settings; None, their default, creates no row.
JOB_DEFAULT_COLUMNS = (
    "default_max_attempts", "default_priority", "default_timeout", "default_backoff")  # fmt: skip

# Every setting the runners read, in `QueueSetting`'s order; one indexed read per interval.
# The job defaults are read through to_jsonb, so a runner of this release also reads a schema
# that 0029 has not reached yet (they are then None) instead of failing mid-upgrade.
READ_SETTINGS = """
SELECT name, global_concurrency, paused, fanout, fair, weight, partition_concurrency, rate_limit,
       encrypted, (to_jsonb(q) ->> 'default_max_attempts')::int,
       (to_jsonb(q) ->> 'default_priority')::int, (to_jsonb(q) ->> 'default_timeout')::float8,
       to_jsonb(q) -> 'default_backoff'
FROM {queues} AS q WHERE name = ANY(%(names)s)
"""

# Written only when it differs, and RETURNING says whether it did (like `forward` and
# `fanout`), so the operator can write it on every pass and report a change only when there
# was one.
_SET = """
INSERT INTO {queues} AS q (name, {column}) VALUES (%(name)s, %(value)s)
ON CONFLICT (name) DO UPDATE SET {column} = excluded.{column}, updated_at = now()
    WHERE q.{column} IS DISTINCT FROM excluded.{column}
RETURNING q.name
"""

# Back to the default: creates no settings row for a queue that has none.
_RESET = """
UPDATE {queues} SET {column} = %(value)s, updated_at = now()
WHERE name = %(name)s AND {column} IS DISTINCT FROM %(value)s
RETURNING name
"""


# The fair pick (a queue with `fair`, runtime.fair_claim): round-robin across partition keys. A
# partition's `turn` for its n-th job offered is n plus its jobs executing now, so the first job
# of every partition is claimed before the second of any, and a partition whose jobs already fill
# the runners waits behind one with none. Within a turn, partitions go in the order of the walk,
# which starts just after `%(after)s`, the partition the runner's previous claim served last: the
# executing rows alone cannot say who was served last, since a finished job's row may be written
# back before the next claim (then its partition's turn is not raised, and ties went to the oldest
# job: one job per claim turned FIFO).
# - `keys` walks the distinct keys of the queue's available jobs, one index probe per key (a
#   skip scan on shigoto_jobs_fair_walk_idx), never reading a partition's backlog; a job
#   without a key is in partition ''. From the first key after `after` to the last, then from
#   the first key (`lap`) up to `after` itself, so the partition served last comes last; at
#   most `window` keys, so a queue with thousands of keys costs the same per claim and the
#   next claim continues where this one stopped. `after` '' (no claim yet) walks every named
#   key, then ''.
# - Every read of available rows says `(j.state = 'available') IS TRUE`, the predicate of the
#   fair walk index (migration 0031) and of no other: the plan cannot fall back on the claim
#   index plus a sort when the statistics predate the queue's jobs.
# - Each partition offers its first `share` jobs in claim order (LIMIT, SKIP LOCKED: rows other
#   claims hold are passed over, never waited for), so the rows read and locked stay near
#   `limit` plus one per partition. Each row also returns `share` (the fair claim asks again
#   when a partition gave its whole share and the claim is still short), and its `turn` and
#   walk position `n` (its next `after` is the key of the greatest).
# - `busy` counts the queue's executing jobs per partition (a scan of the executing rows only).
#   `cap` (partition_concurrency, NULL: none) lowers each partition's share to the room its
#   executing jobs leave, those counted like a global limit's (their runner may live); the
#   fair claim takes the queue's transaction lock first, so the count and the claim are one
#   decision.
# Returns the `picked` ids with their `turn` and `n`; `RETURNING_EXTRA` adds them (and the
# share) after the job's columns. Claim plugins' conditions go in `{filters}`, on each
# partition's candidates.
PICK = (
    """keys(k, n, lap) AS (
    SELECT %(after)s::text, 0, false
    UNION ALL
    SELECT coalesce(later.k, first.k), keys.n + 1, keys.lap OR later.k IS NULL
    FROM keys
    LEFT JOIN LATERAL (
        SELECT coalesce(j.partition_key, '') AS k FROM {jobs} AS j
        WHERE (j.state = {available}) IS TRUE AND j.queue = %(queue)s
          AND coalesce(j.partition_key, '') > keys.k
        ORDER BY coalesce(j.partition_key, '') LIMIT 1
    ) AS later ON true
    LEFT JOIN LATERAL (
        SELECT coalesce(j.partition_key, '') AS k FROM {jobs} AS j
        WHERE later.k IS NULL AND NOT keys.lap
          AND (j.state = {available}) IS TRUE AND j.queue = %(queue)s
        ORDER BY coalesce(j.partition_key, '') LIMIT 1
    ) AS first ON true
    WHERE keys.k IS NOT NULL AND keys.n < %(window)s
      AND NOT (keys.lap AND keys.k >= %(after)s::text)
), parts AS MATERIALIZED (
    SELECT k, n FROM keys
    WHERE n > 0 AND k IS NOT NULL AND NOT (lap AND k > %(after)s::text)
), share AS (
    SELECT greatest(1, ceil(%(limit)s::numeric / greatest(count(*), 1)))::int AS n FROM parts
), locked AS MATERIALIZED (
    SELECT classid, objid FROM pg_locks
    WHERE %(cap)s::int IS NOT NULL AND locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), busy AS (
    SELECT coalesce(j.partition_key, '') AS k, count(*) AS running,
           count(*) FILTER (WHERE %(cap)s::int IS NOT NULL AND """
    + RUNNER_MAY_LIVE
    + """) AS n
    FROM {jobs} AS j LEFT JOIN {nodes} AS n ON n.id = j.attempted_by
    WHERE j.state = {executing} AND j.queue = %(queue)s
    GROUP BY 1
), offered AS (
    SELECT c.id, p.n,
           coalesce(b.running, 0)
           + row_number() OVER (PARTITION BY p.k
                                ORDER BY c.priority DESC, c.scheduled_at, c.id) AS turn
    FROM parts AS p
    CROSS JOIN share AS s
    LEFT JOIN busy AS b ON b.k = p.k
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.scheduled_at FROM {jobs} AS j
        WHERE (j.state = {available}) IS TRUE AND j.queue = %(queue)s
          AND coalesce(j.partition_key, '') = p.k{filters}
        ORDER BY j.priority DESC, j.scheduled_at, j.id
        LIMIT greatest(0, least(s.n, coalesce(%(cap)s::int - b.n, %(cap)s::int, s.n)))
        FOR UPDATE OF j SKIP LOCKED
    ) AS c
), picked AS (
    SELECT id, turn, n FROM offered ORDER BY turn, n LIMIT %(limit)s
)"""
)

RETURNING_EXTRA = ", (SELECT n FROM share) AS share, picked.turn, picked.n"


def _queues(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "shigoto_queues")


@functools.cache
def read_settings(schema: str) -> sql.Composed:
    return sql.SQL(READ_SETTINGS).format(queues=_queues(schema))


@functools.cache
def write_setting(schema: str, column: str, *, default: bool) -> sql.Composed:
    """The write of one flow setting or job default; `default`: the value written is the
    column's default."""
    if column not in FLOW_DEFAULTS and column not in JOB_DEFAULT_COLUMNS:
        raise ValueError(f"not a flow setting or job default column: {column!r}")
    template = _RESET if default else _SET
    return sql.SQL(template).format(queues=_queues(schema), column=sql.Identifier(column))


__all__ = ["FLOW_DEFAULTS", "JOB_DEFAULT_COLUMNS", "READ_SETTINGS", "read_settings",
           "write_setting"]
