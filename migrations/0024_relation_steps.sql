-- Shigoto 0024: the relation steps, in one stated order.
--
-- Until now each relation put its own row triggers on `shigoto_jobs` (0009 workflows, 0010
-- batches, 0011 forwarding; 0013 added their events), and PostgreSQL fires triggers of one
-- event in the order of their names: the order in which a batch was counted, a job forwarded
-- and its children resolved was an accident of naming. Here each relation's work becomes a
-- plain function, a step, and one trigger per event runs the steps in the order written below.
-- shigoto.relations.steps has the same table for readers of the Python side.
--
--   event                        | trigger               | steps, in this order
--   -----------------------------+-----------------------+----------------------------------
--   INSERT, per row              | shigoto_jobs_admit    | 1. shigoto_batch_join (batches)
--                                |                       | 2. shigoto_workflow_admit (workflows)
--   UPDATE OF state, per row,    | shigoto_jobs_finalize | 1. shigoto_batch_count (batches)
--   into or out of a final state |                       | 2. shigoto_forward_copy (forwarding)
--                                |                       | 3. shigoto_workflow_resolve (workflows)
--
-- Unique jobs have no step: the client's shigoto_unique_resolve (0008) decides on a key before
-- the INSERT, and a final transition leaves the key on its row for the next enqueue to judge.
-- Left as they were, each the only step of its event: the statement-level check of encrypted
-- queues after an INSERT (0018, which must see the whole statement's rows and runs after the
-- row steps), and the two DELETE triggers of batches (0010: a job deleted unfinished leaves its
-- batch; a batch row goes with its last archived job).
--
-- Why this order at a final transition. Counting and forwarding act on the job itself; resolving
-- moves other jobs (its waiting children) into new states, and each child's own finalize runs,
-- nested, inside that step. Resolving last means a job's own steps are done before any of its
-- descendants' start: a cascade runs depth first, parent before children, so callbacks and
-- forwarded copies get their ids, and send their events, in the order of the transitions that
-- caused them. (The one event out of that order is a cascade's workflow.cancel: it is sent for
-- each row the cancelling UPDATE returns, after that UPDATE has run the children's own steps.)
-- Counting and forwarding do not read what the other writes (a forwarded copy joins no batch
-- and waits for no parent; a callback is a fresh job too), so between the two only ids and the
-- order of events depend on it; batches come first because that is the order every schema up
-- to 0023 ran them in (by name), so nothing a user sees changes.
-- Locks: no order of the steps makes every cascade take its row locks in one global order (a
-- parent's batch row, then its children's rows, then, for a cancelled child in another batch,
-- that batch's row), so two cascades that cross can deadlock, as they could under 0023's
-- triggers. PostgreSQL aborts one of them; the completer retries its statement (a deadlock is
-- an OperationalError to psycopg, which it treats as transient) and its guard keeps the retry
-- idempotent.
--
-- Why this order at insert. Joining only checks that the batch is open and holds it open (a
-- share lock on its row) until commit; it may refuse the row. Admitting may cancel the new job
-- at once (a parent already failed), and that UPDATE finalizes it, counting it in its batch:
-- the job is known to be a member, of a batch that cannot be sealed under it, before anything
-- counts it, and a refused job never locks its parents.
--
-- Cost. Each trigger's WHEN clause is the union of its steps' conditions, so a job none of the
-- steps concern (no batch, no waiting children, not discarded or cancelled; no batch and no
-- parents at insert) is decided by one WHEN check and calls no function, as before. The
-- dispatcher then tests each step's own condition, so a step is called only when its old
-- trigger would have been (the batch join less often, see shigoto_jobs_admit). A transition
-- that does run a step pays the dispatcher's call on top, measured at 2-5 microseconds
-- (docs/benchmarks.md, "Relation steps in one order"); a plain completion pays nothing.
--
-- Live tables: everything below is one transaction (migrate applies pending migrations in one),
-- so no transaction ever sees shigoto_jobs with both sets of triggers or with neither. The
-- functions are created first, needing no lock on the table; the first DROP TRIGGER then takes
-- shigoto_jobs' ACCESS EXCLUSIVE lock (under migrate's lock_timeout, retried) and the rest are
-- catalogue changes, held for milliseconds.
-- Runs with search_path set to the configured schema; re-runnable (CREATE OR REPLACE,
-- DROP ... IF EXISTS).

-- Steps at insert ------------------------------------------------------------------------------

-- Batches: `job` joins its batch, which must exist and be unsealed. FOR KEY SHARE holds off
-- the seal (FOR UPDATE) until this transaction ends, yet lets the counting UPDATEs of other
-- jobs pass. Once held, the lock cannot go stale before the transaction ends, so the check is
-- remembered in a transaction-local setting and the next jobs of the same batch (a COPY of
-- thousands) skip the query; the seal forgets it, for a caller that seals in the same
-- transaction. Nothing is written here: the total is counted once, by the seal. (0010's
-- shigoto_batch_joins, as a step.)
CREATE OR REPLACE FUNCTION shigoto_batch_join(job shigoto_jobs) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    mine text := current_schema() || '.' || job.batch_id;
BEGIN
    IF current_setting('shigoto.joined_batch', true) = mine THEN
        RETURN;
    END IF;
    PERFORM 1 FROM shigoto_batches WHERE id = job.batch_id AND sealed_at IS NULL
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % cannot join batch %: it is sealed or does not exist',
                        job.id, job.batch_id
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'enqueue into a batch only inside its with block';
    END IF;
    PERFORM set_config('shigoto.joined_batch', mine, true);
END
$$;

-- Workflows: `job` has parents. Lock the parents' rows (so none can finish unseen between this
-- decision and the commit: its own finalize waits for ours and then sees this child), then
-- decide: cancelled at once if a parent failed and the policy is 'cancel'; waiting if a parent
-- is still live (and that parent flagged has_dependents); else runnable. Parents already pruned
-- to the archive are finished by definition. The client's insert hook usually writes the child
-- as waiting already (sync connections), so the common case updates nothing but the parents'
-- flag. (0009's shigoto_workflow_admit with 0013's events, as a step.)
CREATE OR REPLACE FUNCTION shigoto_workflow_admit(job shigoto_jobs) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    live bigint[];
    failed_id bigint;
    failed_state text;
    known integer;
    waiting boolean := job.state = 'scheduled'
                       AND job.scheduled_at = '9999-12-31 00:00:00+00';
BEGIN
    SELECT array_agg(p.id) FILTER (WHERE p.state NOT IN ('completed', 'discarded', 'cancelled')),
           count(*)
    INTO live, known
    FROM (SELECT id, state FROM shigoto_jobs WHERE id = ANY(job.depends_on)
          ORDER BY id FOR NO KEY UPDATE) AS p;
    SELECT f.id, f.state INTO failed_id, failed_state
    FROM (SELECT id, state FROM shigoto_jobs WHERE id = ANY(job.depends_on)
          UNION ALL
          SELECT id, state FROM shigoto_jobs_archive WHERE id = ANY(job.depends_on)) AS f
    WHERE f.state IN ('discarded', 'cancelled')
    ORDER BY f.id LIMIT 1;
    IF known < cardinality(job.depends_on) THEN
        known := known + (SELECT count(*) FROM shigoto_jobs_archive
                          WHERE id = ANY(job.depends_on));
        IF known < (SELECT count(DISTINCT d) FROM unnest(job.depends_on) AS d) THEN
            RAISE EXCEPTION 'job depends on a job that does not exist: %', job.depends_on
                USING ERRCODE = 'foreign_key_violation',
                      HINT = 'enqueue the parents first (shigoto.workflow() does it for a graph)';
        END IF;
    END IF;
    IF failed_id IS NOT NULL AND coalesce(job.on_parent_failure, 'cancel') = 'cancel' THEN
        UPDATE shigoto_jobs
        SET state = 'cancelled', finished_at = now(),
            errors = errors || shigoto_parent_failed_error(attempt, failed_id, failed_state)
        WHERE id = job.id;
        PERFORM shigoto_relation_event('workflow.cancel', jsonb_build_object(
            'id', job.id, 'queue', job.queue, 'worker', job.worker,
            'parent', failed_id, 'parent_state', failed_state));
    ELSIF live IS NOT NULL THEN
        UPDATE shigoto_jobs SET has_dependents = true
        WHERE id = ANY(live) AND NOT has_dependents;
        IF NOT waiting THEN
            UPDATE shigoto_jobs SET state = 'scheduled', scheduled_at = '9999-12-31 00:00:00+00'
            WHERE id = job.id;
        END IF;
    ELSIF waiting THEN  -- marked waiting by a client whose parents have all finished since
        UPDATE shigoto_jobs SET state = 'available', scheduled_at = now() WHERE id = job.id;
        PERFORM pg_notify('shigoto_insert', current_schema() || '.' || job.queue);
        PERFORM shigoto_relation_event('workflow.release', jsonb_build_object(
            'id', job.id, 'queue', job.queue, 'worker', job.worker, 'parent', NULL));
    END IF;
END
$$;

-- Steps at a final transition (`was` is the row before it, `job` the row after) ---------------

-- Batches: a job of a batch enters or leaves a final state (completed, discarded, cancelled;
-- leaving is a retry): its counts move in this same transaction, and the batch may finish,
-- enqueueing its callbacks (shigoto_batch_finish, 0010 and 0013). (0010's
-- shigoto_batch_counted, as a step.)
CREATE OR REPLACE FUNCTION shigoto_batch_count(was shigoto_jobs, job shigoto_jobs)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    b shigoto_batches;
BEGIN
    UPDATE shigoto_batches
    SET completed = completed + (job.state = 'completed')::integer
                              - (was.state = 'completed')::integer,
        discarded = discarded + (job.state = 'discarded')::integer
                              - (was.state = 'discarded')::integer,
        cancelled = cancelled + (job.state = 'cancelled')::integer
                              - (was.state = 'cancelled')::integer
    WHERE id = job.batch_id
    RETURNING * INTO b;
    IF FOUND THEN
        PERFORM shigoto_batch_finish(b);
    END IF;
END
$$;

-- Forwarding: a job entered discarded or cancelled. If its queue forwards that state, insert
-- the copy (same worker, args, priority, tags, timeout, max_attempts; attempt 0, available now
-- in the target queue; meta["forwarded_from"] says where from). Never into a queue on the
-- job's meta["forward_chain"] (nor its own), so a cycle stops after one round. Relations stay
-- with the original: the copy has no batch, parents or unique key. (0011's shigoto_forward_job
-- with 0013's event, as a step.)
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

-- Workflows: a parent finished. Its waiting children are locked (in id order), then, as two
-- set-based statements, cancelled (a failed parent and policy 'cancel'; each child's own
-- finalize runs at the end of that UPDATE and cascades to its children) or, when none of their
-- parents is live any more, released and their queues woken. The release is a statement after
-- the lock, so its snapshot is fresh: of two parents finishing at once in two transactions, the
-- second to lock sees the first. (0009's shigoto_workflow_resolve with 0013's events, as a
-- step.)
CREATE OR REPLACE FUNCTION shigoto_workflow_resolve(was shigoto_jobs, job shigoto_jobs)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    child record;
BEGIN
    PERFORM 1 FROM shigoto_jobs
    WHERE depends_on @> ARRAY[job.id] AND state = 'scheduled' AND depends_on IS NOT NULL
      AND scheduled_at = '9999-12-31 00:00:00+00'
    ORDER BY id FOR NO KEY UPDATE;
    IF job.state <> 'completed' THEN
        FOR child IN
            UPDATE shigoto_jobs
            SET state = 'cancelled', finished_at = now(),
                errors = errors || shigoto_parent_failed_error(attempt, job.id, job.state)
            WHERE depends_on @> ARRAY[job.id] AND state = 'scheduled' AND depends_on IS NOT NULL
              AND scheduled_at = '9999-12-31 00:00:00+00'
              AND coalesce(on_parent_failure, 'cancel') = 'cancel'
            RETURNING id, queue, worker
        LOOP
            PERFORM shigoto_relation_event('workflow.cancel', jsonb_build_object(
                'id', child.id, 'queue', child.queue, 'worker', child.worker,
                'parent', job.id, 'parent_state', job.state));
        END LOOP;
    END IF;
    FOR child IN
        UPDATE shigoto_jobs AS c SET state = 'available', scheduled_at = now()
        WHERE c.depends_on @> ARRAY[job.id] AND c.state = 'scheduled'
          AND c.depends_on IS NOT NULL AND c.scheduled_at = '9999-12-31 00:00:00+00'
          -- A scalar subquery, run per child by primary key: as NOT EXISTS the planner may
          -- turn it into an anti-join that reads the whole table.
          AND NOT coalesce((SELECT bool_or(p.state NOT IN ('completed', 'discarded',
                                                           'cancelled'))
                            FROM shigoto_jobs AS p WHERE p.id = ANY(c.depends_on)), false)
        RETURNING c.id, c.queue, c.worker
    LOOP
        -- Identical payloads within one transaction are delivered once: one wake per queue.
        PERFORM pg_notify('shigoto_insert', current_schema() || '.' || child.queue);
        PERFORM shigoto_relation_event('workflow.release', jsonb_build_object(
            'id', child.id, 'queue', child.queue, 'worker', child.worker, 'parent', job.id));
    END LOOP;
END
$$;

-- The two dispatchers ---------------------------------------------------------------------------
-- Each tests its steps' conditions again (its trigger's WHEN is their union) and calls them in
-- the order of the table above. A new step goes here, in its place, with its condition, and in
-- the WHEN clause of its trigger.

-- The join's condition includes its memo: once a transaction has joined a batch, its further
-- jobs (the rest of a COPY of thousands) skip the call itself, which would only find the memo
-- and return; a call per row cost a batch job's insert 2 microseconds more than 0023's trigger.
CREATE OR REPLACE FUNCTION shigoto_jobs_admit() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.batch_id IS NOT NULL
       AND current_setting('shigoto.joined_batch', true)
           IS DISTINCT FROM current_schema() || '.' || NEW.batch_id THEN
        PERFORM shigoto_batch_join(NEW);
    END IF;
    IF NEW.depends_on IS NOT NULL THEN
        PERFORM shigoto_workflow_admit(NEW);
    END IF;
    RETURN NULL;
END
$$;

-- Called only when the state changed (the trigger's WHEN).
CREATE OR REPLACE FUNCTION shigoto_jobs_finalize() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.batch_id IS NOT NULL
       AND (NEW.state IN ('completed', 'discarded', 'cancelled')
            OR OLD.state IN ('completed', 'discarded', 'cancelled')) THEN
        PERFORM shigoto_batch_count(OLD, NEW);
    END IF;
    IF NEW.state IN ('discarded', 'cancelled') THEN
        PERFORM shigoto_forward_copy(OLD, NEW);
    END IF;
    IF NEW.has_dependents AND NEW.state IN ('completed', 'discarded', 'cancelled') THEN
        PERFORM shigoto_workflow_resolve(OLD, NEW);
    END IF;
    RETURN NULL;
END
$$;

-- The triggers ----------------------------------------------------------------------------------
-- The old ones go first: the first DROP takes the table's lock for the rest of the transaction.
DROP TRIGGER IF EXISTS shigoto_batch_joins ON shigoto_jobs;
DROP TRIGGER IF EXISTS shigoto_jobs_workflow_admit ON shigoto_jobs;
DROP TRIGGER IF EXISTS shigoto_batch_counted ON shigoto_jobs;
DROP TRIGGER IF EXISTS shigoto_jobs_forward ON shigoto_jobs;
DROP TRIGGER IF EXISTS shigoto_jobs_workflow_resolve ON shigoto_jobs;

-- AFTER, not BEFORE: a BEFORE row trigger, whatever its WHEN clause, makes COPY insert every
-- row one by one, plain jobs included; an AFTER trigger's WHEN is checked as each row is
-- written and queues nothing for plain jobs.
DROP TRIGGER IF EXISTS shigoto_jobs_admit ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_admit
    AFTER INSERT ON shigoto_jobs
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL OR NEW.depends_on IS NOT NULL)
    EXECUTE FUNCTION shigoto_jobs_admit();

-- The three disjuncts are the conditions of the three steps, in their order. A completed job
-- with no batch and no waiting children (nearly every job) fails all three without a call.
DROP TRIGGER IF EXISTS shigoto_jobs_finalize ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_finalize
    AFTER UPDATE OF state ON shigoto_jobs
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND ((NEW.batch_id IS NOT NULL
                AND (NEW.state IN ('completed', 'discarded', 'cancelled')
                     OR OLD.state IN ('completed', 'discarded', 'cancelled')))
               OR NEW.state IN ('discarded', 'cancelled')
               OR (NEW.has_dependents AND NEW.state IN ('completed', 'discarded', 'cancelled'))))
    EXECUTE FUNCTION shigoto_jobs_finalize();

-- The old trigger functions, now steps under other names; nothing else calls them.
DROP FUNCTION IF EXISTS shigoto_batch_joins();
DROP FUNCTION IF EXISTS shigoto_workflow_admit();
DROP FUNCTION IF EXISTS shigoto_batch_counted();
DROP FUNCTION IF EXISTS shigoto_forward_job();
DROP FUNCTION IF EXISTS shigoto_workflow_resolve();
