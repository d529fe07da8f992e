-- Shigoto 0020: what the dashboard charts and the operator's view of each queue.
-- Runs with search_path set to the configured schema; re-runnable: IF NOT EXISTS only.

-- One row per queue per minute, written by the leading runner's sampler (runtime/sampler)
-- just after the minute ends. Past queue depth cannot be rebuilt from shigoto_jobs, so it is
-- recorded; the dashboard's hour of charts then reads 60 small rows per queue instead of
-- counting a table that may hold millions of finished jobs.
--   available, scheduled, executing, retryable: how many jobs were in that state at `at`;
--   completed, discarded, cancelled: how many jobs reached that state in the minute ending
--   at `at` (finished_at in [at - 1 minute, at)).
-- The primary key makes a sample idempotent: a new leader re-sampling a minute changes
-- nothing (INSERT ... ON CONFLICT DO NOTHING).
CREATE TABLE IF NOT EXISTS shigoto_stats (
    at         timestamptz NOT NULL,
    queue      text        NOT NULL,
    available  bigint      NOT NULL DEFAULT 0,
    scheduled  bigint      NOT NULL DEFAULT 0,
    executing  bigint      NOT NULL DEFAULT 0,
    retryable  bigint      NOT NULL DEFAULT 0,
    completed  bigint      NOT NULL DEFAULT 0,
    discarded  bigint      NOT NULL DEFAULT 0,
    cancelled  bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (at, queue)
);

-- The replicas the operator last set for the queue's runner Deployment, and when, so a
-- dashboard that reads only the database can show them. NULL: no operator manages it.
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS operator_replicas integer;
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS operator_replicas_at timestamptz;
