-- Shigoto 0011: dead-letter forwarding. A queue may name, per final failure state (discarded,
-- cancelled), a queue that receives a copy of every job entering that state. The copy is
-- inserted by a trigger in the transaction that changes the state, whichever code path makes
-- the change (the completer, cancel_by, the rescuer, a workflow cascade): a runner killed at
-- any point leaves both rows or neither.
-- Written to be re-runnable: IF NOT EXISTS, CREATE OR REPLACE, constraints and the trigger
-- dropped (if present) before they are added.

-- {"discarded": "<queue>", "cancelled": "<queue>"}; a state left out is not forwarded. NULL
-- (never '{}') when nothing is forwarded, so the runners' reads stay at their defaults.
ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS forward jsonb;

-- The same rule the client enforces (shigoto.relations.forwarding), so a row written by hand or
-- by an older client cannot name an unknown state, a bad queue name, or the queue itself. A
-- function because a CHECK may not hold a subquery; immutable, it reads nothing but its input.
CREATE OR REPLACE FUNCTION shigoto_forward_valid(queue text, forward jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT forward IS NULL OR (
        jsonb_typeof(forward) = 'object'
        AND forward <> '{}'::jsonb
        AND forward - 'discarded' - 'cancelled' = '{}'::jsonb
        AND NOT EXISTS (
            SELECT FROM jsonb_each(forward) AS f(state, target)
            WHERE jsonb_typeof(f.target) <> 'string'
               OR f.target #>> '{}' !~ '^[A-Za-z0-9][A-Za-z0-9._-]*$'
               OR char_length(f.target #>> '{}') > 128
               OR f.target #>> '{}' = queue
        )
    )
$$;

ALTER TABLE shigoto_queues DROP CONSTRAINT IF EXISTS shigoto_queues_forward_check;
ALTER TABLE shigoto_queues ADD CONSTRAINT shigoto_queues_forward_check
    CHECK (shigoto_forward_valid(name, forward));

-- Inserts the forwarded copy of NEW: same worker, args, priority, tags, timeout and
-- max_attempts; attempt 0, available now in the target queue; meta["forwarded_from"] carries
-- the original's id, queue, state, errors and result. Relations (unique key, dependencies,
-- batch) stay with the original: the copy is a fresh job, not a second member of them.
--
-- Cycles: meta["forward_chain"] lists every queue the job has been forwarded out of. A job is
-- never forwarded into a queue on its chain (nor into its own queue), so payments ->
-- payments-dead -> archive works while payments -> retry -> payments stops after one round:
-- the copy in `retry` is not forwarded back to `payments` and simply stays in its final state.
--
-- SET search_path FROM CURRENT pins the schema the migration ran in, so the unqualified names
-- below and current_schema() in the NOTIFY (runners parse "<schema>.<queue>") name this
-- schema's tables whatever search_path the session that changed the state has.
CREATE OR REPLACE FUNCTION shigoto_forward_job() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    target text;
    chain jsonb;
BEGIN
    SELECT q.forward ->> NEW.state INTO target FROM shigoto_queues AS q WHERE q.name = NEW.queue;
    IF target IS NULL THEN
        RETURN NULL;
    END IF;
    chain := coalesce(NEW.meta -> 'forward_chain', '[]'::jsonb);
    IF jsonb_typeof(chain) <> 'array' THEN
        chain := '[]'::jsonb;
    END IF;
    IF NOT chain ? NEW.queue THEN
        chain := chain || to_jsonb(NEW.queue);
    END IF;
    IF chain ? target THEN
        RETURN NULL;  -- a cycle: this job already left `target` once
    END IF;
    INSERT INTO shigoto_jobs (queue, worker, args, state, priority, attempt, max_attempts,
                              timeout, scheduled_at, tags, meta)
    VALUES (target, NEW.worker, NEW.args, 'available', NEW.priority, 0, NEW.max_attempts,
            NEW.timeout, now(), NEW.tags,
            (NEW.meta - 'on_discard_pending') || jsonb_build_object(
                'forwarded_from', jsonb_build_object(
                    'id', NEW.id, 'queue', NEW.queue, 'state', NEW.state,
                    'errors', NEW.errors, 'result', NEW.result),
                'forward_chain', chain));
    PERFORM pg_notify('shigoto_insert', current_schema() || '.' || target);
    RETURN NULL;
END
$$;

-- The WHEN clause keeps completed jobs (the common case) from calling the function at all.
DROP TRIGGER IF EXISTS shigoto_jobs_forward ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_forward
    AFTER UPDATE OF state ON shigoto_jobs
    FOR EACH ROW
    WHEN (NEW.state IN ('discarded', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION shigoto_forward_job();
