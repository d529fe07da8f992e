-- Shigoto 0012: fan-out queues. Every runner serving a fan-out queue runs each of its jobs
-- once (cache invalidation, configuration reload); the job completes when every runner that
-- was live when it was inserted has run it, or is gone.

ALTER TABLE shigoto_queues ADD COLUMN IF NOT EXISTS fanout boolean NOT NULL DEFAULT false;

-- One row per (job, runner) that took the job: the per-runner completion record. The job row
-- itself stays 'available' until the last required runner is done, so the pruner, cancel_by
-- and status treat it like any other job; a runner's claim is the insert of its delivery row,
-- and the primary key is what makes it run at most once per runner.
CREATE TABLE IF NOT EXISTS shigoto_fanout_deliveries (
    job_id       bigint      NOT NULL,
    node_id      text        NOT NULL,
    state        text        NOT NULL DEFAULT 'executing',
    attempted_at timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    error        text,
    PRIMARY KEY (job_id, node_id),
    CONSTRAINT shigoto_fanout_deliveries_state_check
        CHECK (state IN ('executing', 'completed', 'failed'))
);

-- Finishing a fan-out job: the sweep looks for available jobs of fan-out queues.
CREATE INDEX IF NOT EXISTS shigoto_fanout_deliveries_job_idx
    ON shigoto_fanout_deliveries (job_id, state);

-- Whether every runner that was serving `job`'s queue when it was inserted, and is still
-- registered, has a finished delivery of it. Runners that stopped (their node row deleted at
-- shutdown) or died (forgotten by the rescuer) no longer count.
CREATE OR REPLACE FUNCTION shigoto_fanout_done(job shigoto_jobs) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM shigoto_nodes n
        WHERE n.queues ? job.queue AND n.started_at <= job.inserted_at
          AND NOT EXISTS (
              SELECT 1 FROM shigoto_fanout_deliveries d
              WHERE d.job_id = job.id AND d.node_id = n.id AND d.state <> 'executing'))
$$;

-- Finish the fan-out jobs among `ids` whose required runners are all done: completed when no
-- delivery failed, discarded otherwise; the result maps each runner to its outcome. The job
-- rows are locked first, so two runners finishing their deliveries at once cannot both see
-- the other's as still running and leave the job open (READ COMMITTED re-reads after the lock).
CREATE OR REPLACE FUNCTION shigoto_fanout_finish(ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    job shigoto_jobs;
    outcomes jsonb;
    failures jsonb;
BEGIN
    FOR job IN
        SELECT * FROM shigoto_jobs
        WHERE id = ANY(ids) AND state = 'available'
        ORDER BY id
        FOR UPDATE
    LOOP
        CONTINUE WHEN NOT shigoto_fanout_done(job);
        SELECT coalesce(jsonb_object_agg(d.node_id, d.state), '{}'::jsonb),
               coalesce(jsonb_agg(jsonb_build_object(
                   'attempt', 1, 'at', d.finished_at, 'error', d.node_id || ': ' || d.error,
                   'traceback', '')) FILTER (WHERE d.state = 'failed'), '[]'::jsonb)
          INTO outcomes, failures
          FROM shigoto_fanout_deliveries d
         WHERE d.job_id = job.id AND d.state <> 'executing';
        UPDATE shigoto_jobs
           SET state = CASE WHEN failures = '[]'::jsonb THEN 'completed' ELSE 'discarded' END,
               attempt = greatest(attempt, 1),
               finished_at = now(),
               completed_at = CASE WHEN failures = '[]'::jsonb THEN now() END,
               result = jsonb_build_object('deliveries', outcomes),
               errors = errors || failures
         WHERE id = job.id;
        -- the deliveries are the job's history now: they go with it
        DELETE FROM shigoto_fanout_deliveries WHERE job_id = job.id;
        RETURN NEXT job.id;
    END LOOP;
END
$$;
