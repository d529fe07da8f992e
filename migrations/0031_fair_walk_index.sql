-- Shigoto 0031: the fair claim reads its own index, whatever the statistics say (issue 26).
-- Runs with search_path set to the configured schema; re-runnable: IF [NOT] EXISTS only.
--
-- 0017's fair-claim index and the claim index had the same predicate (state = 'available')
-- and both lead with the queue, so the fair pick could be planned on either. While the
-- table's statistics predate a fair queue's jobs (its first burst, before autovacuum has
-- analysed the table), the planner expects one row for the queue and walks the partition keys
-- through the claim index plus a sort: the whole backlog read for every key, 430-460 ms a
-- claim on 20,000 jobs (PostgreSQL 15, auto_explain), a fair queue at 0.08x a plain one.
-- The same index under a predicate written `(state = 'available') IS TRUE` can serve only a
-- query that says so, and only the fair pick does (db/fair_statements.py): its plan no longer
-- depends on the statistics, and the plain claim still sees nothing but the claim index. An
-- insert writes one entry in it, as it did in the old one.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_fair_walk_idx
    ON shigoto_jobs (queue, (coalesce(partition_key, '')), priority DESC, scheduled_at, id)
    WHERE (state = 'available') IS TRUE;
-- @step
DROP INDEX CONCURRENTLY IF EXISTS shigoto_jobs_fair_claim_idx;
