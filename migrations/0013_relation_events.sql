-- Shigoto 0013: relation events. The transitions that triggers make (a waiting child released
-- or cancelled because of its parent, a batch's callback enqueued, a job forwarded) happen in
-- the database, where no telemetry subscriber lives. Each now sends a NOTIFY on
-- `shigoto_relations`, delivered only if the transaction commits (so a rolled-back transition
-- announces nothing), and the leading runner turns it into a telemetry event and a metric.
-- Plain jobs still call no function: the triggers' WHEN clauses are unchanged.
--
-- The functions below are 0009's, 0010's and 0011's with one addition each, the call to
-- shigoto_relation_event; their comments there still describe them.
-- Runs with search_path set to the configured schema; re-runnable (CREATE OR REPLACE).

-- Payload: "<schema>.<json>", the json carrying "event" and the fields of that event. Every
-- field is an id, a queue or worker name (both bounded by 0005) or a state, so a payload stays
-- far below NOTIFY's 8000 bytes.
CREATE OR REPLACE FUNCTION shigoto_relation_event(event text, detail jsonb) RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT pg_notify('shigoto_relations', current_schema() || '.'
                     || (jsonb_build_object('event', event) || detail)::text)
$$;

CREATE OR REPLACE FUNCTION shigoto_workflow_admit() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    live bigint[];
    failed_id bigint;
    failed_state text;
    known integer;
    waiting boolean := NEW.state = 'scheduled'
                       AND NEW.scheduled_at = '9999-12-31 00:00:00+00';
BEGIN
    SELECT array_agg(p.id) FILTER (WHERE p.state NOT IN ('completed', 'discarded', 'cancelled')),
           count(*)
    INTO live, known
    FROM (SELECT id, state FROM shigoto_jobs WHERE id = ANY(NEW.depends_on)
          ORDER BY id FOR NO KEY UPDATE) AS p;
    SELECT f.id, f.state INTO failed_id, failed_state
    FROM (SELECT id, state FROM shigoto_jobs WHERE id = ANY(NEW.depends_on)
          UNION ALL
          SELECT id, state FROM shigoto_jobs_archive WHERE id = ANY(NEW.depends_on)) AS f
    WHERE f.state IN ('discarded', 'cancelled')
    ORDER BY f.id LIMIT 1;
    IF known < cardinality(NEW.depends_on) THEN
        known := known + (SELECT count(*) FROM shigoto_jobs_archive
                          WHERE id = ANY(NEW.depends_on));
        IF known < (SELECT count(DISTINCT d) FROM unnest(NEW.depends_on) AS d) THEN
            RAISE EXCEPTION 'job depends on a job that does not exist: %', NEW.depends_on
                USING ERRCODE = 'foreign_key_violation',
                      HINT = 'enqueue the parents first (shigoto.workflow() does it for a graph)';
        END IF;
    END IF;
    IF failed_id IS NOT NULL AND coalesce(NEW.on_parent_failure, 'cancel') = 'cancel' THEN
        UPDATE shigoto_jobs
        SET state = 'cancelled', finished_at = now(),
            errors = errors || shigoto_parent_failed_error(attempt, failed_id, failed_state)
        WHERE id = NEW.id;
        PERFORM shigoto_relation_event('workflow.cancel', jsonb_build_object(
            'id', NEW.id, 'queue', NEW.queue, 'worker', NEW.worker,
            'parent', failed_id, 'parent_state', failed_state));
    ELSIF live IS NOT NULL THEN
        UPDATE shigoto_jobs SET has_dependents = true
        WHERE id = ANY(live) AND NOT has_dependents;
        IF NOT waiting THEN
            UPDATE shigoto_jobs SET state = 'scheduled', scheduled_at = '9999-12-31 00:00:00+00'
            WHERE id = NEW.id;
        END IF;
    ELSIF waiting THEN  -- marked waiting by a client whose parents have all finished since
        UPDATE shigoto_jobs SET state = 'available', scheduled_at = now() WHERE id = NEW.id;
        PERFORM pg_notify('shigoto_insert', current_schema() || '.' || NEW.queue);
        PERFORM shigoto_relation_event('workflow.release', jsonb_build_object(
            'id', NEW.id, 'queue', NEW.queue, 'worker', NEW.worker, 'parent', NULL));
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION shigoto_workflow_resolve() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    child record;
BEGIN
    PERFORM 1 FROM shigoto_jobs
    WHERE depends_on @> ARRAY[NEW.id] AND state = 'scheduled' AND depends_on IS NOT NULL
      AND scheduled_at = '9999-12-31 00:00:00+00'
    ORDER BY id FOR NO KEY UPDATE;
    IF NEW.state <> 'completed' THEN
        FOR child IN
            UPDATE shigoto_jobs
            SET state = 'cancelled', finished_at = now(),
                errors = errors || shigoto_parent_failed_error(attempt, NEW.id, NEW.state)
            WHERE depends_on @> ARRAY[NEW.id] AND state = 'scheduled' AND depends_on IS NOT NULL
              AND scheduled_at = '9999-12-31 00:00:00+00'
              AND coalesce(on_parent_failure, 'cancel') = 'cancel'
            RETURNING id, queue, worker
        LOOP
            PERFORM shigoto_relation_event('workflow.cancel', jsonb_build_object(
                'id', child.id, 'queue', child.queue, 'worker', child.worker,
                'parent', NEW.id, 'parent_state', NEW.state));
        END LOOP;
    END IF;
    FOR child IN
        UPDATE shigoto_jobs AS c SET state = 'available', scheduled_at = now()
        WHERE c.depends_on @> ARRAY[NEW.id] AND c.state = 'scheduled'
          AND c.depends_on IS NOT NULL AND c.scheduled_at = '9999-12-31 00:00:00+00'
          AND NOT coalesce((SELECT bool_or(p.state NOT IN ('completed', 'discarded',
                                                           'cancelled'))
                            FROM shigoto_jobs AS p WHERE p.id = ANY(c.depends_on)), false)
        RETURNING c.id, c.queue, c.worker
    LOOP
        -- Identical payloads within one transaction are delivered once: one wake per queue.
        PERFORM pg_notify('shigoto_insert', current_schema() || '.' || child.queue);
        PERFORM shigoto_relation_event('workflow.release', jsonb_build_object(
            'id', child.id, 'queue', child.queue, 'worker', child.worker, 'parent', NEW.id));
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION shigoto_batch_finish(b shigoto_batches) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    cb jsonb;
    counts jsonb;
    new_id bigint;
    ids bigint[] := '{}';
BEGIN
    IF b.sealed_at IS NULL OR b.finished_at IS NOT NULL
       OR b.completed + b.discarded + b.cancelled < b.total THEN
        RETURN false;
    END IF;
    UPDATE shigoto_batches SET finished_at = now() WHERE id = b.id AND finished_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    counts := jsonb_build_object('id', b.id, 'total', b.total, 'completed', b.completed,
                                 'discarded', b.discarded, 'cancelled', b.cancelled);
    FOR cb IN SELECT value FROM jsonb_array_elements(b.callbacks) LOOP
        CONTINUE WHEN cb->>'when' = 'completed' AND b.completed <> b.total;
        CONTINUE WHEN cb->>'when' = 'discarded' AND b.discarded = 0;
        INSERT INTO shigoto_jobs (queue, worker, args, state, priority, max_attempts, timeout,
                                  scheduled_at, tags, meta)
        VALUES (cb->>'queue', cb->>'worker',
                coalesce(cb->'args', '{}'::jsonb) || jsonb_build_object('batch', counts),
                'available', coalesce((cb->>'priority')::integer, 0),
                (cb->>'max_attempts')::integer, (cb->>'timeout')::double precision, now(),
                ARRAY(SELECT jsonb_array_elements_text(coalesce(cb->'tags', '[]'::jsonb))),
                jsonb_build_object('batch_callback',
                                   jsonb_build_object('batch_id', b.id, 'when', cb->>'when')))
        RETURNING id INTO new_id;
        ids := ids || new_id;
        PERFORM pg_notify('shigoto_insert', current_schema() || '.' || (cb->>'queue'));
        PERFORM shigoto_relation_event('batch.callback', jsonb_build_object(
            'id', new_id, 'queue', cb->>'queue', 'worker', cb->>'worker',
            'batch_id', b.id, 'when', cb->>'when', 'total', b.total,
            'completed', b.completed, 'discarded', b.discarded, 'cancelled', b.cancelled));
    END LOOP;
    UPDATE shigoto_batches SET callback_ids = ids WHERE id = b.id;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION shigoto_forward_job() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    target text;
    chain jsonb;
    new_id bigint;
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
        RETURN NULL;
    END IF;
    INSERT INTO shigoto_jobs (queue, worker, args, state, priority, attempt, max_attempts,
                              timeout, scheduled_at, tags, meta)
    VALUES (target, NEW.worker, NEW.args, 'available', NEW.priority, 0, NEW.max_attempts,
            NEW.timeout, now(), NEW.tags,
            (NEW.meta - 'on_discard_pending') || jsonb_build_object(
                'forwarded_from', jsonb_build_object(
                    'id', NEW.id, 'queue', NEW.queue, 'state', NEW.state,
                    'errors', NEW.errors, 'result', NEW.result),
                'forward_chain', chain))
    RETURNING id INTO new_id;
    PERFORM pg_notify('shigoto_insert', current_schema() || '.' || target);
    PERFORM shigoto_relation_event('job.forward', jsonb_build_object(
        'id', new_id, 'queue', target, 'worker', NEW.worker,
        'from_id', NEW.id, 'from_queue', NEW.queue, 'state', NEW.state));
    RETURN NULL;
END
$$;
