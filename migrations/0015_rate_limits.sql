-- Shigoto 0015: rate limits held for the whole fleet. One row per limiter, keyed by what it
-- limits: 'worker:<name>', 'worker:<name>:<partition>', 'queue:<name>',
-- 'queue:<name>:<partition>'. A runner admitting a job locks the row, decides with the pure
-- algorithm (shigoto.flow.rate_limit) on the database clock, and writes the new state, in one
-- transaction: the limit is exact however many runners there are.
-- Runs with search_path set to the configured schema; re-runnable.

CREATE TABLE IF NOT EXISTS shigoto_rate_limits (
    key        text        PRIMARY KEY,
    -- The algorithm's state (a few numbers, or the sliding window's start log) wrapped with
    -- the limit's settings, so a limit whose settings changed starts afresh.
    state      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- The latest start reserved: how far ahead the limiter is booked (status, cleanup).
    booked_to  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT shigoto_rate_limits_key_check CHECK (length(key) BETWEEN 1 AND 500)
);
