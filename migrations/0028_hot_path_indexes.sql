-- Shigoto 0028: the hot path pays only for the hot path (issue 26, docs/benchmarks.md).
-- Runs with search_path set to the configured schema; re-runnable: IF EXISTS only.
--
-- A job's state change is never a HOT update (state is in the predicate of the partial
-- indexes), so every UPDATE of a row writes a new entry into every index whose predicate the
-- new row meets. 0019's listing indexes on (queue, id) and (worker, id) cover every row: each
-- job paid six entries for them (insert, claim, completion, two each), for pages of
-- `shigoto jobs list` and the dashboard, which no runner reads. Dropped, a no-op job's
-- processing writes about 30 % less WAL (1,220 -> 850 bytes a job at concurrency 50).
--
-- What reads them now: a page filtered by queue or worker walks the primary key backwards
-- (measured in docs/benchmarks.md at 10 M finished rows); a queue's live jobs are found by
-- the partial indexes of their state (claim, stage, executing); the names of the queues that
-- have jobs (ops_statements.JOB_QUEUES_CTE) by a loose scan of the claim index plus the live
-- states and the newest finished rows. The archive keeps its listing indexes: nothing hot
-- writes it.
-- @step
DROP INDEX CONCURRENTLY IF EXISTS shigoto_jobs_queue_list_idx;
-- @step
DROP INDEX CONCURRENTLY IF EXISTS shigoto_jobs_worker_list_idx;
