-- Shigoto 0014: partition keys. A job may carry a partition key (a tenant, an account): fair
-- queues claim round-robin across partition keys, and rate limits and circuit breakers may be
-- kept per partition key (docs/flow-control.md). NULL is the one partition of every job
-- enqueued without a key.
-- Runs with search_path set to the configured schema; re-runnable.

ALTER TABLE shigoto_jobs ADD COLUMN IF NOT EXISTS partition_key text;
ALTER TABLE shigoto_jobs_archive ADD COLUMN IF NOT EXISTS partition_key text;

-- The client refuses longer keys with a ValidationError naming partition_key; this stops rows
-- written by hand or by an older client: a key is read on every fair claim and shows up in
-- logs and telemetry.
ALTER TABLE shigoto_jobs DROP CONSTRAINT IF EXISTS shigoto_jobs_partition_key_check;
ALTER TABLE shigoto_jobs ADD CONSTRAINT shigoto_jobs_partition_key_check
    CHECK (partition_key IS NULL OR length(partition_key) BETWEEN 1 AND 200) NOT VALID;

-- @step: the scan of every job, holding no lock that enqueue or claim waits for
ALTER TABLE shigoto_jobs VALIDATE CONSTRAINT shigoto_jobs_partition_key_check;
