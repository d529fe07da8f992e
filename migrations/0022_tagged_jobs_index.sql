-- Shigoto 0022: the tags index holds tagged jobs only (issue 14: the cost of writing a job).
-- Runs with search_path set to the configured schema; re-runnable: IF EXISTS / IF NOT EXISTS.
--
-- The GIN index on every row cost each untagged job an entry at its insert and at each of its
-- state changes (a state change is never a HOT update: state is in index predicates), though
-- a tag filter can never match an untagged job. Measured on a bulk enqueue of 100,000 no-op
-- jobs, dropping that entry gave 17 % more jobs a second. The filters that read it
-- (shigoto.client.jobs, shigoto.ops.operations) repeat the predicate, which is what lets the
-- planner use a partial index.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_tagged_idx ON shigoto_jobs USING gin (tags)
    WHERE cardinality(tags) > 0;
-- @step
DROP INDEX CONCURRENTLY IF EXISTS shigoto_jobs_tags_idx;
