"""The statements of the per-minute queue stats (migration 0020's `shigoto_stats`): the
leader's sample (`shigoto.runtime.sampler`), its catch-up, and the pruner's delete.

Composed per schema by `ops_statements.compose` (tables `{jobs}`, `{queues}`, `{nodes}`,
`{stats}`). Times come in as parameters: the sampler reads the database's clock once per tick
(`NOW`, or a test's clock) and names the minutes it samples, so a sample never mixes clocks.
"""

from __future__ import annotations

from shigoto.db.ops_statements import JOB_QUEUES_CTE, LIVE_COUNTS_FRAGMENT

# The time a tick works with: the test clock's when given, else the database's.
NOW = "SELECT coalesce(%(now)s::timestamptz, now())"

# Minutes of a window that already have a sample (for any queue), through the primary key.
SAMPLED_MINUTES = """
SELECT DISTINCT at FROM {stats} WHERE at >= %(first)s AND at <= %(last)s
"""

# One row per (minute, queue) for %(minutes)s (each the END of its minute), for every queue
# with a job in the live table, a settings row or a runner serving it. Finished counts: jobs
# whose finished_at falls in [at - 1 minute, at), one range of the finished index per minute
# (a nested loop over the minutes, never the finished rows at large). Depth (jobs in each live
# state, from their partial indexes) is known only now, so only the minute %(depth_at)s gets
# it; earlier minutes caught up after a leader change keep depth 0 (it cannot be rebuilt).
# ON CONFLICT DO NOTHING: a minute another leader sampled stays as it wrote it.
SAMPLE = f"""
WITH RECURSIVE {JOB_QUEUES_CTE},
known AS (
    SELECT queue FROM job_queues WHERE queue IS NOT NULL
    UNION SELECT name FROM {{queues}}
    UNION SELECT jsonb_object_keys(queues) FROM {{nodes}} WHERE jsonb_typeof(queues) = 'object'
),
minutes AS (SELECT unnest(%(minutes)s::timestamptz[]) AS at),
depth AS (
    SELECT queue,
           coalesce(sum(n) FILTER (WHERE state = 'available'), 0) AS available,
           coalesce(sum(n) FILTER (WHERE state = 'scheduled'), 0) AS scheduled,
           coalesce(sum(n) FILTER (WHERE state = 'executing'), 0) AS executing,
           coalesce(sum(n) FILTER (WHERE state = 'retryable'), 0) AS retryable
    FROM ({LIVE_COUNTS_FRAGMENT}) AS live
    GROUP BY queue
),
done AS (
    SELECT m.at, j.queue,
           count(*) FILTER (WHERE j.state = 'completed') AS completed,
           count(*) FILTER (WHERE j.state = 'discarded') AS discarded,
           count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled
    FROM minutes AS m
    JOIN {{jobs}} AS j
      ON j.state IN ('completed', 'discarded', 'cancelled')
     AND j.finished_at >= m.at - interval '1 minute' AND j.finished_at < m.at
    GROUP BY m.at, j.queue
)
INSERT INTO {{stats}} AS s (at, queue, available, scheduled, executing, retryable,
                           completed, discarded, cancelled)
SELECT m.at, k.queue,
       CASE WHEN m.at = %(depth_at)s THEN coalesce(d.available, 0) ELSE 0 END,
       CASE WHEN m.at = %(depth_at)s THEN coalesce(d.scheduled, 0) ELSE 0 END,
       CASE WHEN m.at = %(depth_at)s THEN coalesce(d.executing, 0) ELSE 0 END,
       CASE WHEN m.at = %(depth_at)s THEN coalesce(d.retryable, 0) ELSE 0 END,
       coalesce(f.completed, 0), coalesce(f.discarded, 0), coalesce(f.cancelled, 0)
FROM minutes AS m
CROSS JOIN known AS k
LEFT JOIN depth AS d ON d.queue = k.queue
LEFT JOIN done AS f ON f.at = m.at AND f.queue = k.queue
ON CONFLICT (at, queue) DO NOTHING
"""

# The pruner: samples older than the retention go (a day of minutes per queue is kept).
PRUNE_STATS = """
DELETE FROM {stats}
WHERE at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(after)s)
"""
