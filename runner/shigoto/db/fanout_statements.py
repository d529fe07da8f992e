"""The statements of fan-out queues (migration 0012): a runner's claim of its own deliveries,
the record of one delivery's outcome, and the sweep that finishes jobs whose runners are gone.
"""

from __future__ import annotations

import functools

from psycopg import sql

from shigoto.job import JOB_COLUMNS, JobState

#: What a fan-out claim returns for the job's own columns: the row is not changed by a
#: delivery, so the attempt, state and runner are the delivery's.
_AS_DELIVERED = {
    "state": f"'{JobState.EXECUTING}'",
    "attempt": "1",
    "attempted_at": "now()",
    "attempted_by": "%(node)s",
}

# A runner takes the available jobs of the queue that were inserted while it was serving
# (its node row existed) and that it has not taken yet. The delivery row's primary key is the
# claim: another session of the same runner cannot take the job twice, other runners are not
# blocked (no row lock on the job).
CLAIM = f"""
WITH me AS (
    SELECT started_at FROM {{nodes}} WHERE id = %(node)s
), picked AS (
    SELECT j.id FROM {{jobs}} AS j, me
    WHERE j.state = 'available' AND j.queue = %(queue)s AND j.inserted_at >= me.started_at
      AND NOT EXISTS (SELECT 1 FROM {{deliveries}} AS d
                      WHERE d.job_id = j.id AND d.node_id = %(node)s)
    ORDER BY j.priority DESC, j.scheduled_at, j.id
    LIMIT %(limit)s
), taken AS (
    INSERT INTO {{deliveries}} (job_id, node_id)
    SELECT id, %(node)s FROM picked
    ON CONFLICT DO NOTHING
    RETURNING job_id
)
SELECT {", ".join(_AS_DELIVERED.get(c, f"j.{c}") for c in JOB_COLUMNS)}
FROM {{jobs}} AS j JOIN taken ON j.id = taken.job_id
"""

# Guarded by state: a delivery is finished once.
FINISH_DELIVERY = """
UPDATE {deliveries} SET state = %(state)s, finished_at = now(), error = %(error)s
WHERE job_id = %(id)s AND node_id = %(node)s AND state = 'executing'
"""

# A delivery the runner handed back without an outcome: its next claim takes the job again.
RELEASE_DELIVERY = """
DELETE FROM {deliveries} WHERE job_id = %(id)s AND node_id = %(node)s AND state = 'executing'
"""

# Run after FINISH_DELIVERY, as its own statement: the function must see that delivery.
FINISH_JOBS = "SELECT {finish}(%(ids)s::bigint[])"

# The leader's sweep: fan-out jobs whose required runners stopped or died, or that no runner
# was serving when they were inserted, are finished here rather than by a delivery. The jobs
# are read per fan-out queue through the claim index, in its order, so with no fan-out queue
# the tick reads no job at all, however big the table. (It once took them `ORDER BY id` from
# every queue named by an InitPlan: on a table of 10 M finished rows the planner walked the
# whole primary key for that order, 3.4 s per tick, and the snapshot it held kept dead claim-
# index entries alive, halving the runners' throughput.)
SWEEP_PICK = """
SELECT j.id
FROM (SELECT name FROM {queues} WHERE fanout) AS q
CROSS JOIN LATERAL (
    SELECT id FROM {jobs}
    WHERE state = 'available' AND queue = q.name
    ORDER BY priority DESC, scheduled_at, id
    LIMIT %(limit)s
) AS j
LIMIT %(limit)s
"""
SWEEP = "SELECT {finish}(array(" + SWEEP_PICK + "))"


@functools.cache
def compose(template: str, schema: str) -> sql.Composed:
    return sql.SQL(template).format(
        jobs=sql.Identifier(schema, "shigoto_jobs"),
        nodes=sql.Identifier(schema, "shigoto_nodes"),
        queues=sql.Identifier(schema, "shigoto_queues"),
        deliveries=sql.Identifier(schema, "shigoto_fanout_deliveries"),
        finish=sql.Identifier(schema, "shigoto_fanout_finish"),
    )
