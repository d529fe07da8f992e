-- Shigoto 0017: fair queues and the queue settings flow control reads. A fair queue claims
-- round-robin across partition keys (the first job of every partition before the second of
-- any); `partition_concurrency` caps how many jobs of one partition execute at once across
-- all runners; `weight` shares a runner's capacity between its queues; `rate_limit` limits how
-- many jobs of the queue start per period (docs/flow-control.md).
-- Runs with search_path set to the configured schema; re-runnable: IF NOT EXISTS, and every
-- constraint dropped (if present) before it is added.

ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS fair boolean NOT NULL DEFAULT false;
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS weight integer NOT NULL DEFAULT 1;
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS partition_concurrency integer;
-- RateLimit.to_json(); NULL (never '{}') when the queue has none.
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS rate_limit jsonb;

-- The rules the client enforces (shigoto.client.queue_settings, shigoto.RateLimit), so a row
-- written by hand or by an older client cannot hold a value every runner would refuse.
ALTER TABLE shigoto_queues DROP CONSTRAINT IF EXISTS shigoto_queues_weight_check;
ALTER TABLE shigoto_queues ADD CONSTRAINT shigoto_queues_weight_check CHECK (weight >= 1);
ALTER TABLE shigoto_queues DROP CONSTRAINT IF EXISTS shigoto_queues_partition_concurrency_check;
ALTER TABLE shigoto_queues ADD CONSTRAINT shigoto_queues_partition_concurrency_check
    CHECK (partition_concurrency IS NULL OR partition_concurrency >= 1);

-- A function because the rules read several fields; immutable, it reads nothing but its input.
CREATE OR REPLACE FUNCTION shigoto_rate_limit_valid(rate_limit jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT rate_limit IS NULL OR (
        jsonb_typeof(rate_limit) = 'object'
        AND rate_limit - 'limit' - 'per' - 'algorithm' - 'burst' - 'by_partition' = '{}'::jsonb
        AND jsonb_typeof(rate_limit -> 'limit') = 'number'
        AND jsonb_typeof(coalesce(rate_limit -> 'per', '1')) = 'number'
        AND jsonb_typeof(coalesce(rate_limit -> 'burst', '0')) = 'number'
        AND jsonb_typeof(coalesce(rate_limit -> 'algorithm', '"gcra"')) = 'string'
        AND jsonb_typeof(coalesce(rate_limit -> 'by_partition', 'false')) = 'boolean'
        AND CASE WHEN jsonb_typeof(rate_limit -> 'limit') = 'number'
                  AND jsonb_typeof(coalesce(rate_limit -> 'per', '1')) = 'number'
                  AND jsonb_typeof(coalesce(rate_limit -> 'burst', '0')) = 'number'
            THEN (rate_limit ->> 'limit')::numeric >= 1
             AND (rate_limit ->> 'limit')::numeric = trunc((rate_limit ->> 'limit')::numeric)
             AND coalesce((rate_limit ->> 'per')::numeric, 1) > 0
             AND coalesce((rate_limit ->> 'burst')::numeric, 0) >= 0
             AND coalesce((rate_limit ->> 'burst')::numeric, 0)
                 = trunc(coalesce((rate_limit ->> 'burst')::numeric, 0))
             AND coalesce(rate_limit ->> 'algorithm', 'gcra')
                 IN ('gcra', 'token_bucket', 'sliding_window', 'leaky_bucket')
             AND NOT (coalesce(rate_limit ->> 'algorithm', 'gcra') = 'leaky_bucket'
                      AND coalesce((rate_limit ->> 'burst')::numeric, 0) <> 0)
             AND NOT (coalesce(rate_limit ->> 'algorithm', 'gcra') = 'sliding_window'
                      AND (rate_limit ->> 'limit')::numeric
                          + coalesce((rate_limit ->> 'burst')::numeric, 0) > 10000)
            ELSE false END
    )
$$;
ALTER TABLE shigoto_queues DROP CONSTRAINT IF EXISTS shigoto_queues_rate_limit_check;
ALTER TABLE shigoto_queues ADD CONSTRAINT shigoto_queues_rate_limit_check
    CHECK (shigoto_rate_limit_valid(rate_limit));

-- The fair claim walks the distinct partition keys of a queue's available jobs (a skip scan:
-- one index probe per key) and then reads the first few jobs of each key in claim order, so
-- a partition with a backlog of millions costs what one with ten does. A job without a key is
-- in partition '' (a key is never empty: migration 0014), which keeps NULL indexable by `=`.
-- Partial like the claim index: finished rows never enter it.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_fair_claim_idx
    ON shigoto_jobs (queue, (coalesce(partition_key, '')), priority DESC, scheduled_at, id)
    WHERE state = 'available';
