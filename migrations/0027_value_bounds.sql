-- Shigoto 0027: bounds on tags and on the error history, enforced by the table itself
-- (issue 24: one bad job must not bloat rows and memory). The client refuses more than 64 tags
-- or a tag over 255 characters (shigoto.jobspec), and the runner cuts each error message to
-- 64 KiB before it stores it (shigoto.errors); these stop rows written by hand, by an older
-- client or runner, or by a cron entry stored before the client checked. A CHECK cannot look
-- at each element of an array, so the length bound is on all of a job's tags together.
-- NOT VALID first (new and updated rows are checked at once), then validated apart, where the
-- scan blocks no writer; a row already over a bound leaves its constraint unvalidated, with a
-- notice, instead of failing the upgrade (as 0005 does). Re-runnable: each constraint is
-- dropped (if present) before it is added.

ALTER TABLE shigoto_jobs DROP CONSTRAINT IF EXISTS shigoto_jobs_tags_bounds_check;
ALTER TABLE shigoto_jobs ADD CONSTRAINT shigoto_jobs_tags_bounds_check
    CHECK (cardinality(tags) <= 64 AND char_length(array_to_string(tags, '')) <= 16320) NOT VALID;

ALTER TABLE shigoto_jobs DROP CONSTRAINT IF EXISTS shigoto_jobs_errors_size_check;
ALTER TABLE shigoto_jobs ADD CONSTRAINT shigoto_jobs_errors_size_check
    CHECK (pg_column_size(errors) <= 33554432) NOT VALID;

ALTER TABLE shigoto_cron DROP CONSTRAINT IF EXISTS shigoto_cron_tags_bounds_check;
ALTER TABLE shigoto_cron ADD CONSTRAINT shigoto_cron_tags_bounds_check
    CHECK (cardinality(tags) <= 64 AND char_length(array_to_string(tags, '')) <= 16320) NOT VALID;

-- @step: validated apart, where the scan blocks no writer
DO $$
DECLARE
    target record;
BEGIN
    FOR target IN SELECT * FROM (VALUES
        ('shigoto_jobs', 'shigoto_jobs_tags_bounds_check'),
        ('shigoto_jobs', 'shigoto_jobs_errors_size_check'),
        ('shigoto_cron', 'shigoto_cron_tags_bounds_check')) AS t (tab, name) LOOP
        BEGIN
            EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT %I', target.tab, target.name);
        EXCEPTION WHEN check_violation THEN
            RAISE NOTICE 'constraint % left unvalidated: an existing row is over its bound',
                target.name;
        END;
    END LOOP;
END
$$;
