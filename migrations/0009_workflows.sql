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

-- Finds the waiting children of a parent (depends_on @> ARRAY[parent]); only waiting rows are
-- indexed, so the index stays as small as the set of jobs waiting right now.
CREATE INDEX IF NOT EXISTS shigoto_jobs_waiting_children_idx ON shigoto_jobs
    USING gin (depends_on) WHERE state = 'scheduled' AND depends_on IS NOT NULL;

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

-- BEFORE INSERT of a job with parents: lock the parents' rows (so none can finish unseen
-- between this decision and the commit: its own transition waits for ours and its trigger then
-- sees this child), then decide: cancelled at once if a parent failed and the policy is
-- 'cancel'; waiting if a parent is still live (and that parent flagged); else as inserted.
-- Parents already pruned to the archive are finished by definition.
CREATE OR REPLACE FUNCTION shigoto_workflow_admit() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    live bigint[];
    failed_id bigint;
    failed_state text;
    known integer;
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
    known := known + (SELECT count(*) FROM shigoto_jobs_archive
                      WHERE id = ANY(NEW.depends_on));
    IF known < (SELECT count(DISTINCT d) FROM unnest(NEW.depends_on) AS d) THEN
        RAISE EXCEPTION 'job depends on a job that does not exist: %', NEW.depends_on
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF failed_id IS NOT NULL AND coalesce(NEW.on_parent_failure, 'cancel') = 'cancel' THEN
        NEW.state := 'cancelled';
        NEW.finished_at := now();
        NEW.errors := NEW.errors || shigoto_parent_failed_error(NEW.attempt, failed_id,
                                                                failed_state);
    ELSIF live IS NOT NULL THEN
        UPDATE shigoto_jobs SET has_dependents = true
        WHERE id = ANY(live) AND NOT has_dependents;
        NEW.state := 'scheduled';
        NEW.scheduled_at := '9999-12-31 00:00:00+00';
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS shigoto_jobs_workflow_admit ON shigoto_jobs;
CREATE TRIGGER shigoto_jobs_workflow_admit
    BEFORE INSERT ON shigoto_jobs
    FOR EACH ROW WHEN (NEW.depends_on IS NOT NULL)
    EXECUTE FUNCTION shigoto_workflow_admit();

-- AFTER a parent's final transition: each waiting child is locked (in id order), then either
-- cancelled (a failed parent, policy 'cancel'; its own trigger cascades to its children) or,
-- once none of its parents is live any more, released and its queue woken. The check of the
-- other parents is a statement after the child's lock, so it reads a fresh snapshot: of two
-- parents finishing at once in two transactions, the second to take the lock sees the first.
CREATE OR REPLACE FUNCTION shigoto_workflow_resolve() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    child record;
BEGIN
    FOR child IN
        SELECT id, queue, attempt, depends_on, on_parent_failure FROM shigoto_jobs
        WHERE depends_on @> ARRAY[NEW.id] AND state = 'scheduled' AND depends_on IS NOT NULL
          AND scheduled_at = '9999-12-31 00:00:00+00'
        ORDER BY id FOR NO KEY UPDATE
    LOOP
        IF NEW.state <> 'completed' AND coalesce(child.on_parent_failure, 'cancel') = 'cancel'
        THEN
            UPDATE shigoto_jobs
            SET state = 'cancelled', finished_at = now(),
                errors = errors || shigoto_parent_failed_error(child.attempt, NEW.id, NEW.state)
            WHERE id = child.id;
        ELSIF NOT EXISTS (SELECT 1 FROM shigoto_jobs WHERE id = ANY(child.depends_on)
                          AND state NOT IN ('completed', 'discarded', 'cancelled')) THEN
            UPDATE shigoto_jobs SET state = 'available', scheduled_at = now()
            WHERE id = child.id;
            PERFORM pg_notify('shigoto_insert', current_schema() || '.' || child.queue);
        END IF;
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
