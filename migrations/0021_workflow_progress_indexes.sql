-- Shigoto 0021: indexes for the progress of workflows with work left (`shigoto status`, the
-- dashboard), so listing them reads the workflows' own steps instead of every row of
-- shigoto_jobs (issue 14: costs that do not grow with the finished rows; a table of ten
-- million finished jobs took seconds).
-- Runs with search_path set to the configured schema; re-runnable: IF NOT EXISTS only.
--
-- Both are partial on `meta ? 'workflow'` (the builder's key, shigoto.relations.workflows):
-- a job outside a workflow never enters them, so its inserts and state changes pay only the
-- predicate's test. A workflow step pays one entry per row version in each, like every other
-- index of the table (a state change is never a HOT update: state is in index predicates).

-- The live steps of workflows, by workflow id: which workflows still have work left.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_workflow_live_idx
    ON shigoto_jobs ((meta -> 'workflow' ->> 'id'), id)
    WHERE meta ? 'workflow' AND state IN ('scheduled', 'available', 'executing', 'retryable');
-- @step

-- Every step of a workflow, finished ones included, for its counts.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_workflow_idx
    ON shigoto_jobs ((meta -> 'workflow' ->> 'id'))
    WHERE meta ? 'workflow';
