-- Shigoto 0030: a parent's completion finds its waiting children through the children index
-- only (issue 26: workflows cost ten plain jobs' server CPU).
-- Runs with search_path set to the configured schema; re-runnable (CREATE OR REPLACE).
--
-- 0024's shigoto_workflow_resolve looks up the children of the parent that finished by
-- `depends_on @> ARRAY[parent]` (shigoto_jobs_waiting_children_idx, GIN) and by their waiting
-- mark, scheduled_at = 9999-12-31. Its plans are generic and cached per session; planned while
-- the table's statistics were unknown (a bulk load not yet analysed), they read the stage index
-- by that date instead, which every waiting child shares: each completion of a parent walked
-- all the waiting children of every workflow, 1 to 2 ms a parent on 20,000 jobs, growing with
-- the backlog. The date is now written `(...) IS TRUE`, which no index can serve, and the
-- function plans without sequential scans, so the GIN probe is the only way in: one probe per
-- parent, whatever the statistics say. The function's behaviour is unchanged.
-- @step
CREATE OR REPLACE FUNCTION shigoto_workflow_resolve(was shigoto_jobs, job shigoto_jobs)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off AS $$
DECLARE
    child record;
BEGIN
    PERFORM 1 FROM shigoto_jobs
    WHERE depends_on @> ARRAY[job.id] AND state = 'scheduled' AND depends_on IS NOT NULL
      AND (scheduled_at = '9999-12-31 00:00:00+00') IS TRUE
    ORDER BY id FOR NO KEY UPDATE;
    IF job.state <> 'completed' THEN
        FOR child IN
            UPDATE shigoto_jobs
            SET state = 'cancelled', finished_at = now(),
                errors = errors || shigoto_parent_failed_error(attempt, job.id, job.state)
            WHERE depends_on @> ARRAY[job.id] AND state = 'scheduled' AND depends_on IS NOT NULL
              AND (scheduled_at = '9999-12-31 00:00:00+00') IS TRUE
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
          AND c.depends_on IS NOT NULL AND (c.scheduled_at = '9999-12-31 00:00:00+00') IS TRUE
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
