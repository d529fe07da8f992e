-- Shigoto 0002: cron schedules, per-queue settings shared by all runners, slot-unique jobs.

-- A job may carry a key that no other live or finished job shares. Cron uses it to enqueue
-- each slot once, whichever scheduler leads and however often it retries.
ALTER TABLE shigoto_jobs ADD COLUMN unique_key text;
ALTER TABLE shigoto_jobs_archive ADD COLUMN unique_key text;
-- @step
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_unique_key_idx ON shigoto_jobs (unique_key)
    WHERE unique_key IS NOT NULL;
-- @step

CREATE TABLE shigoto_cron (
    name            text        PRIMARY KEY,
    expression      text        NOT NULL,
    timezone        text        NOT NULL DEFAULT 'UTC',
    worker          text        NOT NULL,
    args            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    queue           text        NOT NULL DEFAULT 'default',
    priority        integer     NOT NULL DEFAULT 0,
    max_attempts    integer,
    tags            text[]      NOT NULL DEFAULT '{}',
    enabled         boolean     NOT NULL DEFAULT true,
    -- 'latest': after downtime enqueue only the newest missed slot; 'all': every missed slot,
    -- oldest first, at most catch_up_limit of them; 'none': skip missed slots.
    catch_up        text        NOT NULL DEFAULT 'latest',
    catch_up_limit  integer     NOT NULL DEFAULT 100,
    -- The newest slot already enqueued (or skipped on purpose); catch-up starts after it.
    last_slot_at    timestamptz,
    last_job_id     bigint,
    inserted_at     timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT shigoto_cron_catch_up_check CHECK (catch_up IN ('latest', 'all', 'none')),
    CONSTRAINT shigoto_cron_limit_check CHECK (catch_up_limit BETWEEN 1 AND 10000),
    CONSTRAINT shigoto_cron_attempts_check CHECK (max_attempts IS NULL OR max_attempts >= 1),
    CONSTRAINT shigoto_cron_args_check CHECK (jsonb_typeof(args) = 'object')
);

-- Settings of a queue that every runner must agree on, so they live in the database.
CREATE TABLE shigoto_queues (
    name                text        PRIMARY KEY,
    global_concurrency  integer,
    paused              boolean     NOT NULL DEFAULT false,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT shigoto_queues_limit_check
        CHECK (global_concurrency IS NULL OR global_concurrency >= 1)
);

-- Takes up to `wanted` free slots of a global concurrency limit as session advisory locks
-- (key pair: scope, slot number). The locks live exactly as long as the runner's session: a
-- runner that dies frees its slots at once, no cleanup needed. `held` lists the slots this
-- session already has; advisory locks are re-entrant, so they must be skipped, not re-taken.
CREATE FUNCTION shigoto_take_slots(scope integer, slots integer, wanted integer,
                                   held integer[])
RETURNS integer[] LANGUAGE plpgsql AS $$
DECLARE
    got integer[] := '{}';
BEGIN
    FOR i IN 0 .. slots - 1 LOOP
        EXIT WHEN cardinality(got) >= wanted;
        CONTINUE WHEN i = ANY(held);
        IF pg_try_advisory_lock(scope, i) THEN
            got := got || i;
        END IF;
    END LOOP;
    RETURN got;
END
$$;
