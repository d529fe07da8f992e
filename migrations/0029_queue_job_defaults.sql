-- Shigoto 0029: per-queue job defaults, and forwarding of completed jobs (issue 27; the seed
-- Gaffer's queue options `max_attempts`, `priority`, `timeout`, `backoff` and its
-- `forward => #{completed => audit}`).
--
-- Job defaults. A queue may say what its jobs get when neither the enqueue nor the worker says
-- (docs/jobs.md, "Queue defaults"): `default_max_attempts`, `default_timeout` and
-- `default_backoff` are read by the runners with the queue's other settings and applied when a
-- job runs (a job's own NULL `max_attempts`/`timeout` already means "decided when it runs");
-- `default_priority` is read by the client and written into the row at enqueue, because the
-- claim orders by the row's priority. Expand only: nullable columns without defaults rewrite
-- nothing, and shigoto_queues holds a row per queue, so its checks are added valid.
--
-- Forwarding of completed jobs. 0011 forwarded the final failures only; a queue may now
-- forward `completed` too (an audit trail, a simple pipeline). The copy is made by the same
-- step, `shigoto_forward_copy`, in the transaction that completes the job. What must not
-- change is the price of a plain completion, the hot path: until now the finalize trigger's
-- WHEN clause let completed jobs through without any call. A WHEN clause cannot read
-- shigoto_queues, so the queues that forward `completed` are noted once per transaction, by a
-- statement trigger before the first UPDATE of `state` in it, in a transaction-local setting
-- (`shigoto.completed_forwards`, '|a|b|', or '|' for none), and the row trigger's WHEN reads
-- that setting: a completion in a queue that does not forward calls no function, as before.
-- The setting is per transaction, so a change of `forward` reaches transactions that start
-- after it committed.
--
-- Runs with search_path set to the configured schema; re-runnable (IF NOT EXISTS, CREATE OR
-- REPLACE, constraints and triggers dropped if present before they are added). One
-- transactional step: the triggers take shigoto_jobs' lock for an instant, under migrate's
-- lock_timeout, retried.

ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS default_max_attempts integer;
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS default_priority integer;
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS default_timeout double precision;
-- Seconds to wait after each failed attempt, the last repeated: [5, 30, 300].
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS default_backoff jsonb;

-- The rule the client checks (shigoto.client.queue_defaults), for rows written by hand.
CREATE OR REPLACE FUNCTION shigoto_backoff_valid(backoff jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT backoff IS NULL OR (
        jsonb_typeof(backoff) = 'array'
        AND jsonb_array_length(backoff) BETWEEN 1 AND 100
        AND NOT EXISTS (
            SELECT FROM jsonb_array_elements(backoff) AS b(delay)
            WHERE jsonb_typeof(b.delay) <> 'number' OR (b.delay #>> '{}')::numeric < 0
               OR (b.delay #>> '{}')::numeric > 31536000
        )
    )
$$;

ALTER TABLE shigoto_queues DROP CONSTRAINT IF EXISTS shigoto_queues_job_defaults_check;
ALTER TABLE shigoto_queues ADD CONSTRAINT shigoto_queues_job_defaults_check CHECK (
    (default_max_attempts IS NULL OR default_max_attempts >= 1)
    AND (default_timeout IS NULL OR (default_timeout > 0 AND default_timeout < 'Infinity'))
    AND shigoto_backoff_valid(default_backoff));

-- 0011's rule, with `completed` among the states that may be forwarded. Only widened: every
-- stored value valid before is valid now.
CREATE OR REPLACE FUNCTION shigoto_forward_valid(queue text, forward jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT forward IS NULL OR (
        jsonb_typeof(forward) = 'object'
        AND forward <> '{}'::jsonb
        AND forward - 'discarded' - 'cancelled' - 'completed' = '{}'::jsonb
        AND NOT EXISTS (
            SELECT FROM jsonb_each(forward) AS f(state, target)
            WHERE jsonb_typeof(f.target) <> 'string'
               OR f.target #>> '{}' !~ '^[A-Za-z0-9][A-Za-z0-9._-]*$'
               OR char_length(f.target #>> '{}') > 128
               OR f.target #>> '{}' = queue
        )
    )
$$;

-- The note: once per transaction (its WHEN clause skips the call once the setting is there),
-- before the statement's rows change, so every row's WHEN below already reads it. Queue names
-- cannot hold '|' (0003's pattern), so '|name|' matches one name exactly.
CREATE OR REPLACE FUNCTION shigoto_note_completed_forwards() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM set_config('shigoto.completed_forwards',
                       coalesce((SELECT '|' || string_agg(name, '|') || '|' FROM shigoto_queues
                                 WHERE forward ? 'completed'), '|'),
                       true);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS shigoto_jobs_note_forwards ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_note_forwards
    BEFORE UPDATE OF state ON shigoto_jobs
    FOR EACH STATEMENT
    WHEN (coalesce(current_setting('shigoto.completed_forwards', true), '') = '')
    EXECUTE FUNCTION shigoto_note_completed_forwards();

-- 0024's dispatcher, with the forwarding step's condition widened to completed jobs of a
-- noted queue; the order of the steps is unchanged.
CREATE OR REPLACE FUNCTION shigoto_jobs_finalize() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.batch_id IS NOT NULL
       AND (NEW.state IN ('completed', 'discarded', 'cancelled')
            OR OLD.state IN ('completed', 'discarded', 'cancelled')) THEN
        PERFORM shigoto_batch_count(OLD, NEW);
    END IF;
    IF NEW.state IN ('discarded', 'cancelled')
       OR (NEW.state = 'completed'
           AND strpos(coalesce(current_setting('shigoto.completed_forwards', true), ''),
                      '|' || NEW.queue || '|') > 0) THEN
        PERFORM shigoto_forward_copy(OLD, NEW);
    END IF;
    IF NEW.has_dependents AND NEW.state IN ('completed', 'discarded', 'cancelled') THEN
        PERFORM shigoto_workflow_resolve(OLD, NEW);
    END IF;
    RETURN NULL;
END
$$;

-- 0024's WHEN clause plus the fourth disjunct: a completed job of a queue noted as forwarding
-- completed jobs. A plain completion still fails every disjunct without a call.
DROP TRIGGER IF EXISTS shigoto_jobs_finalize ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_finalize
    AFTER UPDATE OF state ON shigoto_jobs
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND ((NEW.batch_id IS NOT NULL
                AND (NEW.state IN ('completed', 'discarded', 'cancelled')
                     OR OLD.state IN ('completed', 'discarded', 'cancelled')))
               OR NEW.state IN ('discarded', 'cancelled')
               OR (NEW.has_dependents AND NEW.state IN ('completed', 'discarded', 'cancelled'))
               OR (NEW.state = 'completed'
                   AND strpos(coalesce(current_setting('shigoto.completed_forwards', true), ''),
                              '|' || NEW.queue || '|') > 0)))
    EXECUTE FUNCTION shigoto_jobs_finalize();
