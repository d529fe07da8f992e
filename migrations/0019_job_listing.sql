-- Shigoto 0019: indexes for listing jobs (shigoto.list_jobs, `shigoto jobs list`, the
-- dashboard). Pages are ordered by id, newest first, over shigoto_jobs and its archive
-- (docs/jobs.md); a filter the primary key cannot serve made each page read the whole table
-- (a queue or worker with few or no jobs: every row examined to fill a page of 50).
-- Runs with search_path set to the configured schema; re-runnable: IF NOT EXISTS only.

-- Live table: queue and worker, in id order, so a page of one queue or worker is an index
-- range read backwards from the cursor. Both columns never change after insert. State is
-- left to the existing partial indexes (claim, stage, executing, finished) and the primary
-- key: a (state, id) index would take a new entry on every transition of every job.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_queue_list_idx ON shigoto_jobs (queue, id);
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_worker_list_idx ON shigoto_jobs (worker, id);
-- @step

-- Archive: rows are written once, in batches by the pruner, and never updated, so its
-- indexes cost nothing on any job's path; it gets every filter the live table has.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_archive_queue_list_idx
    ON shigoto_jobs_archive (queue, id);
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_archive_worker_list_idx
    ON shigoto_jobs_archive (worker, id);
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_archive_state_list_idx
    ON shigoto_jobs_archive (state, id);
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_archive_tags_idx ON shigoto_jobs_archive USING gin (tags);
