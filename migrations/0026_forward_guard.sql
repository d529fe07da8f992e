-- Shigoto 0026: sealed args stay with the job they were sealed for (issue 24, point 3;
-- docs/database-roles.md).
--
-- A sealed value's associated data binds it to its job (schema, queue, worker, id), so a
-- ciphertext copied into another row does not open. The one exception is a forwarded copy
-- (0011): its args are the original's, copied by the database, which holds no key to re-seal
-- them; the opener (shigoto.encryption.forwarding) therefore accepts, in a row whose meta says
-- it is a copy (`forwarded_from`, with the original's queue on `forward_chain`), a value sealed
-- for an earlier job of the same worker and schema. Until now two doors let a role that may
-- only INSERT jobs (and read them, as get_job does) use that exception to replay another job's
-- sealed args into a new job of the same worker:
--
--   1. insert a row that merely claims to be a copy (meta with `forwarded_from` and
--      `forward_chain`) whose args are another job's envelope;
--   2. insert an ordinary job in the original's queue whose args are another job's envelope:
--      it never opens, is discarded, and the real forward then made a genuine-looking copy of it.
--
-- Door 1: only the database and roles that may already rewrite any job's args and meta
-- (UPDATE on both columns: the runner, the migrator) may insert rows that carry forwarding
-- meta. Such a role can replay args without forwarding anyway (set a finished job back to
-- `available`), so this refuses exactly the roles for which forwarding was the only way. The
-- check is on the role, not on pg_trigger_depth(): a role may fire its own triggers (on a
-- temporary table) to look nested. A forwarded copy is inserted by the trigger of the UPDATE
-- that finalized its original, under the role that ran that UPDATE, which has the privilege.
--
-- Door 2: the forward step copies the args of an original (a job that is not itself a copy)
-- only when they are plaintext or sealed for that very job (`for` is its own queue and id).
-- Args sealed for another job could never have run here; the job stays discarded or cancelled,
-- uncopied, with a WARNING in the server log. A copy's own args were checked when it was made
-- (or it was made before this migration), and nobody without UPDATE can change them since.
--
-- Runs with search_path set to the configured schema; re-runnable (CREATE OR REPLACE, the
-- trigger dropped if present before it is created). One transactional step: the new trigger
-- takes shigoto_jobs' lock for an instant, under migrate's lock_timeout, retried.

-- Door 1. One call per INSERT statement (a transition table holds its rows), like 0018's
-- check: a role with the privilege (every runner's COPY, every forward) returns after one
-- catalogue lookup, before the rows are read.
CREATE OR REPLACE FUNCTION shigoto_jobs_refuse_forwarding_meta() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF has_column_privilege('shigoto_jobs', 'args', 'UPDATE')
       AND has_column_privilege('shigoto_jobs', 'meta', 'UPDATE') THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM shigoto_inserted_rows AS n
               WHERE n.meta ? 'forwarded_from' OR n.meta ? 'forward_chain') THEN
        RAISE EXCEPTION 'role % may not insert a forwarded copy (meta forwarded_from or '
                        'forward_chain): only forwarding makes those', current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'enqueue without those meta keys (docs/database-roles.md)';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS shigoto_jobs_forwarding_meta ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_forwarding_meta
    AFTER INSERT ON shigoto_jobs
    REFERENCING NEW TABLE AS shigoto_inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION shigoto_jobs_refuse_forwarding_meta();

-- Door 2: 0024's forward step, with the check on the original's args first; the rest as it was.
CREATE OR REPLACE FUNCTION shigoto_forward_copy(was shigoto_jobs, job shigoto_jobs)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    target text;
    chain jsonb;
    new_id bigint;
BEGIN
    SELECT q.forward ->> job.state INTO target FROM shigoto_queues AS q WHERE q.name = job.queue;
    IF target IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(job.args) = 'object' AND job.args ? '$shigoto_enc'
       AND NOT coalesce(jsonb_typeof(job.meta -> 'forwarded_from') = 'object', false)
       AND ((job.args #>> '{for,queue}') IS DISTINCT FROM job.queue
            OR (job.args #>> '{for,id}') IS DISTINCT FROM job.id::text) THEN
        RAISE WARNING 'job % (queue %) not forwarded: its args are sealed for another job',
                      job.id, job.queue;
        RETURN;
    END IF;
    chain := coalesce(job.meta -> 'forward_chain', '[]'::jsonb);
    IF jsonb_typeof(chain) <> 'array' THEN
        chain := '[]'::jsonb;
    END IF;
    IF NOT chain ? job.queue THEN
        chain := chain || to_jsonb(job.queue);
    END IF;
    IF chain ? target THEN
        RETURN;  -- a cycle: this job already left `target` once
    END IF;
    INSERT INTO shigoto_jobs (queue, worker, args, state, priority, attempt, max_attempts,
                              timeout, scheduled_at, tags, meta)
    VALUES (target, job.worker, job.args, 'available', job.priority, 0, job.max_attempts,
            job.timeout, now(), job.tags,
            (job.meta - 'on_discard_pending') || jsonb_build_object(
                'forwarded_from', jsonb_build_object(
                    'id', job.id, 'queue', job.queue, 'state', job.state,
                    'errors', job.errors, 'result', job.result),
                'forward_chain', chain))
    RETURNING id INTO new_id;
    PERFORM pg_notify('shigoto_insert', current_schema() || '.' || target);
    PERFORM shigoto_relation_event('job.forward', jsonb_build_object(
        'id', new_id, 'queue', target, 'worker', job.worker,
        'from_id', job.id, 'from_queue', job.queue, 'state', job.state));
END
$$;
