"""The statements of flow control (migrations 0015 and 0016): locking and saving the fleet's
rate limiters and circuit breakers, and handing a job back to wait for its turn.

Decisions are made in Python by the pure policies of `shigoto.flow`, between a statement that
locks the rows and one that writes them back, in one transaction; times are the database's
(`clock_timestamp()` read after the lock, so a decision never uses a time older than the one
the previous holder of the lock used).
"""

from __future__ import annotations

import functools

from psycopg import sql

#: The key in a job's `meta` that holds its reserved start (`at`, seconds since the epoch),
#: the attempt it was reserved for and the time it was scheduled to be claimed again (`wake`).
SLOT_META = "shigoto_rate_slot"

# Create the limiters that do not exist yet and lock them all, in key order (so two runners
# locking the same keys can never deadlock). The conflict update is what takes the row lock;
# RETURNING is computed after it, so the clock is read once the lock is held.
LOCK_LIMITERS = """
INSERT INTO {limits} AS l (key)
SELECT k FROM unnest(%(keys)s::text[]) AS k ORDER BY k
ON CONFLICT (key) DO UPDATE SET updated_at = clock_timestamp()
RETURNING l.key, l.state, extract(epoch FROM clock_timestamp())::float8 AS now
"""

SAVE_LIMITERS = """
UPDATE {limits} AS l
SET state = u.state, booked_to = to_timestamp(u.at), updated_at = clock_timestamp()
FROM unnest(%(keys)s::text[], %(states)s::jsonb[], %(ats)s::float8[]) AS u(key, state, at)
WHERE l.key = u.key
"""

# A job admitted for a start a moment ahead waits in its runner: its start is recorded as the
# reserved time, which is when it will begin. Guarded like every write of a claimed job.
HOLD_JOB = """
UPDATE {jobs} SET attempted_at = to_timestamp(%(at)s)
WHERE id = %(id)s AND state = 'executing' AND attempted_by = %(node)s
"""

# HOLD_JOB for the jobs of one batch of reservations, in one statement.
HOLD_JOBS = """
UPDATE {jobs} AS j SET attempted_at = to_timestamp(h.at)
FROM unnest(%(ids)s::bigint[], %(ats)s::float8[]) AS h(id, at)
WHERE j.id = h.id AND j.state = 'executing' AND j.attempted_by = %(node)s
"""

# A job whose turn is further ahead goes back to wait, scheduled to be claimed again just
# before its reserved start (`wake`), with its attempt given back and the reservation written
# in its meta: the claim that finds it there starts it at its time without asking the limiter
# again (its slot is already counted).
DEFER_RESERVED = f"""
UPDATE {{jobs}}
SET state = 'scheduled', attempt = attempt - 1, attempted_by = NULL,
    scheduled_at = to_timestamp(%(wake)s),
    meta = meta || jsonb_build_object('{SLOT_META}', jsonb_build_object(
        'at', %(at)s::float8, 'wake', %(wake)s::float8, 'attempt', attempt))
WHERE id = %(id)s AND state = 'executing' AND attempted_by = %(node)s
RETURNING id
"""

# A job handed back to wait until `wake` with nothing reserved (a breaker of its partition is
# open): attempt given back.
DEFER = """
UPDATE {jobs}
SET state = 'scheduled', attempt = attempt - 1, attempted_by = NULL,
    scheduled_at = to_timestamp(%(wake)s)
WHERE id = %(id)s AND state = 'executing' AND attempted_by = %(node)s
RETURNING id
"""

# The breakers of a job, read without a lock: a closed breaker admits at once, and most are.
READ_BREAKER = """
SELECT status, state, extract(epoch FROM clock_timestamp())::float8 AS now
FROM {breakers} WHERE key = %(key)s
"""

# Create the breaker if needed and lock it; the clock is read after the lock (see above).
LOCK_BREAKER = """
INSERT INTO {breakers} AS b (key, worker, partition_key)
VALUES (%(key)s, %(worker)s, %(partition)s)
ON CONFLICT (key) DO UPDATE SET updated_at = clock_timestamp()
RETURNING b.state, extract(epoch FROM clock_timestamp())::float8 AS now
"""

SAVE_BREAKER = """
UPDATE {breakers}
SET status = %(status)s, state = %(state)s, blocked_until = to_timestamp(%(blocked)s),
    updated_at = clock_timestamp()
WHERE key = %(key)s
"""

# Workers whose whole-worker breaker blocks them now: the claim leaves their jobs in place.
BLOCKED_WORKERS = """
SELECT worker FROM {breakers}
WHERE key = ANY(%(keys)s::text[]) AND blocked_until > clock_timestamp()
"""

# The leader's pruner forgets limiters booked up to more than `after` seconds ago and breakers
# closed and untouched that long: one row per partition key would otherwise pile up for every
# tenant ever seen. A forgotten limiter or breaker starts afresh, as a new one would. Bounded
# batches, like the pruning of jobs; SKIP LOCKED so a runner deciding on a row is never waited
# for (that row is not idle anyway).
FORGET_IDLE_LIMITERS = """
DELETE FROM {limits} WHERE key IN (
    SELECT key FROM {limits}
    WHERE coalesce(booked_to, updated_at) < now() - make_interval(secs => %(after)s)
      AND updated_at < now() - make_interval(secs => %(after)s)
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
"""

FORGET_IDLE_BREAKERS = """
DELETE FROM {breakers} WHERE key IN (
    SELECT key FROM {breakers}
    WHERE status = 'closed' AND updated_at < now() - make_interval(secs => %(after)s)
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
"""


@functools.cache
def compose(template: str, schema: str) -> str:
    """Fill a template's table names for `schema`."""
    return (
        sql.SQL(template)
        .format(
            jobs=sql.Identifier(schema, "shigoto_jobs"),
            limits=sql.Identifier(schema, "shigoto_rate_limits"),
            breakers=sql.Identifier(schema, "shigoto_breakers"),
        )
        .as_string(None)
    )


__all__ = [
    "BLOCKED_WORKERS", "DEFER", "DEFER_RESERVED", "FORGET_IDLE_BREAKERS",
    "FORGET_IDLE_LIMITERS", "HOLD_JOB", "HOLD_JOBS", "LOCK_BREAKER", "LOCK_LIMITERS",
    "READ_BREAKER", "SAVE_BREAKER", "SAVE_LIMITERS", "SLOT_META", "compose",
]  # fmt: skip
