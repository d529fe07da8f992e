-- Shigoto 0009: workflows. A job with `depends_on` waits until every parent has finished; it
-- is decided on in the transaction that inserts it and in the transaction that finishes each
-- parent, by the triggers below, whichever code path makes that transition (the completer,
-- cancel_by, the rescuer, a cascade). A runner killed between two steps leaves nothing stuck,
-- because there is no second step.
--
-- A waiting child is a `scheduled` job whose scheduled_at is WAITING (far future rather than
-- 'infinity', which Python's datetime cannot load): the stager never stages it, and the
-- release sets scheduled_at to now() and the state to `available`.
-- Runs with search_path set to the configured schema; re-runnable (IF NOT EXISTS, CREATE OR
-- REPLACE, DROP TRIGGER IF EXISTS).

-- Set on a parent when a child starts waiting for it, so the trigger's WHEN clause keeps every
-- other job's final transition from calling the function at all.
ALTER TABLE shigoto_jobs ADD COLUMN IF NOT EXISTS has_dependents boolean NOT NULL DEFAULT false;
-- The archive keeps the jobs table's columns (plus archived_at); archived jobs never resolve
-- anything, so there it is only kept for the shape.
ALTER TABLE shigoto_jobs_archive ADD COLUMN IF NOT EXISTS has_dependents boolean NOT NULL
    DEFAULT false;

-- Finds the waiting children of a parent (depends_on @> ARRAY[parent]); only waiting rows are
-- indexed, so the index stays as small as the set of jobs waiting right now. fastupdate off:
-- children are looked up right after they are inserted, and a pending list (up to 4 MB until
-- the next vacuum) would be scanned by every lookup.
-- @step
CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_waiting_children_idx ON shigoto_jobs
    USING gin (depends_on) WITH (fastupdate = off)
    WHERE state = 'scheduled' AND depends_on IS NOT NULL;
-- @step

-- The error entry a child cancelled because of its parent carries (the CONTRACT's shape).
CREATE OR REPLACE FUNCTION shigoto_parent_failed_error(attempt integer, parent bigint,
                                                       parent_state text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_array(jsonb_build_object(
        'attempt', attempt, 'at', now(),
        'error', format('parent job %s was %s, and on_parent_failure is ''cancel''',
                        parent, parent_state),
        'traceback', NULL))
$$;

-- AFTER INSERT of a job with parents: lock the parents' rows (so none can finish unseen
-- between this decision and the commit: its own transition waits for ours and its trigger then
-- sees this child), then decide: cancelled at once if a parent failed and the policy is
-- 'cancel'; waiting if a parent is still live (and that parent flagged); else runnable.
-- Parents already pruned to the archive are finished by definition. AFTER, not BEFORE: a
-- BEFORE row trigger, whatever its WHEN clause, makes PostgreSQL's COPY insert every row one
-- by one, plain jobs included. The client's insert hook usually writes the child as waiting
-- already (sync connections), so the common case updates nothing but the parents' flag.
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
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS shigoto_jobs_workflow_admit ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_workflow_admit
    AFTER INSERT ON shigoto_jobs
    FOR EACH ROW WHEN (NEW.depends_on IS NOT NULL)
    EXECUTE FUNCTION shigoto_workflow_admit();

-- AFTER a parent's final transition: its waiting children are locked (in id order), then, as
-- two set-based statements, cancelled (a failed parent and policy 'cancel'; each one's own
-- trigger cascades to its children) or, when none of their parents is live any more, released
-- and their queues woken. The release is a statement after the lock, so its snapshot is fresh:
-- of two parents finishing at once in two transactions, the second to lock sees the first.
CREATE OR REPLACE FUNCTION shigoto_workflow_resolve() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    woken text;
BEGIN
    PERFORM 1 FROM shigoto_jobs
    WHERE depends_on @> ARRAY[NEW.id] AND state = 'scheduled' AND depends_on IS NOT NULL
      AND scheduled_at = '9999-12-31 00:00:00+00'
    ORDER BY id FOR NO KEY UPDATE;
    IF NEW.state <> 'completed' THEN
        UPDATE shigoto_jobs
        SET state = 'cancelled', finished_at = now(),
            errors = errors || shigoto_parent_failed_error(attempt, NEW.id, NEW.state)
        WHERE depends_on @> ARRAY[NEW.id] AND state = 'scheduled' AND depends_on IS NOT NULL
          AND scheduled_at = '9999-12-31 00:00:00+00'
          AND coalesce(on_parent_failure, 'cancel') = 'cancel';
    END IF;
    FOR woken IN
        WITH released AS (
            UPDATE shigoto_jobs AS c SET state = 'available', scheduled_at = now()
            WHERE c.depends_on @> ARRAY[NEW.id] AND c.state = 'scheduled'
              AND c.depends_on IS NOT NULL AND c.scheduled_at = '9999-12-31 00:00:00+00'
              -- A scalar subquery, run per child by primary key: as NOT EXISTS the planner
              -- may turn it into an anti-join that reads the whole table.
              AND NOT coalesce((SELECT bool_or(p.state NOT IN ('completed', 'discarded',
                                                               'cancelled'))
                                FROM shigoto_jobs AS p WHERE p.id = ANY(c.depends_on)), false)
            RETURNING c.queue
        )
        SELECT DISTINCT queue FROM released
    LOOP
        PERFORM pg_notify('shigoto_insert', current_schema() || '.' || woken);
    END LOOP;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS shigoto_jobs_workflow_resolve ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_workflow_resolve
    AFTER UPDATE OF state ON shigoto_jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IN ('completed', 'discarded', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION shigoto_workflow_resolve();
