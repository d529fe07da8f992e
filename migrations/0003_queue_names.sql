-- Shigoto 0003: one rule for queue names everywhere (enqueue, CLI, SHIGOTO_QUEUES, the CRD's
-- pattern, and here): a letter or digit, then letters, digits, '.', '_' or '-'; at most 128.
-- Names like these are safe in URLs, label values, metric labels and `NAME=N` lists.
-- Written to be re-runnable: every constraint is dropped (if present) before it is added.

DO $$
DECLARE
    bad text;
BEGIN
    SELECT queue INTO bad FROM (
        SELECT queue FROM shigoto_jobs
        UNION SELECT queue FROM shigoto_cron
        UNION SELECT name FROM shigoto_queues
    ) AS q WHERE queue !~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' OR char_length(queue) > 128 LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'queue name % breaks the queue name rule', quote_literal(bad)
            USING HINT = 'rename it (UPDATE shigoto_jobs SET queue = ...), or finish or delete '
                         'its jobs, then run shigoto migrate again';
    END IF;
END
$$;

ALTER TABLE shigoto_jobs DROP CONSTRAINT IF EXISTS shigoto_jobs_queue_name_check;
ALTER TABLE shigoto_jobs ADD CONSTRAINT shigoto_jobs_queue_name_check
    CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' AND char_length(queue) <= 128) NOT VALID;

ALTER TABLE shigoto_cron DROP CONSTRAINT IF EXISTS shigoto_cron_queue_name_check;
ALTER TABLE shigoto_cron ADD CONSTRAINT shigoto_cron_queue_name_check
    CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' AND char_length(queue) <= 128);

ALTER TABLE shigoto_queues DROP CONSTRAINT IF EXISTS shigoto_queues_name_check;
ALTER TABLE shigoto_queues ADD CONSTRAINT shigoto_queues_name_check
    CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' AND char_length(name) <= 128);

-- @step: the scan of every job, holding no lock that enqueue or claim waits for
ALTER TABLE shigoto_jobs VALIDATE CONSTRAINT shigoto_jobs_queue_name_check;
