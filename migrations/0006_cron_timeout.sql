-- Shigoto 0006: a cron schedule carries its jobs' timeout, as every other enqueue can.
-- Before, a slot's job was inserted without one, so rescue by attempt age could not apply the
-- worker's own limit. NULL keeps the meaning it has on a job: the worker's setting at run time.

ALTER TABLE shigoto_cron ADD COLUMN IF NOT EXISTS timeout double precision;
ALTER TABLE shigoto_cron DROP CONSTRAINT IF EXISTS shigoto_cron_timeout_check;
ALTER TABLE shigoto_cron ADD CONSTRAINT shigoto_cron_timeout_check
    CHECK (timeout IS NULL OR timeout > 0);
