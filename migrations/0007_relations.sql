-- Shigoto 0007: the columns by which jobs relate to each other (workflows and batches).
-- Behaviour (triggers, tables, indexes) comes with each feature's own migration; these are
-- columns only, so every insert path writes them from the start.

-- The parents a job waits for (workflows), and what happens to it when one of them is
-- discarded or cancelled: 'cancel' (cascading to its own children) or 'run'.
ALTER TABLE shigoto_jobs ADD COLUMN IF NOT EXISTS depends_on bigint[];
ALTER TABLE shigoto_jobs ADD COLUMN IF NOT EXISTS on_parent_failure text;
-- The batch a job belongs to (shigoto.batch); counted when the job reaches a final state.
ALTER TABLE shigoto_jobs ADD COLUMN IF NOT EXISTS batch_id bigint;

ALTER TABLE shigoto_jobs DROP CONSTRAINT IF EXISTS shigoto_jobs_on_parent_failure_check;
ALTER TABLE shigoto_jobs ADD CONSTRAINT shigoto_jobs_on_parent_failure_check
    CHECK (on_parent_failure IS NULL OR on_parent_failure IN ('cancel', 'run')) NOT VALID;

ALTER TABLE shigoto_jobs_archive ADD COLUMN IF NOT EXISTS depends_on bigint[];
ALTER TABLE shigoto_jobs_archive ADD COLUMN IF NOT EXISTS on_parent_failure text;
ALTER TABLE shigoto_jobs_archive ADD COLUMN IF NOT EXISTS batch_id bigint;

-- @step: the scan of every job, holding no lock that enqueue or claim waits for
ALTER TABLE shigoto_jobs VALIDATE CONSTRAINT shigoto_jobs_on_parent_failure_check;
